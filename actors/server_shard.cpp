#include "actors/server_shard.hpp"
#include "libps/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>

#include "libps/checkpoint.hpp"
#include "libps/codec.hpp"
#include "libps/handoff.hpp"
#include "libps/row_disk.hpp"
#include "libps/text.hpp"

#include <nlohmann/json.hpp>

namespace ps {

shard_state::~shard_state() {
  if (trace_fd >= 0) ::close(trace_fd);
}

void shard_state::trace(const trace_event& e) const {
  if (trace_fd < 0) return;
  auto tagged = e;
  tagged.copy = trace_copy;
  auto line = to_json(tagged) + "\n";
  // One write per line: O_APPEND keeps lines from several shard processes whole.
  if (::write(trace_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    std::fprintf(stderr, "%s: writing the trace failed: %s\n", name.c_str(), std::strerror(errno));
}

namespace {

using self_ptr = shard_impl*;
using ack_promise = caf::typed_response_promise<std::uint64_t>;

shard_request request_of(const request_header& h) { return {h.epoch, h.worker, h.clock, h.seq, h.tick}; }

// The values of an answerable pull: encoded when asked for, over the reader's data
// connection when it has one (written straight from the store), else inside the message.
float_block pull_values(self_ptr self, const shard_options& opts, const request_header& hdr,
                        const std::vector<key_range>& ranges) {
  const auto& store = self->state.core->store();
  std::uint64_t n = 0;
  for (const auto& r : ranges) n += r.size();
  if (hdr.pull_codec != 0) {  // compressed: encoded inside the message, not over the data plane
    const auto kind = static_cast<codec_kind>(hdr.pull_codec);
    if (kind != codec_kind::fp16 && kind != codec_kind::int8)
      throw bad_request("pull codec " + std::to_string(hdr.pull_codec) + " is not fp16 (1) or int8 (2)");
    // Encoded straight from the store when the answer is one run of it; else gathered first.
    auto spans = store.view(ranges, n);
    std::vector<float> gathered;
    if (spans.size() > 1) {
      gathered.reserve(n);
      for (auto part : spans) gathered.insert(gathered.end(), part.begin(), part.end());
    }
    const float* values = spans.size() > 1 ? gathered.data() : spans.empty() ? nullptr : spans[0].data();
    return float_block::encode_of(encode(codec{kind}, values, n), n);
  }
  // Its ticket is the request's seq, so the reader may have said where it should land.
  // Written straight from the store by the plane's writer: the shard awaits the write
  // before it handles another message (await_store_writes), so nothing changes the store
  // under it, no thread waits and nothing is copied.
  auto& st = self->state;
  bool over_plane = opts.plane && hdr.reply_plane != 0;
  if (over_plane) {
    ++st.writes_issued;  // the signal fires once, also when the plane does not take it
    if (auto named = opts.plane->offload(hdr.reply_plane, store.view(ranges, n), n, hdr.seq, written_signal(st.writes, st.write_counts)))
      return *named;
  }
  std::vector<float> out(n);
  store.pull(ranges, out.data(), n);
  if (over_plane) {  // too many small pieces to write from where they are: copied first
    auto copied = float_block::own(std::move(out));
    std::span<const float> whole(copied.data(), n);
    if (auto named = opts.plane->offload(hdr.reply_plane, std::span(&whole, 1), n, hdr.seq, copied.storage))
      return *named;
    return copied;
  }
  return float_block::own(std::move(out));
}

// An update's result, delivered into the promise made when it arrived: a value or an
// error; a delegated result already went to that promise.
void settle(ack_promise rp, const caf::result<std::uint64_t>& r) {
  if (r.flag == caf::rt_value) rp.deliver(r.value.get_as<std::uint64_t>(0));
  else if (r.flag == caf::rt_error) rp.deliver(r.err);
}

// Delivers now, or after opts.reply_delay (test hook simulating a slow shard).
template <class T>
void deliver_late(self_ptr self, const shard_options& opts, caf::typed_response_promise<T> rp, T value) {
  if (opts.reply_delay.count() == 0) {
    rp.deliver(std::move(value));
    return;
  }
  self->spawn([=](caf::event_based_actor* timer) mutable -> caf::behavior {
    timer->delayed_send(timer, opts.reply_delay, caf::ok_atom::value);
    return {[=](caf::ok_atom) mutable {
      rp.deliver(value);
      timer->quit();
    }};
  });
}

// The rows of an answered row pull, inside the message (a batch's rows are small).
float_block row_values(shard_core& core, std::uint64_t token) { return float_block::own(core.take_row_values(token)); }

void answer_pull(self_ptr self, const shard_options& opts, std::uint64_t token) {
  auto& st = self->state;
  auto it = st.pulls.find(token);
  if (it == st.pulls.end()) return;
  auto waiting = std::move(it->second);
  st.pulls.erase(it);
  try {
    deliver_late(self, opts, waiting.promise,
                 st.core->is_row_pull(token) ? row_values(*st.core, token)
                                             : pull_values(self, opts, waiting.hdr, st.core->pull_ranges(token)));
  } catch (const bad_request& e) {
    waiting.promise.deliver(make_ps_error(st.name + ": " + e.what()));
  }
  st.core->forget_pull(token);
}

// Payloads written from the store are on their way: no other message is handled
// (await) until they are written, since it might change the store under them.
void await_store_writes(self_ptr self) {
  auto& st = self->state;
  if (st.writes_awaited == st.writes_issued || st.write_counts->done == st.writes_issued) return;  // all out already
  st.writes_awaited = st.writes_issued;
  self->request(st.writes, caf::infinite, drained_atom::value, st.writes_issued)
    .await([](caf::ok_atom) {}, [](caf::error&) {});  // the tracker ends only with the shard
}

// A refused request: errc::moved when it was planned by an older map than this shard's
// (its keys or rows may have moved: the client sends it again by the new map).
caf::error refusal(self_ptr self, const request_header& hdr, const std::string& why) {
  auto& st = self->state;
  return make_error(st.core && hdr.epoch < st.core->map_epoch() ? errc::moved : errc::failed, why);
}

void carry_out(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, shard_effects& fx);

void disk_failed(self_ptr self, const caf::error& e) {
  std::fprintf(stderr, "%s: the disk tier failed: %s\n", self->state.name.c_str(), describe(e).c_str());
  self->quit(e);
}

void read_from_disk(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                    std::shared_ptr<const std::vector<row_key>> keys);

// The disk tier's work: evicted rows to write, rows to read (no order needed between
// them: a row is read only when no write of it is under way).
void send_disk_work(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, shard_effects& fx) {
  auto& st = self->state;
  for (auto& w : fx.writes)
    self->request(st.disk, caf::infinite, write_rows_atom::value, std::move(w))
      .then(
        [=](std::uint64_t seq) {
          auto next = self->state.core->rows_written(seq);
          carry_out(self, opts, coordinator, next);
        },
        [=](caf::error& e) { disk_failed(self, e); });
  for (const auto& s : fx.sweeps)
    self->request(st.disk, caf::infinite, sweep_rows_atom::value, s)
      .then(
        [=](const std::shared_ptr<const swept_page>& page) {
          auto next = self->state.core->rows_swept(s, *page);
          carry_out(self, opts, coordinator, next);
        },
        [=](caf::error& e) { disk_failed(self, e); });
  // One read: the I/O actor spreads its keys over the idle readers (actors/row_io.hpp).
  if (!fx.reads.empty())
    read_from_disk(self, opts, coordinator, std::make_shared<const std::vector<row_key>>(std::move(fx.reads)));
}

void read_from_disk(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                    std::shared_ptr<const std::vector<row_key>> keys) {
  self->request(self->state.disk, caf::infinite, read_rows_atom::value, std::move(keys))
    .then(
      [=](std::shared_ptr<const disk_rows>& got) {
        shard_effects next;
        try {
          next = self->state.core->rows_loaded(*got->keys, got->found, got->rows, got->pushed);
        } catch (const bad_request& e) {
          disk_failed(self, make_ps_error(e.what()));
          return;
        }
        carry_out(self, opts, coordinator, next);
      },
      [=](caf::error& e) { disk_failed(self, e); });
}

// This shard's part of the checkpoint at `clock`: its parameters and its rows. Rows on a
// disk tier are saved by the I/O actor (after the writes before them) into the
// checkpoint's directory, and the part, naming that directory, follows.
void send_checkpoint_part(self_ptr self, std::uint64_t clock) {
  auto& st = self->state;
  shard_snapshot part{st.core->id(), st.core->store().snapshot(), {}, {}, 0};
  part.sightings = st.core->rows().sightings();
  if (!st.disk) {
    part.tables = st.core->table_snapshot();
    caf::anon_send(st.checkpointer, snapshot_atom::value, part.shard, clock, st.core->epoch(), snapshot_block(part));
    return;
  }
  part.disk_rows = disk_rows_name(clock, part.shard);
  part.disk_row_count = st.core->rows().rows_live();
  part.disk_table_rows = st.core->rows().live_rows();
  auto into = (std::filesystem::path(st.checkpoint_dir) / part.disk_rows).string();
  auto changed = std::make_shared<const row_write>(st.core->rows().dirty_rows());
  auto epoch = st.core->epoch();
  self->request(st.disk, caf::infinite, save_rows_atom::value, changed, into)
    .then([=](caf::ok_atom) { caf::anon_send(self->state.checkpointer, snapshot_atom::value, part.shard, clock, epoch,
                                             snapshot_block(part)); },
          [=](caf::error& e) { disk_failed(self, e); });
}

// Carries out what the core left to do.
void carry_out(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, shard_effects& fx) {
  auto& st = self->state;
  for (const auto& e : fx.traces) st.trace(e);
  if (!fx.writes.empty() || !fx.reads.empty() || !fx.sweeps.empty()) send_disk_work(self, opts, coordinator, fx);
  for (auto id : fx.applied)
    if (auto it = st.push_waiters.find(id); it != st.push_waiters.end()) {
      auto reply = std::move(it->second);
      st.push_waiters.erase(it);
      reply();
    }
  if (fx.checkpoint_at && st.checkpointer) send_checkpoint_part(self, *fx.checkpoint_at);
  for (const auto& loss : fx.losses) caf::anon_send(coordinator, loss_atom::value, loss);
  if (fx.die) die_abruptly(*fx.die);
  for (auto token : fx.answer) answer_pull(self, opts, token);
  await_store_writes(self);
  for (auto& [token, why] : fx.fail) {
    if (auto it = st.pulls.find(token); it != st.pulls.end()) {
      it->second.promise.deliver(refusal(self, it->second.hdr, why));
      st.pulls.erase(it);
    }
    st.core->forget_pull(token);
  }
}

// While pulls are parked, wakes when the oldest reaches the park limit, so its
// explanation always beats the client's own timeout (the limit is 90% of it).
void schedule_sweep(self_ptr self, const shard_options& opts) {
  auto& st = self->state;
  if (st.sweep_scheduled || !st.core) return;
  auto due = st.core->next_expiry(opts.park_limit);
  if (!due) return;
  st.sweep_scheduled = true;
  auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(*due - self->clock().now());
  self->delayed_send(self, std::max(wait, std::chrono::milliseconds(1)), sweep_atom::value);
}

void follow(self_ptr self, const shard_actor& next);

// A copy this one seeded that no map names yet failed an update (it refused it, or did not
// answer): its growth was abandoned (the coordinator that asked for it died, and the one
// resumed does not know it: it refuses the copy's rejoin, and the copy, whose map stops at
// the old coordinator's, refuses every newer update meanwhile). The copy ends, so nothing
// ever reads from it, and this copy is the tail again: the update is on every copy of the
// chain. Failing it instead failed the workers' updates and ticks (sim --elastic --tiered
// seed 19669). A chain that should grow grows again from here.
void drop_unannounced_copy(self_ptr self, const caf::error& err) {
  auto& st = self->state;
  log_line(log_level::warning, st.name + ": the copy it seeded, which no map names yet, failed an update (" +
                                   describe(err) + "); it is stopped, and this copy is its chain's tail again");
  caf::anon_send_exit(st.successor, caf::exit_reason::kill);
  follow(self, {});
}

// The successor acknowledged (or refused) update `tag`: the reply owed goes out. While
// the successor is dead, failures wait for the new chain, which sends them again.
void forwarded(self_ptr self, std::uint64_t tag, const caf::error& err) {
  auto& st = self->state;
  auto it = st.forwards.find(tag);
  if (it == st.forwards.end()) return;  // sent again to a new successor since
  if (err == caf::sec::request_receiver_down) st.successor_down = true;  // bounced: it has ended
  if (err && st.successor_down) return;
  if (err && st.successor_unannounced) return drop_unannounced_copy(self, err);
  it->second.settle(err ? make_ps_error(st.name + ": the next copy in the chain failed: " + describe(err)) : caf::error{});
  st.forwards.erase(it);
}

// An update applied here goes down the chain; the reply to its sender waits for the
// successor's, so an acknowledged update is on every copy.
// made: the reply's promise, made when the request arrived (its values came later).
// Sends f down the chain and keeps it until the successor answers (a new successor gets
// it again: follow).
void send_down(self_ptr self, shard_state::forward f) {
  auto& st = self->state;
  auto tag = ++st.next_forward;
  auto send = f.send;
  st.forwards.emplace(tag, std::move(f));
  if (!st.seeding_copy) send(st.successor, tag);  // else once the copy has its seed (finish_seed)
}

caf::result<std::uint64_t> pass_down(self_ptr self, std::function<void(shard_actor, std::uint64_t)> send,
                                     std::uint64_t value, std::optional<ack_promise> made) {
  auto rp = made ? *made : self->make_response_promise<std::uint64_t>();
  send_down(self, {std::move(send), rp, value});
  return rp;
}

// What sends request xs to a successor: its answer, or its failure, settles the forward
// under `tag` (forwarded).
template <class Timeout, class... Ts>
std::function<void(shard_actor, std::uint64_t)> chain_sender(self_ptr self, Timeout timeout, Ts... xs) {
  return [=](shard_actor next, std::uint64_t tag) {
    self->request(next, timeout, xs...)
      .then([=](std::uint64_t) { forwarded(self, tag, {}); }, [=](caf::error& e) { forwarded(self, tag, e); });
  };
}

// The reply to an update: now (the tail, or the only copy), after reply_delay, or once
// the successor acknowledged it. make_send() gives what sends the update down the chain:
// called only when there is a successor, so the only copy of a shard copies nothing for it.
template <class MakeSend>
caf::result<std::uint64_t> acknowledge(self_ptr self, const shard_options& opts, std::uint64_t value,
                                       MakeSend make_send, std::optional<ack_promise> made = std::nullopt) {
  if (self->state.successor) return pass_down(self, make_send(), value, made);
  if (opts.reply_delay.count() == 0 && !made) return value;
  auto rp = made ? *made : self->make_response_promise<std::uint64_t>();
  deliver_late(self, opts, rp, value);
  return rp;
}

enum class write_kind { push, init, rows };

// A write of `kind` (u's ranges or rows, with `values`) to `to`, with the header it came with.
void send_write(self_ptr self, const shard_options& opts, const shard_actor& to, write_kind kind,
                const request_header& hdr, const deferred_update& u, const float_block& values,
                std::function<void()> ok, std::function<void(caf::error&)> failed) {
  auto on_ack = [ok](std::uint64_t) { ok(); };
  if (kind == write_kind::rows)
    self->request(to, opts.forward_timeout, push_rows_atom::value, hdr, row_ids{*u.table, u.ids}, values).then(on_ack, failed);
  else if (kind == write_kind::push)
    self->request(to, opts.forward_timeout, push_atom::value, hdr, range_list{u.ranges}, values).then(on_ack, failed);
  else
    self->request(to, opts.forward_timeout, init_atom::value, hdr, range_list{u.ranges}, values).then(on_ack, failed);
}

// Sends through `request` to shard `owner`'s head of the moment until it answers; done
// with the outcome. A map naming another head for the owner (its head died, perhaps with
// the message) sends it there again (send_again_to_new_heads): the first answer counts.
// A bounce by a head that died waits for that map.
using owner_request =
  std::function<void(const shard_actor& head, std::function<void()> ok, std::function<void(caf::error&)> failed)>;
void send_to_owner(self_ptr self, std::uint32_t owner, owner_request request, std::function<void(caf::error)> done,
                   std::uint64_t id = 0) {
  auto& st = self->state;
  auto head = st.owners.find(owner);
  if (head == st.owners.end())
    return done(make_ps_error(st.name + ": the map names no handle for shard " + std::to_string(owner)));
  if (id == 0) id = ++st.next_owner_send;
  auto next = head->second;
  st.owner_sends[id] = {owner, next, [=] { send_to_owner(self, owner, request, done, id); }};
  request(next, [=] { if (self->state.owner_sends.erase(id)) done({}); },
          [=](caf::error& e) {
            auto it = self->state.owner_sends.find(id);
            if (it == self->state.owner_sends.end() || it->second.sent_to != next || e == caf::sec::request_receiver_down)
              return;
            self->state.owner_sends.erase(it);
            done(e);
          });
}

// A map naming new heads: what is on its way to an owner's old head goes to the new one.
void send_again_to_new_heads(self_ptr self) {
  auto& st = self->state;
  std::vector<std::function<void()>> again;
  for (const auto& [id, pending] : st.owner_sends) {
    auto owner = st.owners.find(pending.owner);
    if (owner != st.owners.end() && owner->second != pending.sent_to) again.push_back(pending.send);
  }
  for (auto& send : again) send();
}

// The part of a stale write (planned by an older map) that this shard still owns:
// applied, and passed down its chain as a write of that part alone (with the same
// header); done(outcome) once the chain has it.
void apply_own_part(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, write_kind kind,
                    const request_header& hdr, deferred_update u, std::function<void(caf::error)> done) {
  auto& st = self->state;
  auto r = request_of(hdr);
  auto fx = kind == write_kind::rows ? st.core->push_rows(r, *u.table, u.ids, u.values.data(), u.values.size())
            : kind == write_kind::push ? st.core->push(r, u.ranges, u.values.data(), u.values.size())
                                       : st.core->init(r, u.ranges, u.values.data(), u.values.size());
  if (!fx.ok()) return done(make_ps_error(fx.error));
  carry_out(self, opts, coordinator, fx);
  if (!st.successor) return done({});
  auto values = float_block::own(std::move(u.values));
  auto send = [=, u = std::move(u)](shard_actor next, std::uint64_t tag) {
    send_write(self, opts, next, kind, hdr, u, values, [=] { forwarded(self, tag, {}); },
               [=](caf::error& e) { forwarded(self, tag, e); });
  };
  send_down(self, {send, {}, hdr.seq, std::move(done)});
}

// A write planned by an older map (a shard joined since; the worker's client has not
// got the new map yet): the part this shard still owns is applied here, each other part
// goes on to its owner with the same header, so the new owner's duplicate filter (which
// took this shard's) counts it once and its clock order is the worker's. Acknowledged
// once every part is. Because the client holds its ticks to the new map's shards until
// such writes are acknowledged, a new owner never counts a clock before its updates.
caf::result<std::uint64_t> forward_stale(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                         write_kind kind, const request_header& hdr,
                                         std::map<std::uint32_t, deferred_update> parts, std::optional<ack_promise> made) {
  auto& st = self->state;
  auto rp = made ? *made : self->make_response_promise<std::uint64_t>();
  auto remaining = std::make_shared<std::size_t>(parts.size());
  auto settled = std::make_shared<bool>(false);
  auto part_done = [=](caf::error e) mutable {
    if (*settled) return;
    if (e || --*remaining == 0) {
      *settled = true;
      if (e) rp.deliver(std::move(e));
      else rp.deliver(hdr.seq);
    }
  };
  for (auto& [owner, u] : parts) {
    if (owner == st.core->id()) {
      apply_own_part(self, opts, coordinator, kind, hdr, std::move(u), part_done);
      continue;
    }
    auto to = st.owners.find(owner);
    if (to == st.owners.end()) {
      part_done(make_ps_error(st.name + ": keys of a write from worker " + std::to_string(hdr.worker) +
                              " moved to shard " + std::to_string(owner) + ", whose handle this shard lacks"));
      continue;
    }
    auto values = float_block::own(std::move(u.values));
    auto part = std::make_shared<const deferred_update>(std::move(u));
    auto request = [=](const shard_actor& head, std::function<void()> ok, std::function<void(caf::error&)> failed) {
      send_write(self, opts, head, kind, hdr, *part, values, ok, failed);
    };
    auto name = st.name;
    auto send = [=] {
      send_to_owner(self, owner, request, [=](caf::error e) mutable {
        if (e) e = make_ps_error(name + ": passing a write of moved keys to shard " + std::to_string(owner) + ": " + describe(e));
        part_done(std::move(e));
      });
    };
    if (st.holding_forwards) st.held_forwards.push_back(send);
    else send();
  }
  return rp;
}

// This shard's handoff has sent its parts (or failed): the writes held meanwhile go on.
void release_forwards(self_ptr self) {
  auto& st = self->state;
  st.holding_forwards = false;
  auto held = std::move(st.held_forwards);
  st.held_forwards.clear();
  for (auto& send : held) send();
}

// A push or an init with its values: handed to the core, then acknowledged and passed
// down the chain. made: the reply's promise when the values came after the request.
caf::result<std::uint64_t> apply_write(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                       bool is_push, const request_header& hdr, const range_list& ranges,
                                       const float_block& values, std::optional<ack_promise> made = std::nullopt) {
  auto& st = self->state;
  if (hdr.epoch < st.core->map_epoch() && !st.core->owns(ranges.ranges)) {
    auto parts = st.core->route_stale({hdr.epoch, hdr.worker, hdr.clock, hdr.seq, ranges.ranges,
                                       {values.data(), values.data() + values.size}});
    if (!parts.empty()) return forward_stale(self, opts, coordinator, is_push ? write_kind::push : write_kind::init, hdr,
                                             std::move(parts), made);
  }
  auto fx = is_push ? st.core->push(request_of(hdr), ranges.ranges, values.data(), values.size)
                    : st.core->init(request_of(hdr), ranges.ranges, values.data(), values.size);
  if (!fx.ok()) return refusal(self, hdr, fx.error);
  carry_out(self, opts, coordinator, fx);
  auto make_send = [&] {
    return is_push ? chain_sender(self, opts.forward_timeout, push_atom::value, hdr, ranges, values)
                   : chain_sender(self, opts.forward_timeout, init_atom::value, hdr, ranges, values);
  };
  return acknowledge(self, opts, hdr.seq, make_send, made);
}

// A push or an init: its values are in the message, or landed from the data plane, or
// are still on their way there. Then the shard waits for them without blocking a thread
// (await: later messages stay queued behind this one, so a worker's pushes and ticks
// keep their order) and answers through a promise.
// Applies an update's values (with the promise made for it, when it waited for them).
// One that runs after its handler returned refers to the behavior's shard_options, which
// live as long as the shard; copying them per update cost allocations on every push.
using apply_values = std::function<caf::result<std::uint64_t>(const float_block&, std::optional<ack_promise>)>;

caf::result<std::uint64_t> claim_then(self_ptr self, const shard_options& opts, const char* what,
                                      const request_header& hdr, const float_block& sent, apply_values apply) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  auto refused = [name = st.name, what, worker = hdr.worker](const std::string& why) {
    return make_ps_error(name + ": " + what + " from worker " + std::to_string(worker) + ": " + why);
  };
  // Values lent from a ring are applied in place, but one passed down the chain is kept
  // until the successor has it: that one is copied (the ring's writer waits for it).
  auto apply_claimed = [self, &opts, apply](const float_block& values, std::optional<ack_promise> made) {
    if (!values.lent || !self->state.successor) return apply(values, made);
    return apply(float_block{opts.plane->copied(values.data(), values.size), 0, values.size}, made);
  };
  std::optional<float_block> values;
  try {
    values = claim_values(opts.plane.get(), sent, true);
  } catch (const bad_request& e) {
    return refused(e.what());
  }
  if (values) return apply_claimed(*values, std::nullopt);
  auto rp = self->make_response_promise<std::uint64_t>();
  self->request(st.claimer, caf::infinite, claim_atom::value, sent)
    .await([=](const float_block& landed) { settle(rp, apply_claimed(landed, rp)); },
           [=](caf::error& e) mutable { rp.deliver(refused(describe(e))); });
  return rp;
}

caf::result<std::uint64_t> write(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                 bool is_push, const request_header& hdr, const range_list& ranges,
                                 const float_block& sent) {
  return claim_then(self, opts, is_push ? "push" : "init", hdr, sent,
                    [=, &opts](const float_block& values, std::optional<ack_promise> made) {
                      return apply_write(self, opts, coordinator, is_push, hdr, ranges, values, made);
                    });
}

// A push of rows: applied as a push is (acknowledged once every copy has it).
caf::result<std::uint64_t> write_rows(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                      const request_header& hdr, const row_ids& rows, const float_block& sent) {
  return claim_then(self, opts, "push of rows", hdr, sent, [=, &opts](const float_block& values, std::optional<ack_promise> made)
                                                              -> caf::result<std::uint64_t> {
    auto& st = self->state;
    if (hdr.epoch < st.core->map_epoch() && rows.table < st.core->num_tables() && !st.core->owns_rows(rows.table, rows.ids)) {
      auto parts = st.core->route_stale({hdr.epoch, hdr.worker, hdr.clock, hdr.seq, {},
                                         {values.data(), values.data() + values.size}, rows.table, rows.ids});
      if (!parts.empty()) return forward_stale(self, opts, coordinator, write_kind::rows, hdr, std::move(parts), made);
    }
    auto fx = st.core->push_rows(request_of(hdr), rows.table, rows.ids, values.data(), values.size);
    if (!fx.ok()) return refusal(self, hdr, fx.error);
    if (fx.queued_push && !st.successor) {  // the last copy answers once applied: no worker outruns the disk
      auto rp = made ? *made : self->make_response_promise<std::uint64_t>();
      st.push_waiters.emplace(*fx.queued_push, [=]() mutable { deliver_late(self, opts, rp, hdr.seq); });
      carry_out(self, opts, coordinator, fx);
      return rp;
    }
    carry_out(self, opts, coordinator, fx);
    auto make_send = [&] { return chain_sender(self, opts.forward_timeout, push_rows_atom::value, hdr, rows, values); };
    return acknowledge(self, opts, hdr.seq, make_send, made);
  });
}

caf::result<std::uint64_t> write_encoded(self_ptr self, const shard_options& opts,
                                         const coordinator_actor& coordinator, const request_header& hdr,
                                         const range_list& ranges, const encoded_block& data) {
  float_block values;
  try {
    auto n = count_keys(ranges.ranges);
    std::vector<float> decoded(n);
    if (!data.bytes) throw bad_request("compressed push without data");
    decode(std::span<const std::byte>(*data.bytes), decoded.data(), n);
    values = float_block::own(std::move(decoded));
  } catch (const bad_request& e) {
    return make_ps_error(self->state.name + ": compressed push from worker " + std::to_string(hdr.worker) + ": " +
                         e.what());
  }
  return write(self, opts, coordinator, true, hdr, ranges, values);
}

// A pull of keys or rows under a new token: answered through the promise once the core
// lets it through (start_pull asks the core).
template <class StartPull>
caf::result<float_block> gated_pull(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                    const request_header& hdr, StartPull start_pull) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  auto token = ++st.next_pull;
  auto rp = self->make_response_promise<float_block>();
  st.pulls.emplace(token, shard_state::waiting_pull{hdr, rp});
  auto fx = start_pull(token);
  if (!fx.ok()) {  // the promise took the request: the refusal goes through it (returning it was lost)
    st.pulls.erase(token);
    rp.deliver(refusal(self, hdr, fx.error));
    return rp;
  }
  carry_out(self, opts, coordinator, fx);
  schedule_sweep(self, opts);  // parked: it fails with its reason before the client's timeout
  return rp;
}

caf::result<std::uint64_t> tick(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                const request_header& hdr) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  auto fx = st.core->tick(request_of(hdr));
  if (!fx.ok()) return make_ps_error(fx.error);
  carry_out(self, opts, coordinator, fx);
  auto make_send = [&] { return chain_sender(self, opts.forward_timeout, clock_atom::value, hdr); };
  return acknowledge(self, opts, hdr.clock, make_send);
}

encoded_block block_of(const std::string& bytes) {
  encoded_block block{std::make_shared<std::vector<std::byte>>(bytes.size())};
  std::memcpy(block.bytes->data(), bytes.data(), bytes.size());
  return block;
}

// Whether the shard's map still has it (a shard that left has handed all over).
bool in_own_map(const shard_core& core) {
  const auto& ids = core.map().shard_ids();
  return std::find(ids.begin(), ids.end(), core.id()) != ids.end();
}

// `next` follows this copy in its chain now (none: this copy is the tail). The updates
// the old successor had not acknowledged go to it again, in order; a tail owes their
// replies itself (they are applied here).
void follow(self_ptr self, const shard_actor& next) {
  auto& st = self->state;
  st.successor = next;
  st.successor_down = false;
  st.successor_unannounced = false;
  st.seeding_copy = false;
  if (next) self->monitor(next);
  auto pending = std::move(st.forwards);
  st.forwards.clear();
  for (auto& [tag, f] : pending) {
    if (!next) {
      f.settle({});
      continue;
    }
    auto fresh = ++st.next_forward;
    auto send = f.send;
    st.forwards.emplace(fresh, std::move(f));
    send(next, fresh);
  }
}

// A new map: this copy's place in its chain. A new successor (the old one died) gets
// what it may lack again, in order; a copy that became the tail owes the replies itself.
std::uint64_t take_view(self_ptr self, const cluster_view& view) {
  auto& st = self->state;
  if (!st.core) return view.epoch;
  st.core->saw_epoch(view.epoch);
  if (view.checkpointer) st.checkpointer = view.checkpointer;
  // A view older than one taken already (a map change's, asked before a failover's views
  // came: a copy ahead may end after them) names heads and chains that may have died
  // since; following it would send updates to a dead successor for good.
  if (view.epoch < st.placed_epoch) return st.core->epoch();
  st.placed_epoch = view.epoch;
  for (const auto& e : view.shards)
    if (e.handle) st.owners[e.id] = caf::actor_cast<shard_actor>(e.handle);
  send_again_to_new_heads(self);
  auto id = st.core->id();
  // By id: a map after a removal lacks the shards that left.
  auto entry = std::find_if(view.shards.begin(), view.shards.end(), [&](const shard_entry& e) { return e.id == id; });
  if (entry == view.shards.end()) {  // it left the map: what it applied is handed over, it answers alone
    if (st.successor && st.successor_down) follow(self, {});
    return st.core->epoch();
  }
  const auto& chain = entry->chain;
  auto me = std::find(chain.begin(), chain.end(), caf::actor_cast<caf::actor>(self));
  if (me == chain.end()) return st.core->epoch();  // one copy per shard, or not (yet) in the chain
  st.core->set_head(me == chain.begin());
  auto next = me + 1 == chain.end() ? shard_actor{} : caf::actor_cast<shard_actor>(*(me + 1));
  if (!next && st.successor_unannounced) return st.core->epoch();  // named once it took its seed
  if (next == st.successor) {
    st.successor_unannounced = false;
    return st.core->epoch();
  }
  follow(self, next);
  return st.core->epoch();
}

// The parameters and rows a registration carries (--restore, a replacement); throws
// bad_request.
shard_snapshot restored_state(const registration& reg) {
  if (!reg.state.bytes || reg.state.bytes->empty()) return {reg.id, {}, {}, {}, 0};
  auto snap = snapshot_of(reg.state);
  if (snap.shard != reg.id) throw bad_request("restored state belongs to shard " + std::to_string(snap.shard));
  return snap;
}

shard_config config_of(const registration& reg, const shard_options& opts, const std::string& name,
                       shard_snapshot state) {
  shard_config c;
  c.id = reg.id;
  c.name = name;
  c.epoch = reg.view.epoch;
  for (const auto& s : reg.view.shards) c.shard_ids.push_back(s.id);
  c.vnodes = reg.view.vnodes;
  c.bucket_bits = reg.view.bucket_bits;
  c.dense = reg.view.dense.ranges;
  for (std::size_t i = 0; i < reg.view.placed_buckets.size() && i < reg.view.placed_owners.size(); ++i)
    c.placement.emplace_back(reg.view.placed_buckets[i], reg.view.placed_owners[i]);
  for (const auto& t : reg.view.tables) c.tables.push_back(t.to_spec());
  c.rule = reg.view.rule.to_rule();
  c.num_workers = reg.view.num_workers;
  c.staleness = reg.view.staleness;
  c.checkpoint_every = reg.view.checkpoint_every;
  c.sends_checkpoints = static_cast<bool>(reg.view.checkpointer);
  if (!opts.replaces && !opts.replica) c.kill_at = opts.faults.kill_clock(fault_plan::role::server, reg.id);
  c.head = !opts.replica;
  c.restored = std::move(state.segments);
  c.restored_rows = std::move(state.tables);
  c.restored_disk_rows = state.disk_row_count;
  c.restored_disk_table_rows = std::move(state.disk_table_rows);
  c.restored_sightings = std::move(state.sightings);
  c.shard_memory = opts.shard_memory;
  c.eviction = opts.eviction;
  return c;
}

// A copy this shard started in its process ends when this shard does, as with the
// process: a shard that left the job (psctl remove-shard) takes them along, and the
// chains they were in close over them and grow back elsewhere (in one process, the
// simulation's and an embedded job's, too).
void ends_with(self_ptr self, const caf::actor& copy) {
  self->attach_functor([copy](const caf::error& reason) {
    caf::anon_send_exit(copy, reason && reason != caf::exit_reason::normal ? caf::exit_reason::kill
                                                                            : caf::exit_reason::user_shutdown);
  });
}

// This process also keeps copies of the shards before this one on the ring: shard id - j
// at chain position j (so a chain spans consecutive server processes).
void spawn_replicas(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                    const registration& reg, const std::string& seed) {
  auto copies = reg.view.replication;
  auto n = static_cast<std::uint32_t>(reg.view.shards.size());
  if (opts.replica || opts.replaces || copies < 2) return;
  // A shard that joined a running job (its entry is newer than the job's first map): its
  // chain is built by the coordinator in other processes, and it keeps no copies here.
  auto me = std::find_if(reg.view.shards.begin(), reg.view.shards.end(), [&](const shard_entry& e) { return e.id == reg.id; });
  if (me == reg.view.shards.end() || me->since_epoch > 1) return;
  for (std::uint32_t j = 1; j < copies; ++j) {
    auto ropts = opts;
    ropts.faults = {};
    auto role = std::make_shared<shard_options::replica_role>();
    role->reg = reg;
    role->reg.state = {};
    role->reg.id = (reg.id + n - j) % n;
    role->position = j;
    if (!seed.empty()) role->disk_seed = sibling_disk_rows(seed, role->reg.id);
    ropts.replica = role;
    ends_with(self, caf::actor_cast<caf::actor>(self->spawn(server_shard, coordinator, ropts)));
  }
}

// Takes the id, the shard map and the job settings (and restored state) from a registration.
bool configure(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
               const registration& reg) {
  auto& st = self->state;
  st.name = opts.replica ? "shard " + std::to_string(reg.id) + " copy " + std::to_string(opts.replica->position)
                         : "shard " + std::to_string(reg.id);
  std::string seed;  // a checkpoint's rows on disk to start the disk tier from
  try {
    auto state = restored_state(reg);
    seed = opts.replica ? opts.replica->disk_seed : state.disk_rows;
    if (!seed.empty() && opts.shard_memory == 0)
      throw bad_request("the checkpoint holds this shard's rows on a disk tier (" + seed + "): restore it with --shard-memory");
    st.core.emplace(config_of(reg, opts, st.name, std::move(state)));
    st.checkpointer = reg.view.checkpointer;
    st.checkpoint_dir = reg.view.checkpoint_dir;
    if (!opts.trace_path.empty()) {
      st.trace_fd = ::open(opts.trace_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (st.trace_fd < 0) throw bad_request("cannot open trace file " + opts.trace_path + ": " + std::strerror(errno));
      st.trace_copy = (static_cast<std::uint64_t>(::getpid()) << 32) | (self->id() & 0xffffffffu);
    }
  } catch (const bad_request& e) {
    std::fprintf(stderr, "%s: bad cluster configuration: %s\n", st.name.c_str(), e.what());
    self->quit(make_ps_error(e.what()));
    return false;
  }
  if (opts.shard_memory > 0 && st.core->num_tables() > 0) {
    std::vector<std::size_t> strides;
    for (std::uint32_t t = 0; t < st.core->num_tables(); ++t) strides.push_back(st.core->rows().table(t).stride());
    st.disk = spawn_io(self, opts.disk_io, row_io, opts.shard_dir, st.name, std::move(strides), seed, opts.disk_io);
  }
  spawn_replicas(self, opts, coordinator, reg, seed);
  return true;
}

// A benchmark's table: made on disk by the I/O actor (the shard goes on meanwhile), or in RAM.
caf::result<std::uint64_t> fill(self_ptr self, std::uint32_t table, std::uint64_t count) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  if (table >= st.core->num_tables()) return make_ps_error(st.name + ": no sparse table " + std::to_string(table));
  if (!st.disk) return st.core->fill_rows_in_ram(table, count);
  auto order = std::make_shared<fill_order>();
  order->table = table;
  order->count = count;
  order->spec = st.core->rows().table(table).spec();
  order->keep = [map = st.core->map(), id = st.core->id(), table](std::uint64_t row) {
    return map.row_owner(table, row) == id;
  };
  auto rp = self->make_response_promise<std::uint64_t>();
  self->request(st.disk, caf::infinite, fill_atom::value, std::shared_ptr<const fill_order>(std::move(order)))
    .then(
      [=](std::uint64_t rows) mutable {
        self->state.core->filled_on_disk(table, rows);
        rp.deliver(rows);
      },
      [=](caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

// The shard's figures as one JSON object.
std::string stats_json(const shard_state& st) {
  const auto& rows = st.core->rows();
  const auto& s = rows.stats();
  const auto& clocks = st.core->clocks();
  nlohmann::json worker_clocks = nlohmann::json::array();  // null: the worker left
  for (std::uint32_t w = 0; w < clocks.size(); ++w)
    worker_clocks.push_back(clocks.live(w) ? nlohmann::json(clocks.clock(w)) : nlohmann::json());
  const auto keys = st.core->store().num_keys();
  nlohmann::json j{{"shard", st.core->id()},
                   {"pid", getpid()},
                   {"epoch", st.core->epoch()},
                   {"keys", keys},
                   {"clocks", std::move(worker_clocks)},
                   {"pushes", st.pushes_received},
                   {"pulls", st.pulls_received},
                   {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - st.started).count()},
                   {"rows", rows.rows_created()},
                   {"rows_expired", s.expired},
                   {"row_pushes_refused", s.refused},
                   {"table_bytes", rows.table_bytes()},
                   {"ram_bytes", rows.held_bytes()},
                   {"ram_budget", rows.budget()},
                   {"ram_hits", s.hits},
                   {"ram_misses", s.misses},
                   {"rows_read", s.read},
                   {"rows_from_buffer", s.taken_back},
                   {"rows_written", s.written},
                   {"disk_bytes_read", process_disk_read_bytes()},
                   {"peak_rss", process_peak_rss()}};
  return j.dump();
}

// A copy further down a chain: configured from its successor's registration, then it
// registers as a replica (the answer carries its state under --restore).
void start_replica(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator) {
  const auto& r = opts.replica;
  if (!configure(self, opts, coordinator, r->reg) || r->seeded_by_tail) return;
  self->request(coordinator, opts.register_timeout, register_atom::value,
                node_info{"replica", opts.host, 0, static_cast<std::uint32_t>(getpid()),
                          caf::actor_cast<caf::actor>(self), r->reg.id, r->position, protocol_version, opts.given})
    .then(
      [=](registration& reg) {
        auto& st = self->state;
        try {
          auto state = restored_state(reg);
          if (state.disk_rows != r->disk_seed)  // its disk tier started from disk_seed when configured
            throw bad_request("its disk tier started from '" + r->disk_seed + "', but the checkpoint holds its rows in '" +
                              state.disk_rows + "'");
          st.core->restore(state.segments, state.tables);
          st.core->restore_counts(state.disk_table_rows, state.disk_row_count, state.sightings);
        } catch (const bad_request& e) {
          std::fprintf(stderr, "%s: cannot restore: %s\n", st.name.c_str(), e.what());
          self->quit(make_ps_error(st.name + ": cannot restore: " + e.what()));
        }
      },
      [=](caf::error& err) {
        std::fprintf(stderr, "%s: registration as a replica failed: %s\n", self->state.name.c_str(),
                     describe(err).c_str());
        self->quit(err);
      });
}

// A replacement for a dead shard, configured at once from the checkpoint's section.
void start_replacement(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator) {
  const auto& r = opts.replaces;
  if (!configure(self, opts, coordinator, r->reg)) return;
  try {
    self->state.core->start_as_replacement(r->clock, r->departed);
  } catch (const bad_request& e) {
    auto& st = self->state;
    std::fprintf(stderr, "%s: cannot restore from %s: %s\n", st.name.c_str(), r->source.c_str(), e.what());
    self->quit(make_ps_error(st.name + ": cannot restore from " + r->source + ": " + e.what()));
  }
}

// A copy of another shard in this process, as its chain grows back (host_copy_atom): it
// waits for its seed from the chain's tail.
caf::actor host_copy(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, registration reg,
                     std::uint32_t position) {
  auto ropts = opts;
  ropts.faults = {};  // a kill names the original shard's process
  ropts.replaces = nullptr;
  auto role = std::make_shared<shard_options::replica_role>();
  role->reg = std::move(reg);
  role->reg.state = {};
  role->position = position;
  role->seeded_by_tail = true;
  ropts.replica = role;
  auto copy = caf::actor_cast<caf::actor>(self->spawn(server_shard, coordinator, ropts));
  ends_with(self, copy);
  return copy;
}

// Sends the copy being seeded (extend_chain) the pinned disk tier's rows of `table` from
// id `from` on, a page at a time (the next is read once the copy took this one, so one
// page is in memory), then the later tables', then calls done. Stops when the copy is no
// longer the one being seeded.
// A seed of a copy from a disk tier, for its report: when it began, the rows sent from
// the first pin, when the copy became the successor, the rows changed since.
struct seed_tally {
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now(), moment;
  std::uint64_t pinned = 0, changed = 0;
};

void seed_disk_rows(self_ptr self, const shard_options& opts, const shard_actor& copy, std::uint32_t table,
                    std::uint64_t from, std::function<void()> done, std::function<void(const std::string&)> failed,
                    std::shared_ptr<seed_tally> tally) {
  auto seeding = [=] {
    if (self->state.seeding_ahead == copy) return true;
    caf::anon_send(self->state.disk, unpin_rows_atom::value);
    return false;
  };
  auto next = [=](const moved_page& page) {
    if (!seeding()) return;
    if (page.more) return seed_disk_rows(self, opts, copy, table, page.next, done, failed, tally);
    if (table + 1 < self->state.core->num_tables()) return seed_disk_rows(self, opts, copy, table + 1, 0, done, failed, tally);
    done();
  };
  self->request(self->state.disk, caf::infinite, copy_rows_atom::value, table, from)
    .then(
      [=](const std::shared_ptr<const moved_page>& page) {
        if (!seeding()) return;
        if (page->ids.empty()) return next(*page);
        tally->pinned += page->ids.size();
        encoded_block part;
        try {
          part = block_of(encode_handoff(self->state.core->seed_rows(*page)));
        } catch (const bad_request& e) {
          return failed(e.what());
        }
        self->request(copy, opts.forward_timeout, takeover_atom::value, part)
          .then([=](std::uint64_t) { next(*page); },
                [=](caf::error& e) { failed("the new copy did not take its rows: " + describe(e)); });
      },
      [=](caf::error& e) {
        failed("the disk tier failed while seeding a new copy: " + describe(e));
        disk_failed(self, e);
      });
}

// Sends the copy being seeded the rest of its seed, then the updates applied here since
// the seed was taken, which waited for it (send_down).
void finish_seed(self_ptr self, const shard_options& opts, const shard_actor& copy, const encoded_block& seed,
                 caf::typed_response_promise<std::uint64_t> rp) {
  self->request(copy, opts.forward_timeout, takeover_atom::value, seed)
    .then([=](std::uint64_t) mutable { rp.deliver(self->state.core->epoch()); },
          [=](caf::error& e) mutable {
            rp.deliver(make_ps_error(self->state.name + ": the new copy did not take its seed: " + describe(e)));
          });
  auto& st = self->state;
  if (!std::exchange(st.seeding_copy, false)) return;
  for (auto& [tag, f] : st.forwards) f.send(st.successor, tag);
}

// One page of the changed rows a seed copies from the disk tier pinned at its moment
// (moves[at]: by id, or listed empty, a scan of the table), each to the copy by send;
// then the next, and done() after the last.
void seed_changed_rows(self_ptr self, std::shared_ptr<std::vector<disk_move>> moves, std::size_t at,
                       std::function<void(const shard_handoff&)> send, std::function<void()> done) {
  if (at == moves->size()) return done();
  auto next = [=](const std::shared_ptr<const moved_page>& page) {
    for (const auto& part : self->state.core->seed_changed(*page)) send(part);
    (*moves)[at].from = page->next;
    seed_changed_rows(self, moves, page->more ? at : at + 1, send, done);
  };
  const auto& move = (*moves)[at];
  auto failed = [=](caf::error& e) { disk_failed(self, e); };
  if (move.listed.empty())
    self->request(self->state.disk, caf::infinite, copy_rows_atom::value, move.table, move.from).then(next, failed);
  else
    self->request(self->state.disk, caf::infinite, move_rows_atom::value, move).then(next, failed);
}

// The copy becomes this tail's successor with all that is held here now (whole_copy),
// then every update applied from now on, in order (CAF keeps one sender's order); the
// rows of a disk tier changed since its first pin go first (`parts` now, then those of
// `moves`, from the tier pinned again now, behind every write asked before). Updates
// applied meanwhile wait for the rest of the seed (send_down). Answered once the copy
// took it.
void seed_the_rest(self_ptr self, const shard_options& opts, const shard_actor& copy, std::vector<shard_handoff> parts,
                   std::vector<disk_move> moves, caf::typed_response_promise<std::uint64_t> rp,
                   std::shared_ptr<seed_tally> tally = nullptr) {
  auto& st = self->state;
  if (tally) tally->moment = std::chrono::steady_clock::now();
  const auto seed = block_of(encode_handoff(st.core->whole_copy()));
  follow(self, copy);
  st.successor_unannounced = true;
  st.seeding_copy = static_cast<bool>(st.disk);
  auto failed = std::make_shared<bool>(false);
  std::function<void(const shard_handoff&)> send = [=](const shard_handoff& part) {
    if (tally)
      for (const auto& t : part.rows) tally->changed += t.ids.size();
    self->request(copy, opts.forward_timeout, takeover_atom::value, block_of(encode_handoff(part)))
      .then([](std::uint64_t) {},
            [=](caf::error& e) mutable {
              if (!std::exchange(*failed, true))
                rp.deliver(make_ps_error(self->state.name + ": the new copy did not take its rows: " + describe(e)));
            });
  };
  for (const auto& part : parts) send(part);
  std::function<void()> finish = [=] {
    caf::anon_send(self->state.disk, unpin_rows_atom::value);
    self->state.core->end_precopy();
    if (*failed) return;
    if (tally)
      log_line(log_level::info, self->state.name + ": seeding a new copy: " + std::to_string(tally->pinned) +
                                    " rows from its pinned disk tier in " + ms_since(tally->started) +
                                    " ms while it acknowledged alone, then " + std::to_string(tally->changed) +
                                    " rows changed since, while updates waited " + ms_since(tally->moment) + " ms");
    finish_seed(self, opts, copy, seed, rp);
  };
  if (moves.empty()) return finish();
  auto pending = std::make_shared<std::vector<disk_move>>(std::move(moves));
  self->request(st.disk, caf::infinite, pin_rows_atom::value, std::make_shared<const row_write>())
    .then([=](caf::ok_atom) { seed_changed_rows(self, pending, 0, send, finish); },
          [=](caf::error& e) { disk_failed(self, e); });
}

// The coordinator grows this copy's chain (it is the tail): the new copy takes all that
// is held here (seed_the_rest). With a disk tier the rows go first, in pages of the tier
// pinned now with the RAM tier's changed rows written, while this tail goes on
// acknowledging alone; then the rows changed since, the rest of the seed and the updates
// applied from then on. Answered once the copy took its seed.
caf::result<std::uint64_t> extend_chain(self_ptr self, const shard_options& opts, const caf::actor& next) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  if (st.successor) return make_ps_error(st.name + ": not the tail of its chain");
  if (!next) return make_ps_error(st.name + ": no copy to seed");
  if (st.precopy || st.seeding_ahead)
    return make_ps_error(st.name + ": its disk tier is pinned for another copy; grow the chain once that is over");
  auto copy = caf::actor_cast<shard_actor>(next);
  auto rp = self->make_response_promise<std::uint64_t>();
  if (!st.disk) {
    seed_the_rest(self, opts, copy, {}, {}, rp);
    return rp;
  }
  st.core->begin_seed_copy();
  st.seeding_ahead = copy;
  auto tally = std::make_shared<seed_tally>();
  std::function<void(const std::string&)> failed = [=](const std::string& why) mutable {
    caf::anon_send(self->state.disk, unpin_rows_atom::value);
    if (self->state.seeding_ahead == copy) {
      self->state.seeding_ahead = shard_actor{};
      self->state.core->end_precopy();
    }
    rp.deliver(make_ps_error(self->state.name + ": " + why));
  };
  auto done = [=] {
    caf::anon_send(self->state.disk, unpin_rows_atom::value);
    self->state.seeding_ahead = shard_actor{};
    std::vector<disk_move> listed;
    auto parts = self->state.core->seed_changes(listed);
    seed_the_rest(self, opts, copy, std::move(parts), std::move(listed), rp, tally);
  };
  auto changed = std::make_shared<const row_write>(st.core->rows().dirty_rows());
  self->request(st.disk, caf::infinite, pin_rows_atom::value, changed)
    .then([=](caf::ok_atom) { seed_disk_rows(self, opts, copy, 0, 0, done, failed, tally); },
          [=](caf::error& e) {
            failed("the disk tier failed while seeding a new copy: " + describe(e));
            disk_failed(self, e);
          });
  return rp;
}

caf::actor spawn_replacement(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                             shard_options::replacement what) {
  auto ropts = opts;
  ropts.faults = {};  // a kill names the original shard's process
  ropts.replica = nullptr;
  ropts.replaces = std::make_shared<shard_options::replacement>(std::move(what));
  return caf::actor_cast<caf::actor>(self->spawn(server_shard, coordinator, ropts));
}

// Registers with the coordinator (published at `port`); awaits the answer, so no push or
// pull is handled before the shard knows its map.
void start_server(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, std::uint16_t port) {
  self->state.port = port;
  self->request(coordinator, opts.register_timeout, register_atom::value,
                node_info{"server", opts.host, port, static_cast<std::uint32_t>(getpid()),
                          opts.host.empty() ? caf::actor_cast<caf::actor>(self) : caf::actor{}, 0, 0, protocol_version,
                          opts.given})
    .await([=](registration& reg) { configure(self, opts, coordinator, reg); },
           [=](caf::error& err) {
             std::fprintf(stderr, "server: registration with the coordinator failed: %s\n", describe(err).c_str());
             self->quit(err);
           });
}

// The coordinator went down without ending the job. A configured shard that may wait for
// it (opts.reconnect) serves on while its address is dialled again: a coordinator resumed
// there (--resume) takes it back. Otherwise, or once that wait is over, the shard ends
// with an error naming the coordinator.
void coordinator_down(self_ptr self, const shard_options& opts, const caf::error& reason) {
  auto& st = self->state;
  if (!reason || reason == caf::exit_reason::normal) return self->quit(reason);  // the job ended
  if (!opts.reconnect.enabled() || !st.core)
    return self->quit(make_ps_error(st.name + ": the coordinator went down (" + describe(reason) + ")"));
  st.coordinator_lost = describe(reason);
  log_line(log_level::warning, st.name + ": the coordinator at " + opts.reconnect.address + " went down (" +
                                   st.coordinator_lost + "); serving on, waiting up to " +
                                   std::to_string(opts.reconnect.patience.count()) + " ms for it to come back");
  redial_coordinator(self, opts.reconnect, st.coordinator.address());
}

// A coordinator answers at the old address: this shard tells it who it is. A coordinator
// that did not resume this job refuses, and the shard ends naming why; one that cannot be
// reached yet is dialled again.
void rejoin(self_ptr self, const shard_options& opts, coordinator_actor coordinator) {
  // A copy further down a chain names the place it was started at: the coordinator's
  // record keeps each chain's order by it.
  node_info me{opts.replica ? "replica" : "server", opts.host, self->state.port, static_cast<std::uint32_t>(getpid()), {},
               self->state.core->id(), opts.replica ? opts.replica->position : 0, protocol_version, opts.given};
  rejoin_coordinator(
    self, coordinator, me, opts.reconnect,
    [=] {
      auto& st = self->state;
      st.coordinator = coordinator;
      st.coordinator_lost.clear();
      log_line(log_level::warning, st.name + ": rejoined the coordinator at " + opts.reconnect.address);
    },
    [=](const std::string& why) {
      auto text = self->state.name + ": " + why;
      std::fprintf(stderr, "%s\n", text.c_str());
      self->quit(make_error(errc::job_failed, text));
    });
}

// No coordinator came back in time (why): the shard ends with an error naming it.
void coordinator_gone(self_ptr self, const shard_options& opts, const std::string& why) {
  auto& st = self->state;
  auto text = st.name + ": " + coordinator_gone_text(opts.reconnect, st.coordinator_lost) + " (" + why + ")";
  std::fprintf(stderr, "%s\n", text.c_str());
  self->quit(make_error(errc::job_failed, text));
}

// What workers may send a shard over a data connection (data_plane::serve): their
// requests on keys, rows and clocks; everything else keeps to CAF.
bool worker_request(caf::message_id mid, const caf::message& msg) {
  if (mid.is_response() || msg.empty() || !msg.match_element<caf::atom_value>(0)) return false;
  static constexpr caf::atom_value requests[] = {push_atom::value,      init_atom::value,     pull_atom::value,
                                                 push_rows_atom::value, pull_rows_atom::value, prefetch_atom::value,
                                                 clock_atom::value};
  return std::find(std::begin(requests), std::end(requests), msg.get_as<caf::atom_value>(0)) != std::end(requests);
}

// Watches the coordinator and the successor, starts the helpers, and a copy or a
// replacement configures itself at once.
void start_shard(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator) {
  self->state.coordinator = coordinator;
  self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.coordinator.address()) return coordinator_down(self, opts, dm.reason);
    auto& st = self->state;
    if (dm.source != st.successor.address()) return;
    // A seeded copy no map named (the chain did not grow), or the copies of a shard that
    // left the map (stopped by the coordinator): this copy is the tail again.
    if (st.successor_unannounced || (st.core && !in_own_map(*st.core))) return follow(self, {});
    st.successor_down = true;  // new chain coming
  });
  if (opts.plane) {
    opts.plane->lend_ring_payloads();  // updates are applied at once, straight from the ring
    self->state.claimer = self->spawn<caf::linked>(payload_claimer, opts.plane, true);
    self->state.writes = self->spawn<caf::linked>(write_tracker, self->state.write_counts);
    if (opts.plane->messages_enabled()) opts.plane->serve(caf::actor_cast<caf::strong_actor_ptr>(self), worker_request);
  }
  if (opts.replica) start_replica(self, opts, coordinator);
  if (opts.replaces) start_replacement(self, opts, coordinator);
}

