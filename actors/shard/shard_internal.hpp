#pragma once
// The shard actor's inside, shared by its files (actors/shard/): the actor's pointer, the
// kinds of writes and forwards, and the functions each concern offers the others. The
// state is shard_state (actors/server_shard.hpp); the decisions are shard_core's. Not part
// of the public API.
#include "actors/server_shard.hpp"
#include "libps/observe/log.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <span>

#include "libps/persist/checkpoint.hpp"
#include "libps/core/codec.hpp"
#include "libps/core/handoff.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/observe/text.hpp"

#include <nlohmann/json.hpp>

namespace ps::shard_internal {

using self_ptr = shard_impl*;
using ack_promise = caf::typed_response_promise<std::uint64_t>;

enum class write_kind { push, init, rows };

using owner_request =
  std::function<void(const shard_actor& head, std::function<void()> ok, std::function<void(caf::error&)> failed)>;

using apply_values = std::function<caf::result<std::uint64_t>(const float_block&, std::optional<ack_promise>)>;

// ---- reads.cpp

shard_request request_of(const request_header& h);
float_block pull_values(self_ptr self, const shard_options& opts, const request_header& hdr,
                        const std::vector<key_range>& ranges);
void settle(ack_promise rp, const caf::result<std::uint64_t>& r);
float_block row_values(shard_core& core, std::uint64_t token);
void answer_pull(self_ptr self, const shard_options& opts, std::uint64_t token);
void await_store_writes(self_ptr self);
caf::error refusal(self_ptr self, const request_header& hdr, const std::string& why);
caf::result<std::uint64_t> tick(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                const request_header& hdr);
encoded_block block_of(const std::string& bytes);
bool in_own_map(const shard_core& core);

// ---- disk.cpp

void disk_failed(self_ptr self, const caf::error& e);
void send_disk_work(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, shard_effects& fx);
void read_from_disk(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                    std::shared_ptr<const std::vector<row_key>> keys);
void send_checkpoint_part(self_ptr self, std::uint64_t clock);
void carry_out(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, shard_effects& fx);
void schedule_sweep(self_ptr self, const shard_options& opts);
void drop_from_disk(self_ptr self, std::vector<disk_move> drops);

// ---- writes.cpp

void send_write(self_ptr self, const shard_options& opts, const shard_actor& to, write_kind kind,
                const request_header& hdr, const deferred_update& u, const float_block& values,
                std::function<void()> ok, std::function<void(caf::error&)> failed);
void send_to_owner(self_ptr self, std::uint32_t owner, owner_request request, std::function<void(caf::error)> done,
                   std::uint64_t id = 0);
void send_again_to_new_heads(self_ptr self);
bool dial_owner(self_ptr self, std::uint32_t owner, std::function<void(shard_actor)> then);
// Whether two handles name the same actor (a dial may hand back another proxy of it).
inline bool same_actor(const shard_actor& a, const shard_actor& b) { return a.node() == b.node() && a.id() == b.id(); }
void apply_own_part(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, write_kind kind,
                    const request_header& hdr, deferred_update u, std::function<void(caf::error)> done);
caf::result<std::uint64_t> forward_stale(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                         write_kind kind, const request_header& hdr,
                                         std::map<std::uint32_t, deferred_update> parts, std::optional<ack_promise> made);
void release_forwards(self_ptr self);
caf::result<std::uint64_t> apply_write(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                       bool is_push, const request_header& hdr, const range_list& ranges,
                                       const float_block& values, std::optional<ack_promise> made = std::nullopt);
caf::result<std::uint64_t> claim_then(self_ptr self, const shard_options& opts, const char* what,
                                      const request_header& hdr, const float_block& sent, apply_values apply);
caf::result<std::uint64_t> write(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                 bool is_push, const request_header& hdr, const range_list& ranges,
                                 const float_block& sent);
caf::result<std::uint64_t> write_rows(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                      const request_header& hdr, const row_ids& rows, const float_block& sent);
caf::result<std::uint64_t> write_encoded(self_ptr self, const shard_options& opts,
                                         const coordinator_actor& coordinator, const request_header& hdr,
                                         const range_list& ranges, const encoded_block& data);

// ---- chain.cpp

void drop_unannounced_copy(self_ptr self, const caf::error& err);
void forwarded(self_ptr self, std::uint64_t tag, const caf::error& err);
void send_down(self_ptr self, shard_state::forward f);
caf::result<std::uint64_t> pass_down(self_ptr self, std::function<void(shard_actor, std::uint64_t)> send,
                                     std::uint64_t value, std::optional<ack_promise> made);
void follow(self_ptr self, const shard_actor& next);
void start_replica(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator);
void start_replacement(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator);
caf::actor host_copy(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, registration reg,
                     std::uint32_t position);
void finish_seed(self_ptr self, const shard_options& opts, const shard_actor& copy, const encoded_block& seed,
                 caf::typed_response_promise<std::uint64_t> rp);
void seed_changed_rows(self_ptr self, std::shared_ptr<std::vector<disk_move>> moves, std::size_t at,
                       std::function<void(const shard_handoff&)> send, std::function<void()> done);
caf::result<std::uint64_t> extend_chain(self_ptr self, const shard_options& opts, const caf::actor& next);
caf::actor spawn_replacement(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                             shard_options::replacement what);

// ---- setup.cpp

std::uint64_t take_view(self_ptr self, const cluster_view& view);
shard_snapshot restored_state(const registration& reg);
shard_config config_of(const registration& reg, const shard_options& opts, const std::string& name,
                       shard_snapshot state);
void ends_with(self_ptr self, const caf::actor& copy);
void spawn_replicas(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                    const registration& reg, const std::string& seed);
bool configure(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
               const registration& reg);
caf::result<std::uint64_t> fill(self_ptr self, std::uint32_t table, std::uint64_t count);
std::string stats_json(const shard_state& st);
void start_server(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, std::uint16_t port);
void coordinator_down(self_ptr self, const shard_options& opts, const caf::error& reason);
void rejoin(self_ptr self, const shard_options& opts, coordinator_actor coordinator);
void coordinator_gone(self_ptr self, const shard_options& opts, const std::string& why);
bool worker_request(caf::message_id mid, const caf::message& msg);
void start_shard(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator);
caf::result<std::uint64_t> join(self_ptr self, std::uint32_t worker);
caf::result<std::string> stats(self_ptr self);

// ---- handoff.cpp

std::function<void(shard_actor, std::uint64_t)> handoff_sender(self_ptr self, const shard_options& opts,
                                                               const cluster_view& view);
void forget_kept(self_ptr self);
caf::result<std::uint64_t> adopt_as_copy(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                         const cluster_view& view);
caf::result<std::uint64_t> start_handoff(self_ptr self, const cluster_view& view, std::vector<shard_handoff> parts,
                                         std::vector<disk_move> moves, std::vector<disk_move> drops = {});
caf::result<std::uint64_t> hand_off_again(self_ptr self, const cluster_view& view);
caf::result<std::uint64_t> die_in_handoff(self_ptr self, const shard_options& opts, const cluster_view& view);
caf::result<std::uint64_t> copy_ahead(self_ptr self, const shard_options& opts, const cluster_view& view);
bool copies_ahead(const shard_state& st, const shard_options& opts, const cluster_view& view);
caf::result<std::uint64_t> hand_off(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                    const cluster_view& view);
caf::result<std::uint64_t> take_over(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                     const encoded_block& block);
std::uint64_t cut_at(self_ptr self, std::uint64_t boundary);
void sweep(self_ptr self, const shard_options& opts);

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


// Hands an event to the core, once configured, and carries out its effects.
template <class Event>
void feed(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, Event event) {
  if (!self->state.core) return;
  auto fx = event(*self->state.core);
  if (fx.ok()) carry_out(self, opts, coordinator, fx);
}

}  // namespace ps::shard_internal
