// The transport's helpers for actors: claims that wait without blocking (the claimer),
// connections made off the actor's thread (the connector), and the tracker of a store's
// writes. They use only the transport interface, so every transport gets them.
#include "actors/transport.hpp"

#include <caf/all.hpp>

#include "libps/net/bulk.hpp"

namespace ps {

bool in_pieces(std::size_t pieces, std::uint64_t count) {
  // Many small pieces cost more to hand to the kernel one by one than to copy together.
  return pieces <= 64 || count * sizeof(float) / pieces >= 4096;
}

std::optional<float_block> claim_values(transport* plane, const float_block& block, bool lent_ok) {
  if (block.encoded) return decoded_values(block);
  if (block.ticket == 0) return block;
  if (!plane) throw bad_request("the block names a data-connection payload, but this process has no data plane");
  return plane->try_claim(block, lent_ok);
}

namespace {

using claimer_ptr = payload_claimer_actor::stateful_pointer<payload_claimer_state>;

// A failed claim's error: errc::payload_lost where asking again may get the payload.
caf::error claim_error(const bad_request& e) {
  if (dynamic_cast<const payload_lost*>(&e)) return make_error(errc::payload_lost, e.what());
  return make_ps_error(e.what());
}

// Answers the waiting claims of (origin, ticket) whose payload can be claimed now.
void answer_claims(claimer_ptr self, transport& plane, std::pair<std::uint64_t, std::uint64_t> key) {
  auto& waiting = self->state.waiting;
  for (auto it = waiting.find(key); it != waiting.end() && it->first == key;) {
    auto& claim = it->second;
    try {
      auto values = plane.try_claim(claim.block, self->state.lent_ok);
      if (!values) return;  // not yet (a duplicate claim took it): wait on
      claim.promise.deliver(std::move(*values));
    } catch (const bad_request& e) {
      claim.promise.deliver(claim_error(e));
    }
    it = waiting.erase(it);
  }
}

}  // namespace

plane_connector_actor::behavior_type plane_connector(plane_connector_actor::pointer self,
                                                     std::shared_ptr<transport> plane) {
  // It ends with its owner, however that ends (a link ignores a normal exit).
  self->set_exit_handler([self](caf::exit_msg& msg) { self->quit(msg.reason); });
  return {[=](connect_atom, std::uint64_t peer, const std::string& host,
              std::uint16_t port) -> caf::result<std::uint64_t> {
    std::string why;
    if (plane->connect(peer, host, port, &why)) return peer;
    return make_ps_error(why);
  }};
}

payload_claimer_actor::behavior_type payload_claimer(claimer_ptr self, std::shared_ptr<transport> plane,
                                                     bool lent_ok) {
  self->state.lent_ok = lent_ok;
  // It ends with its owner, however that ends: a link ignores a normal exit, and a
  // pending expiry would keep it alive for the claim timeout (a shard's process waited
  // 10 s at its end).
  self->set_exit_handler([self](caf::exit_msg& msg) { self->quit(msg.reason); });
  return {
    [=](claim_atom, const float_block& block) -> caf::result<float_block> {
      try {
        if (auto values = plane->try_claim(block, self->state.lent_ok)) return std::move(*values);
      } catch (const bad_request& e) {
        return claim_error(e);
      }
      auto key = std::make_pair(block.origin, block.ticket);
      auto rp = self->make_response_promise<float_block>();
      self->state.waiting.emplace(key, payload_claimer_state::waiting_claim{block, rp, self->clock().now() +
                                                                                          plane->claim_timeout()});
      // Weak: a claimer that ended is not kept alive by a payload that never comes.
      plane->when_claimable(block, [addr = self->address(), key] {
        if (auto me = caf::actor_cast<caf::actor>(addr)) caf::anon_send(me, landed_atom::value, key.first, key.second);
      });
      self->delayed_send(self, plane->claim_timeout(), expire_atom::value, key.first, key.second);
      return rp;
    },
    [=](landed_atom, std::uint64_t origin, std::uint64_t ticket) { answer_claims(self, *plane, {origin, ticket}); },
    [=](expire_atom, std::uint64_t origin, std::uint64_t ticket) {
      auto& waiting = self->state.waiting;
      auto [from, to] = waiting.equal_range({origin, ticket});
      for (auto it = from; it != to;) {
        if (it->second.deadline > self->clock().now()) {  // a later claim of the same payload
          ++it;
          continue;
        }
        it->second.promise.deliver(make_error(errc::payload_lost, "payload " + std::to_string(ticket) + " (" +
                                                 std::to_string(it->second.block.size) + " floats) from " +
                                                 plane->origin_name(origin) + " did not arrive within " +
                                                 std::to_string(plane->claim_timeout().count()) + " ms"));
        it = waiting.erase(it);
      }
    },
  };
}

namespace {

// Answers the waits for at most writes->done payloads; the signals stop telling the
// tracker once none is left.
void answer_drained(write_tracker_state& st, store_writes& writes) {
  auto last = st.waiting.upper_bound(writes.done.load());
  for (auto it = st.waiting.begin(); it != last; ++it) it->second.deliver(caf::ok_atom::value);
  st.waiting.erase(st.waiting.begin(), last);
  if (st.waiting.empty()) writes.awaited = false;
}

}  // namespace

write_tracker_actor::behavior_type write_tracker(write_tracker_actor::stateful_pointer<write_tracker_state> self,
                                                 std::shared_ptr<store_writes> writes) {
  self->set_exit_handler([self](caf::exit_msg& msg) { self->quit(msg.reason); });  // ends with its owner, also normally
  return {
    [=](written_atom) { answer_drained(self->state, *writes); },
    [=](drained_atom, std::uint64_t issued) -> caf::result<caf::ok_atom> {
      if (writes->done >= issued) return caf::ok_atom::value;
      auto rp = self->make_response_promise<caf::ok_atom>();
      self->state.waiting.emplace(issued, rp);
      // Said before done is read again: a signal that comes between either sees it and
      // tells, or its count is in what is read here (both are sequentially consistent).
      writes->awaited = true;
      answer_drained(self->state, *writes);
      return rp;
    },
  };
}

std::shared_ptr<const void> written_signal(const write_tracker_actor& tracker, std::shared_ptr<store_writes> writes) {
  return std::shared_ptr<const void>(nullptr, [tracker, writes](const void*) {
    ++writes->done;
    if (writes->awaited) caf::anon_send(tracker, written_atom::value);
  });
}

}  // namespace ps