// Hands an event to the core, once configured, and carries out its effects.
template <class Event>
void feed(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, Event event) {
  if (!self->state.core) return;
  auto fx = event(*self->state.core);
  if (fx.ok()) carry_out(self, opts, coordinator, fx);
}

caf::result<std::uint64_t> join(self_ptr self, std::uint32_t worker) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  try {
    auto start = st.core->join(worker);
    // A copy this tail is seeding is not among those the coordinator tells yet: it hears
    // here, ahead of the worker's updates that follow on the same path.
    if (st.successor_unannounced) caf::anon_send(st.successor, join_atom::value, worker);
    return start;
  } catch (const bad_request& e) {
    return make_ps_error(e.what());
  }
}

caf::result<std::string> stats(self_ptr self) {
  if (!self->state.core) return make_ps_error(self->state.name + ": not configured yet");
  return stats_json(self->state);
}

// Deletes the rows each move picks from the disk tier, in one call of its I/O writer per
// table (after the writes and takes asked before), and stops counting them as this shard's.
void drop_from_disk(self_ptr self, std::vector<disk_move> drops) {
  for (auto& move : drops) {
    const auto table = move.table;
    self->request(self->state.disk, caf::infinite, drop_rows_atom::value, std::move(move))
      .then([=](std::uint64_t dropped) { self->state.core->dropped_from_disk(table, dropped); },
            [=](caf::error& e) { disk_failed(self, e); });
  }
}

