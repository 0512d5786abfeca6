#include "actors/server_shard.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <span>

#include "libps/checkpoint.hpp"
#include "libps/codec.hpp"

namespace ps {

shard_state::~shard_state() {
  if (trace_fd >= 0) ::close(trace_fd);
}

void shard_state::trace(const trace_event& e) const {
  if (trace_fd < 0) return;
  auto line = to_json(e) + "\n";
  // One write per line: O_APPEND keeps lines from several shard processes whole.
  if (::write(trace_fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    std::fprintf(stderr, "%s: writing the trace failed: %s\n", name.c_str(), std::strerror(errno));
}

void check_ownership(const partitioner& map, std::uint32_t id, const std::vector<key_range>& ranges) {
  auto bits = map.bucket_bits();
  for (const auto& r : ranges) {
    if (r.empty()) continue;  // the store reports malformed ranges
    for (auto b = r.begin >> bits, last = (r.end - 1) >> bits; b <= last; ++b) {
      auto owner = map.owner_of_bucket(b);
      if (owner != id)
        throw bad_request("keys " + to_string(r) + " belong to shard " + std::to_string(owner) +
                          " (epoch " + std::to_string(map.epoch()) + "), not to this one");
    }
  }
}

shard_actor::behavior_type server_shard(shard_actor::stateful_pointer<shard_state> self,
                                        coordinator_actor coordinator, shard_options opts) {
  self->monitor(coordinator);
  // The job ends when the coordinator goes: nothing else will talk to this shard.
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == coordinator.address()) self->quit(dm.reason);
    if (dm.source == self->state.successor.address()) self->state.successor_down = true;  // new chain coming
  });
  // Validates a request and runs `body` on it; bad input becomes an error naming this shard.
  auto checked = [=](const request_header& hdr, const range_list& ranges, auto body) -> caf::error {
    auto& st = self->state;
    if (!st.store)
      return make_ps_error(st.name + ": not configured yet");
    // Key ownership stays fixed across failovers (a shard id keeps its keys, only its
    // address changes), so older epochs are fine; a newer one means a view we never got.
    if (hdr.epoch > st.view_epoch)
      return make_ps_error(st.name + ": request from worker " + std::to_string(hdr.worker) +
                           " has epoch " + std::to_string(hdr.epoch) + ", current epoch is " +
                           std::to_string(st.view_epoch));
    try {
      check_ownership(*st.map, st.id, ranges.ranges);
      body();
    } catch (const bad_request& e) {
      return make_ps_error(st.name + ": " + e.what());
    }
    return {};
  };
  // A replacement shard: the first push of each worker shows which of its updates died
  // with the old shard (clocks from the checkpoint's up to this one).
  auto report_loss = [=](const request_header& hdr) {
    auto& st = self->state;
    if (!st.restored_clock || hdr.worker >= st.loss_reported.size() || st.loss_reported[hdr.worker]) return;
    st.loss_reported[hdr.worker] = true;
    auto from = *st.restored_clock;
    std::string text = st.name + ": worker " + std::to_string(hdr.worker) + ": ";
    if (hdr.clock > from)
      text += "updates of clocks " + std::to_string(from) + ".." + std::to_string(hdr.clock - 1) +
              " were lost with the dead shard (lost_clocks=" + std::to_string(hdr.clock - from) + ")" +
              // Under SSP/ASP pushes are applied on arrival, so the checkpoint may hold some.
              (st.consistency->staleness() > 0 ? ", at most: the checkpoint may hold some of them (SSP/ASP)" : "");
    else
      text += "no update lost (lost_clocks=0)";
    caf::anon_send(coordinator, report_atom::value, UINT32_MAX, std::move(text));
  };
  // Replies now, or after opts.reply_delay (test hook simulating a slow shard).
  auto reply = [=](auto value) -> caf::result<decltype(value)> {
    if (opts.reply_delay.count() == 0) return value;
    auto rp = self->template make_response_promise<decltype(value)>();
    self->spawn([=](caf::event_based_actor* timer) mutable -> caf::behavior {
      timer->delayed_send(timer, opts.reply_delay, caf::ok_atom::value);
      return {[=](caf::ok_atom) mutable { rp.deliver(value); timer->quit(); }};
    });
    return rp;
  };
  // The successor acknowledged (or refused) update `tag`: the reply owed goes out. While
  // the successor is dead, failures wait for the new chain, which sends them again.
  auto forwarded = [=](std::uint64_t tag, const caf::error& err) {
    auto& st = self->state;
    auto it = st.forwards.find(tag);
    if (it == st.forwards.end()) return;  // sent again to a new successor since
    if (err == caf::sec::request_receiver_down) st.successor_down = true;  // bounced: it has ended
    if (err && st.successor_down) return;
    if (err)
      it->second.reply.deliver(make_ps_error(st.name + ": the next copy in the chain failed: " + describe(err)));
    else
      it->second.reply.deliver(it->second.value);
    st.forwards.erase(it);
  };
  // An update applied here goes down the chain; the reply to its sender waits for the
  // successor's, so an acknowledged update is on every copy. Only with a successor: the
  // tail (or the only copy) replies at once, without building `send`.
  auto pass_down = [=](std::function<void(shard_actor, std::uint64_t)> send,
                       std::uint64_t value) -> caf::result<std::uint64_t> {
    auto& st = self->state;
    auto rp = self->make_response_promise<std::uint64_t>();
    auto tag = ++st.next_forward;
    st.forwards.emplace(tag, shard_state::forward{send, rp, value});
    send(st.successor, tag);
    return rp;
  };
  // push and init differ only in what the store does with the values.
  using write_fn = void (shard_store::*)(const std::vector<key_range>&, const float*, std::uint64_t);
  auto write = [=](write_fn fn, const request_header& hdr, const range_list& ranges,
                   const float_block& sent) -> caf::result<std::uint64_t> {
    float_block values;
    try {
      values = claim_values(opts.plane.get(), sent);
    } catch (const bad_request& e) {
      return make_ps_error(self->state.name + ": " + (fn == &shard_store::push ? "push" : "init") +
                           " from worker " + std::to_string(hdr.worker) + ": " + e.what());
    }
    if (auto err = checked(hdr, ranges, [&] {
          auto& st = self->state;
          // A resend of a push this copy already took: acknowledged (below), not applied.
          if (fn == &shard_store::push && !st.applied.first_time(hdr.worker, hdr.seq)) return;
          if (fn == &shard_store::push) report_loss(hdr);
          if (fn == &shard_store::push && st.consistency->defers_push(hdr.clock)) {
            // Acknowledged now, applied when the clock completes; a copy, since the
            // sender may reuse its buffer once acknowledged.
            shard_store::check_push(ranges.ranges, values.size);
            st.deferred.push_back({hdr, ranges, std::vector<float>(values.data(), values.data() + values.size)});
            return;
          }
          ((*st.store).*fn)(ranges.ranges, values.data(), values.size);
          if (fn == &shard_store::push && st.head) st.trace({trace_event::push, hdr.worker, hdr.clock, st.id, 0, 0});
        }))
      return err;
    if (!self->state.successor) return reply(hdr.seq);  // the tail (or the only copy) acknowledges
    bool is_push = fn == &shard_store::push;
    return pass_down([=](shard_actor next, std::uint64_t tag) {
      auto req = is_push ? self->request(next, opts.forward_timeout, push_atom::value, hdr, ranges, values)
                         : self->request(next, opts.forward_timeout, init_atom::value, hdr, ranges, values);
      std::move(req).then([=](std::uint64_t) { forwarded(tag, {}); }, [=](caf::error& e) { forwarded(tag, e); });
    }, hdr.seq);
  };
  // Reads the values of a pull the controller lets through, and traces it.
  auto answer_pull = [=](const request_header& hdr, const range_list& ranges) {
    auto& st = self->state;
    std::uint64_t n = 0;
    for (const auto& r : ranges.ranges) n += r.size();
    st.trace({trace_event::pull, hdr.worker, hdr.clock, st.id, st.consistency->clocks().min_clock(),
              st.consistency->staleness()});
    if (hdr.pull_codec != 0) {  // compressed: encoded inside the message, not over the data plane
      const auto kind = static_cast<codec_kind>(hdr.pull_codec);
      if (kind != codec_kind::fp16 && kind != codec_kind::int8)
        throw bad_request("pull codec " + std::to_string(hdr.pull_codec) + " is not fp16 (1) or int8 (2)");
      // Encoded straight from the store when the answer is one run of it; else gathered first.
      auto spans = st.store->view(ranges.ranges, n);
      std::vector<float> gathered;
      if (spans.size() > 1) {
        gathered.reserve(n);
        for (auto part : spans) gathered.insert(gathered.end(), part.begin(), part.end());
      }
      const float* values = spans.size() > 1 ? gathered.data() : spans.empty() ? nullptr : spans[0].data();
      return float_block::encode_of(encode(codec{kind}, values, n), n);
    }
    // A large answer goes over the reader's data connection, if it has one, written
    // straight from the store (nothing changes it while this handler runs).
    // Its ticket is the request's seq, so the reader may have said where it should land.
    bool over_plane = opts.plane && hdr.reply_plane != 0;
    if (over_plane)
      if (auto named = opts.plane->offload(hdr.reply_plane, st.store->view(ranges.ranges, n), n, hdr.seq))
        return *named;
    std::vector<float> out(n);
    st.store->pull(ranges.ranges, out.data(), n);
    if (over_plane) {  // too many small pieces to write from where they are: copied first
      std::span<const float> whole(out);
      if (auto named = opts.plane->offload(hdr.reply_plane, std::span(&whole, 1), n, hdr.seq)) return *named;
    }
    return float_block::own(std::move(out));
  };
  // After the minimum clock moved: apply the pushes it completes, then answer the reads
  // it lets through.
  auto release_parked = [=] {
    auto& st = self->state;
    if (!st.deferred.empty()) {
      std::vector<shard_state::deferred_push> keep;
      for (auto& d : st.deferred) {
        if (st.consistency->defers_push(d.hdr.clock)) {
          keep.push_back(std::move(d));
          continue;
        }
        st.store->push(d.ranges.ranges, d.values.data(), d.values.size());  // checked on arrival
        if (st.head) st.trace({trace_event::push, d.hdr.worker, d.hdr.clock, st.id, 0, 0});
      }
      st.deferred = std::move(keep);
    }
    // The minimum clock crossed a checkpoint boundary: every update below it is applied
    // (exactly those under BSP), so this is the shard's part of the snapshot at that clock.
    auto min = st.consistency->clocks().min_clock();
    bool boundary = min != left_clock &&
                    ((st.checkpoint_every > 0 && min / st.checkpoint_every > st.last_min / st.checkpoint_every) ||
                     (!st.checkpoint_at.empty() && *st.checkpoint_at.begin() <= min));
    if (min != left_clock) st.checkpoint_at.erase(st.checkpoint_at.begin(), st.checkpoint_at.upper_bound(min));
    if (st.head && st.checkpointer && boundary) {
      caf::anon_send(st.checkpointer, checkpoint_atom::value, st.id, min,
                     snapshot_block(shard_snapshot{st.id, st.store->snapshot()}));
    }
    if (min != left_clock) st.last_min = min;
    if (st.kill_at && min != left_clock && min >= *st.kill_at)
      die_abruptly(st.name + " reached clock " + std::to_string(min) + " (--faults: kill server=" +
                   std::to_string(st.id) + " at=" + std::to_string(*st.kill_at) + ")");
    for (auto& p : st.parked.release(*st.consistency)) {
      try {
        p.promise.deliver(answer_pull(p.hdr, p.ranges));
      } catch (const bad_request& e) {
        p.promise.deliver(make_ps_error(st.name + ": " + e.what()));
      }
    }
  };
  // The parameters a registration carries (--restore, a replacement); throws bad_request.
  auto restore_state = [=](const registration& reg) {
    if (!reg.state.bytes || reg.state.bytes->empty()) return;
    auto snap = snapshot_of(reg.state);
    if (snap.shard != reg.id) throw bad_request("restored state belongs to shard " + std::to_string(snap.shard));
    self->state.store->restore(snap.segments);
  };
  // Takes the id, the shard map and the job settings (and restored state) from a registration.
  auto configure = [=](const registration& reg) {
    auto& st = self->state;
    st.id = reg.id;
    st.name = "shard " + std::to_string(reg.id);
    std::vector<std::uint32_t> ids;
    for (const auto& s : reg.view.shards) ids.push_back(s.id);
    try {
      st.map.emplace(reg.view.epoch, ids, reg.view.vnodes, reg.view.bucket_bits, reg.view.dense.ranges);
      st.view_epoch = reg.view.epoch;
      st.store.emplace(reg.view.rule.to_rule());
      restore_state(reg);
      st.consistency.emplace(reg.view.num_workers, reg.view.staleness);
      st.checkpoint_every = reg.view.checkpoint_every;
      st.checkpointer = reg.view.checkpointer;
      if (!opts.replaces && !opts.replica) st.kill_at = opts.faults.kill_clock(fault_plan::role::server, reg.id);
      if (opts.replica) st.head = false;
      if (!opts.trace_path.empty()) {
        st.trace_fd = ::open(opts.trace_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (st.trace_fd < 0)
          throw bad_request("cannot open trace file " + opts.trace_path + ": " + std::strerror(errno));
      }
    } catch (const bad_request& e) {
      std::fprintf(stderr, "%s: bad cluster configuration: %s\n", st.name.c_str(), e.what());
      self->quit(make_ps_error(e.what()));
      return;
    }
    // This process also keeps copies of the shards before this one on the ring: shard
    // id - j at chain position j (so a chain spans consecutive server processes).
    auto copies = reg.view.replication;
    auto n = static_cast<std::uint32_t>(reg.view.shards.size());
    if (opts.replica || opts.replaces || copies < 2) return;
    for (std::uint32_t j = 1; j < copies; ++j) {
      auto ropts = opts;
      ropts.faults = {};
      auto role = std::make_shared<shard_options::replica_role>();
      role->reg = reg;
      role->reg.state = {};
      role->reg.id = (reg.id + n - j) % n;
      role->position = j;
      ropts.replica = role;
      self->spawn(server_shard, coordinator, ropts);
    }
  };
  if (const auto& r = opts.replica) {
    configure(r->reg);
    self->state.name = "shard " + std::to_string(r->reg.id) + " copy " + std::to_string(r->position);
    self->request(coordinator, opts.register_timeout, register_atom::value,
                  node_info{"replica", opts.host, 0, static_cast<std::uint32_t>(getpid()),
                            caf::actor_cast<caf::actor>(self), r->reg.id, r->position, protocol_version, opts.given})
      .then(
        [=](registration& reg) {  // --restore: the coordinator sends this shard's state along
          auto& st = self->state;
          try {
            restore_state(reg);
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
  if (const auto& r = opts.replaces) {
    configure(r->reg);
    auto& st = self->state;
    if (st.store) {
      try {  // configure restored the parameters from r->reg.state
        for (std::uint32_t w = 0; w < st.consistency->clocks().size(); ++w) st.consistency->clocks().advance(w, r->clock);
        for (auto w : r->departed) st.consistency->clocks().leave(w);
        st.last_min = r->clock;
        st.restored_clock = r->clock;
        st.loss_reported.assign(st.consistency->clocks().size(), false);
      } catch (const bad_request& e) {
        std::fprintf(stderr, "%s: cannot restore from %s: %s\n", st.name.c_str(), r->source.c_str(), e.what());
        self->quit(make_ps_error(st.name + ": cannot restore from " + r->source + ": " + e.what()));
      }
    }
  }
  // While pulls are parked, wakes when the oldest parked pull reaches the limit, so its explanation always beats
  // the client's own timeout (the limit is 90% of it).
  auto schedule_sweep = [=] {
    auto& st = self->state;
    if (st.sweep_scheduled || st.parked.size() == 0) return;
    st.sweep_scheduled = true;
    auto oldest = self->clock().now();
    st.parked.for_each([&](const parked_pull& p) { oldest = std::min(oldest, p.since); });
    auto due = oldest + opts.park_limit - self->clock().now();
    auto wait = std::max(std::chrono::duration_cast<std::chrono::milliseconds>(due), std::chrono::milliseconds(1));
    self->delayed_send(self, wait, sweep_atom::value);
  };
  return {
    [=](push_atom, const request_header& hdr, const range_list& ranges,
        const float_block& values) -> caf::result<std::uint64_t> {
      return write(&shard_store::push, hdr, ranges, values);
    },
    [=](push_atom, const request_header& hdr, const range_list& ranges,
        const encoded_block& data) -> caf::result<std::uint64_t> {
      float_block values;
      try {
        auto n = count_keys(ranges.ranges);
        std::vector<float> decoded(n);
        if (!data.bytes) throw bad_request("compressed push without data");
        decode(std::span<const std::byte>(*data.bytes), decoded.data(), n);
        values = float_block::own(std::move(decoded));
      } catch (const bad_request& e) {
        return make_ps_error(self->state.name + ": compressed push from worker " + std::to_string(hdr.worker) +
                             ": " + e.what());
      }
      return write(&shard_store::push, hdr, ranges, values);
    },
    [=](init_atom, const request_header& hdr, const range_list& ranges,
        const float_block& values) -> caf::result<std::uint64_t> {
      return write(&shard_store::init, hdr, ranges, values);
    },
    [=](data_atom) -> caf::result<std::string, std::uint16_t, std::uint64_t> {
      if (!opts.plane) return {std::string{}, std::uint16_t{0}, std::uint64_t{0}};
      return {opts.plane->host(), opts.plane->port(), opts.plane->token()};
    },
    [=](pull_atom, const request_header& hdr, range_list& ranges) -> caf::result<float_block> {
      if (auto err = checked(hdr, ranges, [] {})) return err;
      auto& st = self->state;
      if (!st.consistency->may_read(hdr.clock)) {
        auto rp = self->make_response_promise<float_block>();
        st.parked.park(hdr.clock, parked_pull{hdr, std::move(ranges), rp, self->clock().now()});
        schedule_sweep();
        return rp;
      }
      try {
        return reply(answer_pull(hdr, ranges));
      } catch (const bad_request& e) {
        return make_ps_error(st.name + ": " + e.what());
      }
    },
    [=](clock_atom, const request_header& hdr) -> caf::result<std::uint64_t> {
      if (auto err = checked(hdr, range_list{}, [&] {
            auto& clocks = self->state.consistency->clocks();
            // A tick sent again after a failover may be one this copy has already seen.
            if (hdr.clock == left_clock) {  // the worker is done: it leaves, behind its last pushes
              if (hdr.worker < clocks.size() && clocks.live(hdr.worker)) {
                clocks.leave(hdr.worker);
                self->state.trace({trace_event::leave, hdr.worker, 0, self->state.id, 0, 0});
              }
            } else if (hdr.worker >= clocks.size()) {
              clocks.advance(hdr.worker, hdr.clock);  // refused, naming the unknown worker
            } else if (clocks.live(hdr.worker) && hdr.clock > clocks.clock(hdr.worker)) {
              clocks.advance(hdr.worker, hdr.clock);
            }  // else: a tick seen before (resent after a failover), or from a worker that left
          }))
        return err;
      release_parked();
      if (!self->state.successor) return hdr.clock;
      return pass_down([=](shard_actor next, std::uint64_t tag) {
        self->request(next, opts.forward_timeout, clock_atom::value, hdr)
          .then([=](std::uint64_t) { forwarded(tag, {}); }, [=](caf::error& e) { forwarded(tag, e); });
      }, hdr.clock);
    },
    [=](leave_atom, std::uint32_t worker) {
      auto& st = self->state;
      if (!st.consistency || worker >= st.consistency->clocks().size()) return;
      st.consistency->clocks().leave(worker);
      st.trace({trace_event::leave, worker, 0, st.id, 0, 0});
      release_parked();
    },
    [=](join_atom, std::uint32_t worker) -> caf::result<std::uint64_t> {
      auto& st = self->state;
      if (!st.consistency) return make_ps_error(st.name + ": not configured yet");
      auto& clocks = st.consistency->clocks();
      auto min = clocks.min_clock();
      if (min == left_clock) min = st.last_min;  // nobody live: where the last one left off
      try {
        clocks.join(worker, min);
      } catch (const bad_request& e) {
        return make_ps_error(st.name + ": " + e.what());
      }
      if (st.restored_clock) st.loss_reported.resize(clocks.size(), true);
      return min;
    },
    // From the coordinator: host a replacement for a dead shard in this process.
    [=](restore_atom, registration& reg, std::uint64_t clock, std::vector<std::uint32_t>& departed,
        std::string& source) -> caf::actor {
      auto ropts = opts;
      ropts.faults = {};  // a kill names the original shard's process
      ropts.replica = nullptr;
      ropts.replaces = std::make_shared<shard_options::replacement>(
        shard_options::replacement{std::move(reg), clock, std::move(departed), std::move(source)});
      return caf::actor_cast<caf::actor>(self->spawn(server_shard, coordinator, ropts));
    },
    [=](checkpoint_atom) -> std::uint64_t {
      auto& st = self->state;
      return st.consistency ? st.consistency->clocks().min_clock() : 0;
    },
    [=](checkpoint_atom, std::uint64_t boundary) {
      auto& st = self->state;
      if (st.consistency && boundary > st.last_min) st.checkpoint_at.insert(boundary);
    },
    [=](view_atom, const cluster_view& view) -> std::uint64_t {
      auto& st = self->state;
      st.view_epoch = std::max(st.view_epoch, view.epoch);
      if (st.id >= view.shards.size()) return st.view_epoch;
      const auto& chain = view.shards[st.id].chain;
      auto me = std::find(chain.begin(), chain.end(), caf::actor_cast<caf::actor>(self));
      if (me == chain.end()) return st.view_epoch;  // one copy per shard, or not (yet) in the chain
      st.head = me == chain.begin();
      auto next = me + 1 == chain.end() ? shard_actor{} : caf::actor_cast<shard_actor>(*(me + 1));
      if (next == st.successor) return st.view_epoch;
      // A new successor (the old one died): what it may lack goes to it again, in order;
      // a copy that became the tail owes the replies itself.
      st.successor = next;
      st.successor_down = false;
      if (next) self->monitor(next);
      auto pending = std::move(st.forwards);
      st.forwards.clear();
      for (auto& [tag, f] : pending) {
        if (!next) {
          f.reply.deliver(f.value);
          continue;
        }
        auto fresh = ++st.next_forward;
        auto send = f.send;
        st.forwards.emplace(fresh, std::move(f));
        send(next, fresh);
      }
      return st.view_epoch;
    },
    [=](sweep_atom) {
      auto& st = self->state;
      st.sweep_scheduled = false;
      auto now = self->clock().now();
      auto expired = st.parked.release_if([&](const parked_pull& p) { return now - p.since >= opts.park_limit; });
      for (auto& p : expired) {
        const auto& clocks = st.consistency->clocks();
        auto slow = clocks.slowest();
        std::string whom = slow < clocks.size()
                             ? "worker " + std::to_string(slow) + " is at clock " + std::to_string(clocks.clock(slow))
                             : "no worker is live";
        p.promise.deliver(make_ps_error(
          st.name + ": pull at clock " + std::to_string(p.hdr.clock) + " by worker " +
          std::to_string(p.hdr.worker) + " waited " + std::to_string(opts.park_limit.count()) +
          " ms for the minimum clock to reach " + std::to_string(st.consistency->needed_min(p.hdr.clock)) +
          " (staleness " + staleness_to_string(st.consistency->staleness()) + "): " + whom));
      }
      schedule_sweep();
    },
    [=](stop_atom, std::uint8_t code, std::string& why) -> caf::ok_atom {
      self->quit(code == 0 ? caf::error{} : make_error(static_cast<errc>(code), std::move(why)));  // 0: completed
      return caf::ok_atom::value;
    },
    [=](start_atom, std::uint16_t port) {
      // Await: no push or pull is handled before the shard knows its map.
      self->request(coordinator, opts.register_timeout, register_atom::value,
                    node_info{"server", opts.host, port, static_cast<std::uint32_t>(getpid()),
                              opts.host.empty() ? caf::actor_cast<caf::actor>(self) : caf::actor{}, 0, 0,
                              protocol_version, opts.given})
        .await(
          [=](registration& reg) { configure(reg); },
          [=](caf::error& err) {
            std::fprintf(stderr, "server: registration with the coordinator failed: %s\n",
                         describe(err).c_str());
            self->quit(err);
          });
    },
  };
}

}  // namespace ps
