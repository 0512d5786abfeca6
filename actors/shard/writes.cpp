// Writes: pushes, inits and rows applied by the core, acknowledged down the chain, and
// writes planned by an older map forwarded to their new owners.
#include "actors/shard/shard_internal.hpp"

namespace ps::shard_internal {

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
// The first delivery failure dials the owner directly and sends once more over that
// connection (the route through the coordinator's node may be what died); after that, or
// when the dial fails, a bounce by a head that died waits for a map naming another.
void send_to_owner(self_ptr self, std::uint32_t owner, owner_request request, std::function<void(caf::error)> done,
                   std::uint64_t id) {
  auto& st = self->state;
  auto head = st.owners.find(owner);
  if (head == st.owners.end())
    return done(make_ps_error(st.name + ": the map names no handle for shard " + std::to_string(owner)));
  if (id == 0) id = ++st.next_owner_send;
  auto next = head->second;
  auto& pending = st.owner_sends[id];  // a send again keeps whether it went over a dialled connection
  pending.owner = owner;
  pending.sent_to = next;
  pending.send = [=] { send_to_owner(self, owner, request, done, id); };
  auto give_up = [=](caf::error e) {
    auto it = self->state.owner_sends.find(id);
    if (it == self->state.owner_sends.end() || it->second.sent_to != next || e == caf::sec::request_receiver_down)
      return;
    self->state.owner_sends.erase(it);
    done(std::move(e));
  };
  request(next, [=] { if (self->state.owner_sends.erase(id)) done({}); },
          [=](caf::error& e) {
            auto it = self->state.owner_sends.find(id);
            if (it == self->state.owner_sends.end() || it->second.sent_to != next) return;
            const bool undelivered = e == caf::sec::request_receiver_down || e == caf::sec::request_timeout ||
                                     e == caf::sec::no_route_to_receiving_node;
            if (!undelivered || it->second.redialed) return give_up(e);
            auto dialled = [=](shard_actor direct) {
              auto still = self->state.owner_sends.find(id);
              if (still == self->state.owner_sends.end() || still->second.sent_to != next) return;  // answered, or sent anew
              // The address's actor may be another copy than this head (a chain's failover).
              if (!direct || !same_actor(direct, next)) return give_up(e);
              still->second.redialed = true;
              self->state.owners[owner] = direct;
              still->second.send();
            };
            if (!dial_owner(self, owner, dialled)) give_up(e);
          });
}

namespace {
using dial_atom = caf::atom_constant<caf::atom("dialshard")>;
}  // namespace

// Dials shard `owner` at the address the map gives, on a thread of its own (connecting
// blocks; hidden: a dial still under way does not hold up the process's end), then
// then(the handle over that connection; null when it could not connect). False, then()
// never called, when there is nothing to dial (an embedded shard).
bool dial_owner(self_ptr self, std::uint32_t owner, std::function<void(shard_actor)> then) {
  auto& st = self->state;
  auto at = st.owner_addresses.find(owner);
  if (!st.dial_shard || at == st.owner_addresses.end() || at->second.first.empty()) return false;
  auto dialer = self->spawn<caf::detached + caf::hidden>(
    [dial = st.dial_shard, at = at->second](caf::event_based_actor* me) -> caf::behavior {
      return {[=](dial_atom) {
        auto handle = dial(at.first, at.second);
        me->quit();
        return handle;
      }};
    });
  // A peer that never finishes the handshake (stopped) holds the dialer: then() goes on.
  self->request(dialer, std::chrono::seconds(10), dial_atom::value)
    .then([then](shard_actor& handle) { then(handle); }, [then](caf::error&) { then({}); });
  return true;
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
                                       const float_block& values, std::optional<ack_promise> made) {
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

}  // namespace ps::shard_internal