// One handoff under way (the map changed under this shard): its answer, the new epoch,
// waits until every part was taken. With a disk tier the moved rows come off the disk in
// pages that leave as they are read; the parts themselves leave after the last page (CAF
// keeps one sender's order), as their deferred pushes may touch the pages' rows.
struct handoff_run {
  self_ptr self;
  // Who waits for its answer: the coordinator that asked, and one resumed since that asked again.
  std::vector<caf::typed_response_promise<std::uint64_t>> answers;
  cluster_view view;
  std::vector<shard_handoff> parts;  // sent once no scan is left
  std::size_t scans = 0;             // disk_move scans not finished
  std::vector<disk_move> drops;      // after the scans (shard_effects::drops)
  std::uint64_t rows_sent = 0;       // in its parts and pages
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::size_t untaken = 0;           // parts sent, not taken yet
  bool parts_sent = false, settled = false;
  template <class Answer>
  void settle(const Answer& answer) {
    if (!settled)
      for (auto& p : answers) p.deliver(answer);
    settled = true;
  }
  void fail(const std::string& why) {
    settle(make_ps_error(why));
    release_forwards(self);  // the job ends now (the coordinator sees to it): nothing waits for them
  }
};
using handoff_run_ptr = std::shared_ptr<handoff_run>;

void send_parts(self_ptr self, const handoff_run_ptr& run, std::vector<shard_handoff> parts);

// Sends the parts once the scans are done, answers once they were all taken.
void advance_handoff(self_ptr self, const handoff_run_ptr& run) {
  if (run->settled || run->scans > 0) return;
  if (!run->parts_sent) {
    run->parts_sent = true;
    drop_from_disk(self, std::move(run->drops));
    send_parts(self, run, std::move(run->parts));
    release_forwards(self);
  }
  if (run->untaken != 0) return;
  run->settle(run->view.epoch);
  auto& st = self->state;
  if (!st.disk) return;
  // What moved keys and rows waited for (the cut); what was copied ahead is in the news before.
  log_line(log_level::info, st.name + ": cut of epoch " + std::to_string(run->view.epoch) + ": " +
                                std::to_string(run->rows_sent) + " rows sent, every part taken in " +
                                ms_since(run->started) + " ms");
  st.core->end_precopy();
}

// Each part goes to its taker's head of the moment, and again to its new head should that
// one die first (send_to_owner; a copy that took it from the dead head ignores it). Any
// other failure fails the handoff, and the coordinator ends the job.
void send_parts(self_ptr self, const handoff_run_ptr& run, std::vector<shard_handoff> parts) {
  for (const auto& part : parts) {
    for (const auto& t : part.rows) run->rows_sent += t.ids.size();
    auto block = block_of(encode_handoff(part));
    auto request = [=](const shard_actor& head, std::function<void()> ok, std::function<void(caf::error&)> failed) {
      self->request(head, std::chrono::seconds(60), takeover_atom::value, block).then([ok](std::uint64_t) { ok(); }, failed);
    };
    ++run->untaken;
    auto to = part.to;
    send_to_owner(self, to, request, [=](caf::error e) {
      if (e) return run->fail(self->state.name + ": shard " + std::to_string(to) + " did not take its keys: " + describe(e));
      --run->untaken;
      advance_handoff(self, run);
    });
  }
}

// One page of a scan that takes moved rows off the disk tier, then the next.
void scan_moved_rows(self_ptr self, const handoff_run_ptr& run, disk_move move) {
  self->request(self->state.disk, caf::infinite, move_rows_atom::value, move)
    .then(
      [=](const std::shared_ptr<const moved_page>& page) mutable {
        try {
          send_parts(self, run, self->state.core->rows_moved(*page));
        } catch (const bad_request& e) {
          return run->fail(e.what());
        }
        if (page->more) {
          move.from = page->next;
          return scan_moved_rows(self, run, std::move(move));
        }
        --run->scans;
        advance_handoff(self, run);
      },
      [=](caf::error& e) {
        run->fail(self->state.name + ": the disk tier failed while handing rows over: " + describe(e));
        disk_failed(self, e);
      });
}

// The map changes under this shard (a shard joined or leaves): it adopts `view`'s map
// and hands what moved to each new owner; the answer (the new epoch) waits until every
// taker has taken its part.
// Sends a map change (handoff_atom) down the chain, as pass_down sends updates.
std::function<void(shard_actor, std::uint64_t)> handoff_sender(self_ptr self, const shard_options& opts,
                                                               const cluster_view& view) {
  return chain_sender(self, opts.forward_timeout, handoff_atom::value, view);
}

// What this shard kept as a copy of the last map change is forgotten, its rows deleted
// from its disk: the change is over (another begins). One call of the I/O actor's writer
// per table, so no row a later write puts there is deleted (the rows it keeps are not
// this shard's under that map); deleted rows stop counting as its own.
void forget_kept(self_ptr self) { drop_from_disk(self, std::exchange(self->state.kept, {}).moves); }

// A copy further down a chain adopts the map its predecessor adopted (passed down in
// order with the updates before and after it): what the map moves away is dropped here,
// as its head hands it over; what it gains comes down the chain with the head's
// takeovers. Answered once the rest of the chain has done the same.
caf::result<std::uint64_t> adopt_as_copy(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                         const cluster_view& view) {
  auto& st = self->state;
  if (view.epoch <= st.core->map_epoch()) return view.epoch;  // adopted already
  shard_effects fx;
  forget_kept(self);  // the last change's: it is over
  try {
    // The parts are the head's to send; kept here until the change is over, for this
    // copy to send should it become the head first (the coordinator then asks it).
    st.kept.parts = st.core->hand_off(map_of(view), fx);
  } catch (const bad_request& e) {
    return make_ps_error(e.what());
  }
  st.kept.moves = std::exchange(fx.moves, {});  // scanned should this copy hand them over, after fx.writes
  carry_out(self, opts, coordinator, fx);
  take_view(self, view);
  if (!st.successor) return view.epoch;
  return pass_down(self, handoff_sender(self, opts, view), view.epoch, std::nullopt);
}

// A handoff of `parts` (and, with a disk tier, of the rows `moves` take off the disk);
// answered once every part was taken.
caf::result<std::uint64_t> start_handoff(self_ptr self, const cluster_view& view, std::vector<shard_handoff> parts,
                                         std::vector<disk_move> moves, std::vector<disk_move> drops = {}) {
  auto& st = self->state;
  auto run = std::make_shared<handoff_run>();
  run->self = self;
  run->parts = std::move(parts);
  run->drops = std::move(drops);
  run->answers.push_back(self->make_response_promise<std::uint64_t>());
  run->view = view;
  run->scans = moves.size();
  st.handoff = run;
  st.holding_forwards = run->scans > 0;
  for (auto& m : moves) scan_moved_rows(self, run, std::move(m));  // after the writes carry_out sent
  advance_handoff(self, run);
  return run->answers.front();
}

// Asked for a change this shard has adopted: by a resumed coordinator (answered with the
// handoff under way), or as the new head of a chain whose head died during the change,
// which sends what it kept as a copy (a taker that has a giver's part ignores it).
caf::result<std::uint64_t> hand_off_again(self_ptr self, const cluster_view& view) {
  auto& st = self->state;
  auto under_way = std::static_pointer_cast<handoff_run>(st.handoff);
  if (under_way && !under_way->settled && under_way->view.epoch == view.epoch) {
    under_way->answers.push_back(self->make_response_promise<std::uint64_t>());
    return under_way->answers.back();
  }
  if (st.kept.empty()) return view.epoch;
  take_view(self, view);  // the takers' heads of the moment
  auto kept = std::exchange(st.kept, {});
  return start_handoff(self, view, std::move(kept.parts), std::move(kept.moves));
}

// The fault injector's kill at=handoff: the process ends once the shard's copies adopted
// the change (they keep what it moves), before any part is sent, so the chain's next copy
// must hand it all over.
caf::result<std::uint64_t> die_in_handoff(self_ptr self, const shard_options& opts, const cluster_view& view) {
  const auto why = self->state.name + " was asked to hand keys over (epoch " + std::to_string(view.epoch) +
                   ", --faults: kill server=" + std::to_string(self->state.core->id()) + " at=handoff)";
  if (!self->state.successor) die_abruptly(why);
  send_down(self, {handoff_sender(self, opts, view), {}, view.epoch, [why](caf::error) { die_abruptly(why); }});
  return self->make_response_promise<std::uint64_t>();  // never answered: the process ends
}

// A map change's rows copied ahead by a head with a disk tier: who waits for the
// change's answer, and how many parts of the page in flight are not taken yet.
struct precopy_run {
  cluster_view view;
  std::vector<caf::typed_response_promise<std::uint64_t>> answers;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::size_t untaken = 0;
  std::uint64_t rows = 0;
  bool over = false;
};
using precopy_run_ptr = std::shared_ptr<precopy_run>;

// The copy ahead is over (why: empty when every part was taken): the pin is let go and
// the change's cut made, by asking this shard for it again (the answer goes to all who
// asked meanwhile); the cut sends only what changed since, or everything after a failure.
void end_copy_ahead(self_ptr self, const precopy_run_ptr& run, const std::string& why) {
  if (std::exchange(run->over, true)) return;
  auto& st = self->state;
  caf::anon_send(st.disk, unpin_rows_atom::value);
  if (why.empty()) st.core->precopied();
  else st.core->end_precopy();
  if (why.empty())
    log_line(log_level::info, st.name + ": copied " + std::to_string(run->rows) + " rows ahead of epoch " +
                                  std::to_string(run->view.epoch) + " in " + ms_since(run->started) + " ms");
  else
    log_line(log_level::warning, st.name + ": could not copy rows ahead of epoch " + std::to_string(run->view.epoch) +
                                     " (" + why + "): the cut sends them all");
  st.precopied_epoch = run->view.epoch;
  st.precopy.reset();
  self->request(caf::actor_cast<shard_actor>(self), caf::infinite, handoff_atom::value, run->view)
    .then([run](std::uint64_t epoch) { for (auto& a : run->answers) a.deliver(epoch); },
          [run](caf::error& e) { for (auto& a : run->answers) a.deliver(e); });
}

// The parts of one page, each to its taker's head as the change's map names it; then().
void send_ahead(self_ptr self, const shard_options& opts, const precopy_run_ptr& run, std::vector<shard_handoff> parts,
                std::function<void()> then) {
  if (parts.empty()) return then();
  for (const auto& part : parts) {
    auto entry = std::find_if(run->view.shards.begin(), run->view.shards.end(),
                              [&](const shard_entry& e) { return e.id == part.to; });
    if (entry == run->view.shards.end() || !entry->handle)
      return end_copy_ahead(self, run, "the map names no head for shard " + std::to_string(part.to));
    run->rows += part.rows.front().ids.size();
    ++run->untaken;
    self->request(caf::actor_cast<shard_actor>(entry->handle), opts.forward_timeout, takeover_atom::value,
                  block_of(encode_handoff(part)))
      .then([=](std::uint64_t) {
              if (--run->untaken == 0 && !run->over) then();
            },
            [=](caf::error& e) { end_copy_ahead(self, run, "shard " + std::to_string(part.to) + ": " + describe(e)); });
  }
}

// One page of the pinned disk tier from row `from` of `table`: its rows the change moves
// go ahead, then the next page (one in memory at a time).
void copy_page_ahead(self_ptr self, const shard_options& opts, const precopy_run_ptr& run, std::uint32_t table,
                     std::uint64_t from) {
  self->request(self->state.disk, caf::infinite, copy_rows_atom::value, table, from)
    .then(
      [=](const std::shared_ptr<const moved_page>& page) {
        if (run->over) return;
        std::vector<shard_handoff> parts;
        try {
          parts = self->state.core->precopy_page(*page);
        } catch (const bad_request& e) {
          return end_copy_ahead(self, run, e.what());
        }
        send_ahead(self, opts, run, std::move(parts), [=] {
          if (page->more) return copy_page_ahead(self, opts, run, table, page->next);
          if (table + 1 < self->state.core->num_tables()) return copy_page_ahead(self, opts, run, table + 1, 0);
          end_copy_ahead(self, run, "");
        });
      },
      [=](caf::error& e) {
        end_copy_ahead(self, run, "the disk tier failed: " + describe(e));
        disk_failed(self, e);
      });
}

// A head with a disk tier asked for a map change copies the rows it moves to their new
// owners first, from its disk tier pinned now (with the RAM tier's changed rows written),
// while it goes on serving under its map and notes which of them change; the cut comes
// after (end_copy_ahead), so the moved rows wait only for those. The takers have the new
// map already (a joiner, or the shards that stay when one leaves, which adopt it first).
caf::result<std::uint64_t> copy_ahead(self_ptr self, const shard_options& opts, const cluster_view& view) {
  auto& st = self->state;
  try {
    st.core->begin_precopy(map_of(view));
  } catch (const bad_request& e) {
    return make_ps_error(e.what());
  }
  auto run = std::make_shared<precopy_run>();
  run->view = view;
  run->answers.push_back(self->make_response_promise<std::uint64_t>());
  st.precopy = run;
  auto changed = std::make_shared<const row_write>(st.core->rows().dirty_rows());
  self->request(st.disk, caf::infinite, pin_rows_atom::value, changed)
    .then([=](caf::ok_atom) { copy_page_ahead(self, opts, run, 0, 0); },
          [=](caf::error& e) {
            end_copy_ahead(self, run, "the disk tier failed: " + describe(e));
            disk_failed(self, e);
          });
  return run->answers.front();
}

// Whether a head copies a change's rows ahead: with a disk tier, once per change, and
// not while it seeds a copy (one pin at a time); unless --handoff=cut.
bool copies_ahead(const shard_state& st, const shard_options& opts, const cluster_view& view) {
  return opts.copy_ahead && st.disk && st.core->num_tables() > 0 && st.precopied_epoch < view.epoch && !st.seeding_copy &&
         !st.seeding_ahead;
}

caf::result<std::uint64_t> hand_off(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                    const cluster_view& view) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet, cannot hand keys over");
  // The coordinator asks heads only: a copy it asks became the head before a map told it
  // so (its head died during the change, or did not come back to a resumed coordinator;
  // a shard that left the map gets no more maps).
  const bool from_coordinator = st.coordinator && self->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(st.coordinator);
  if (!st.core->head() && from_coordinator) st.core->set_head(true);
  if (!st.core->head()) return adopt_as_copy(self, opts, coordinator, view);
  if (view.epoch == st.core->map_epoch()) return hand_off_again(self, view);
  if (auto ahead = std::static_pointer_cast<precopy_run>(st.precopy); ahead && ahead->view.epoch == view.epoch) {
    ahead->answers.push_back(self->make_response_promise<std::uint64_t>());
    return ahead->answers.back();
  }
  forget_kept(self);  // before this change's scans: they would find those rows too
  if (copies_ahead(st, opts, view)) return copy_ahead(self, opts, view);
  std::vector<shard_handoff> parts;
  shard_effects fx;
  try {
    parts = st.core->hand_off(map_of(view), fx);
  } catch (const bad_request& e) {
    return make_ps_error(e.what());
  }
  auto moves = std::move(fx.moves);
  auto drops = std::move(fx.drops);
  carry_out(self, opts, coordinator, fx);  // parked pulls of moved keys fail (errc::moved); moved rows go to disk
  take_view(self, view);
  if (parts.empty() && moves.empty()) {  // it gives nothing: answered once its copies have the map too
    drop_from_disk(self, std::move(drops));
    if (!st.successor) return view.epoch;
    return pass_down(self, handoff_sender(self, opts, view), view.epoch, std::nullopt);
  }
  // Its copies adopt the map in order with its updates: they stop serving what moved,
  // and keep it until the change is over (adopt_as_copy). Their answer is not waited for
  // (it is the parts' takers'); a new successor gets it again (follow).
  if (opts.faults.kills_at_handoff(st.core->id())) return die_in_handoff(self, opts, view);
  if (st.successor) send_down(self, {handoff_sender(self, opts, view), {}, view.epoch, [](caf::error) {}});
  return start_handoff(self, view, std::move(parts), std::move(moves), std::move(drops));
}

// A giver's part: this shard now owns it.
caf::result<std::uint64_t> take_over(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                     const encoded_block& block) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet, cannot take keys over");
  if (!block.bytes) return make_ps_error(st.name + ": a handoff without bytes");
  shard_effects fx;
  try {
    auto h = decode_handoff(std::string(reinterpret_cast<const char*>(block.bytes->data()), block.bytes->size()));
    fx = st.core->take_over(h);
  } catch (const bad_request& e) {
    return make_ps_error(st.name + ": " + e.what());
  }
  carry_out(self, opts, coordinator, fx);
  if (!st.successor) return st.core->epoch();
  // Down the chain, in order: every copy holds what this shard took before the giver hears.
  return pass_down(self, chain_sender(self, std::chrono::seconds(60), takeover_atom::value, block), st.core->epoch(),
                   std::nullopt);
}

// A checkpoint's cut at `boundary`: 0 once agreed, else this shard's minimum clock (it
// passed the boundary already: the coordinator proposes a later one).
std::uint64_t cut_at(self_ptr self, std::uint64_t boundary) {
  if (!self->state.core || self->state.core->checkpoint_at(boundary)) return 0;
  return self->state.core->min_clock();
}

// Parked pulls that waited longer than the park limit fail; the next sweep is scheduled.
void sweep(self_ptr self, const shard_options& opts) {
  self->state.sweep_scheduled = false;
  feed(self, opts, self->state.coordinator, [&](shard_core& c) { return c.expire(self->clock().now(), opts.park_limit); });
  schedule_sweep(self, opts);
}

}  // namespace

shard_actor::behavior_type server_shard(self_ptr self, coordinator_actor coordinator, shard_options opts) {
  start_shard(self, opts, coordinator);
  return {
    [=](push_atom, const request_header& hdr, const range_list& ranges, const float_block& values) {
      ++self->state.pushes_received;
      return write(self, opts, self->state.coordinator, true, hdr, ranges, values);
    },
    [=](push_atom, const request_header& hdr, const range_list& ranges, const encoded_block& data) {
      ++self->state.pushes_received;
      return write_encoded(self, opts, self->state.coordinator, hdr, ranges, data);
    },
    [=](init_atom, const request_header& hdr, const range_list& ranges, const float_block& values) {
      return write(self, opts, self->state.coordinator, false, hdr, ranges, values);
    },
    [=](data_atom) -> caf::result<std::string, std::uint16_t, std::uint64_t> {
      if (!opts.plane) return {std::string{}, std::uint16_t{0}, std::uint64_t{0}};
      return {opts.plane->host(), opts.plane->port(), opts.plane->token()};
    },
    [=](pull_atom, const request_header& hdr, range_list& ranges) {
      ++self->state.pulls_received;
      return gated_pull(self, opts, self->state.coordinator, hdr, [&](std::uint64_t token) {
        return self->state.core->pull(request_of(hdr), std::move(ranges.ranges), token, self->clock().now());
      });
    },
    [=](push_rows_atom, const request_header& hdr, const row_ids& rows, const float_block& grads) {
      ++self->state.pushes_received;
      return write_rows(self, opts, self->state.coordinator, hdr, rows, grads);
    },
    [=](pull_rows_atom, const request_header& hdr, row_ids& rows) {
      ++self->state.pulls_received;
      return gated_pull(self, opts, self->state.coordinator, hdr, [&](std::uint64_t token) {
        return self->state.core->pull_rows(request_of(hdr), rows.table, std::move(rows.ids), token,
                                           self->clock().now());
      });
    },
    [=](prefetch_atom, const request_header& hdr, const row_ids& rows) {
      feed(self, opts, self->state.coordinator, [&](shard_core& c) { return c.prefetch_rows(request_of(hdr), rows.table, rows.ids); });
    },
    [=](clock_atom, const request_header& hdr) { return tick(self, opts, self->state.coordinator, hdr); },
    [=](leave_atom, std::uint32_t worker) {
      feed(self, opts, self->state.coordinator, [&](shard_core& c) { return c.leave(worker); });
      // As a join (below): a copy this tail seeds is not among those the coordinator tells.
      if (self->state.successor_unannounced) caf::anon_send(self->state.successor, leave_atom::value, worker);
    },
    [=](join_atom, std::uint32_t worker) { return join(self, worker); },
    // From the coordinator: host a replacement for a dead shard in this process.
    [=](restore_atom, registration& reg, std::uint64_t clock, std::vector<std::uint32_t>& departed,
        std::string& source) -> caf::actor {
      return spawn_replacement(self, opts, self->state.coordinator, {std::move(reg), clock, std::move(departed), std::move(source)});
    },
    [=](min_clock_atom) -> std::uint64_t { return self->state.core ? self->state.core->min_clock() : 0; },
    [=](fill_atom, std::uint32_t table, std::uint64_t count) { return fill(self, table, count); },
    [=](stats_atom) { return stats(self); },
    [=](cut_atom, std::uint64_t boundary) { return cut_at(self, boundary); },
    [=](final_atom) -> std::uint64_t { return self->state.core ? self->state.core->highest_clock() : 0; },
    [=](final_atom, std::uint64_t clock) {
      feed(self, opts, self->state.coordinator, [&](shard_core& c) { return c.final_checkpoint(clock); });
    },
    [=](view_atom, const cluster_view& view) -> std::uint64_t { return take_view(self, view); },
    [=](host_copy_atom, registration& reg, std::uint32_t position) -> caf::actor {
      return host_copy(self, opts, self->state.coordinator, std::move(reg), position);
    },
    [=](extend_atom, const caf::actor& next) { return extend_chain(self, opts, next); },
    [=](handoff_atom, const cluster_view& view) { return hand_off(self, opts, self->state.coordinator, view); },
    [=](takeover_atom, const encoded_block& block) { return take_over(self, opts, self->state.coordinator, block); },
    [=](sweep_atom) { sweep(self, opts); },
    [=](stop_atom, std::uint8_t code, std::string& why) -> caf::ok_atom {
      self->quit(code == 0 ? caf::error{} : make_error(static_cast<errc>(code), std::move(why)));  // 0: completed
      return caf::ok_atom::value;
    },
    [=](start_atom, std::uint16_t port) { start_server(self, opts, self->state.coordinator, port); },
    [=](rejoin_atom, const caf::actor& coordinator) { rejoin(self, opts, caf::actor_cast<coordinator_actor>(coordinator)); },
    [=](rejoin_atom, const std::string& why) { coordinator_gone(self, opts, why); },
  };
}

}  // namespace ps
