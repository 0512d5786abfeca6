#pragma once
// The client actor's inside, shared by its files (actors/client/): the requests a caller
// plans, the client's record per shard and its state, and the functions each concern
// offers the others. Not part of the public API: kv_client.hpp is.
#include "actors/transport.hpp"
#include "actors/write_batch.hpp"
#include "actors/inline_runner.hpp"
#include "actors/kv_client.hpp"
#include "libps/core/client_core.hpp"
#include "libps/core/consistency.hpp"
#include "libps/sim/faults.hpp"
#include "libps/observe/log.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

namespace ps {
namespace detail {

// One op, planned by the caller's thread, executed by the client actor (local only).
struct op_request {
  op_kind kind;
  request_header hdr;
  std::vector<chunk> chunks;
  // Per chunk (push/init). A block without storage is a chunk of scattered pieces of
  // source (from base on), gathered only if it cannot be written from there.
  std::vector<float_block> blocks;
  std::shared_ptr<std::vector<float>> source;
  std::size_t base = 0;
  std::vector<encoded_block> encoded;  // per chunk, instead of blocks: a compressed push
  // A pull whose result was made before its answers came (several chunks, or the
  // caller's buffer): each chunk's answer lands in or is copied to its part of it.
  bool in_place = false;
  // Such a pull's per-chunk data-plane peer whose answer may be read straight into
  // place (0: none). Set on the first send only, so at most one payload ever lands in
  // a chunk's part of the result.
  std::vector<std::uint64_t> landing;
  // A pull's per-chunk count of answers whose payload was lost and that were asked again.
  std::vector<std::uint8_t> payload_asks;
  std::shared_ptr<kv_op_state> op;
  // A push that ends an iteration: its last chunk to each shard carries the clock tick
  // (request_header::tick); shards it does not reach get a plain tick. 0: none.
  std::uint64_t then_tick = 0;
};

// One push or pull of rows of a table, planned by the caller's thread: per owning shard
// its distinct ids (and for a push their summed gradients), and for a pull where each
// answered row goes in the result (every position its id had in the request).
struct rows_request {
  op_kind kind;
  request_header hdr;
  std::uint32_t table = 0;
  std::uint32_t dim = 0;
  struct shard_rows {
    std::uint32_t shard = 0;
    row_ids rows;
    float_block grads;                                   // a push's
    std::vector<std::vector<std::uint32_t>> positions;  // a pull's, per row
  };
  std::vector<shard_rows> groups;
  std::shared_ptr<kv_op_state> op;
};


}  // namespace detail
}  // namespace ps

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<ps::detail::op_request>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<ps::detail::rows_request>)

namespace ps::client_internal {

using detail::op_request;
using detail::rows_request;

// One request to one shard: planned once, sent (and after a failover sent again) by `send`.
struct pending_request {
  std::uint64_t bytes = 0;
  std::shared_ptr<kv_op_state> op;
  // Issues the request to the shard's current handle; tag identifies this sending.
  std::function<void(std::uint64_t tag)> send;
  bool tick = false;  // a clock tick (with retries on, it waits for the requests before it)
  bool read = false;  // a pull (of keys or rows): answered by the chain's tail
  bool write = false; // a push, init or push of rows
  std::uint64_t plan_epoch = 0;  // the epoch of the map it was planned by
  // A read refused because its keys moved (errc::moved): plans it again by the newest map.
  std::function<void()> replan;
  std::uint32_t attempts = 0;
  std::chrono::steady_clock::time_point first_sent{};
  // The latest sending: when, and the id its answer comes with (a response id; the
  // client's own timeout delivers sec::request_timeout under it, see sweep_overdue).
  caf::actor_clock::time_point sent_at{};  // by the actor's clock (simulated in tests)
  caf::message_id answer_id{};
  // An answer is awaited under the request timeout (client_core::overdue).
  bool timed() const { return answer_id.is_response(); }
};

// Everything the client keeps about one shard: one record per shard.
struct shard_route {
  shard_link link;        // the shard's head (pushes, ticks)
  shard_actor tail;       // who answers pulls (the head without replication)
  shard_entry entry;      // the map's view of it (host, port, handle)
  std::string down;       // non-empty: why it is gone (its requests are in client_core's flow)
  std::uint64_t acked_tick = 0;   // highest clock tick it acknowledged
  std::uint64_t generation = 0;   // bumped per failover (stale timers ignore)
  bool abandoned = false;         // the coordinator said no replacement will come
  bool retired = false;           // it left the map (psctl remove-shard): nothing new goes to it
  bool idle_reported = false;     // ... and the coordinator knows this client is done with it
  std::optional<std::chrono::steady_clock::time_point> down_since;  // until the first pull after
  // Requests over the data connections (data_plane::proxy): stand-ins for head and tail,
  // taken when nothing was in flight, so no request overtakes one sent through CAF. A
  // stand-in is used while its address is the handle's (a failover replaces the handle).
  shard_actor direct_head{};
  shard_actor direct_tail{};
};

// Where requests to a route's head and tail go now: the stand-in over the data
// connection while it stands for the current handle, else CAF's handle.
inline const shard_actor& head_of(const shard_route& r) {
  return r.direct_head && r.direct_head.address() == r.link.handle.address() ? r.direct_head : r.link.handle;
}
inline const shard_actor& tail_of(const shard_route& r) {
  return r.direct_tail && r.direct_tail.address() == r.tail.address() ? r.direct_tail : r.tail;
}

struct client_state {
  std::vector<shard_route> routes;
  std::map<std::uint32_t, std::size_t> index;  // shard id -> position in routes
  // The requests per route (the same position), in flight and waiting, the fence and the
  // map's epoch: the client's decisions about them (libps/core/client_core.hpp).
  client_core<pending_request> core;
  std::uint64_t epoch = 1;
  std::uint32_t worker = 0;
  coordinator_actor coordinator;  // none: no failover, a dead shard fails its requests at once
  std::string coordinator_down;   // non-empty: the coordinator is gone (why); no failover can come
  // Barriers under way at the coordinator, by tag: failed at once if it is gone for good (a
  // request to a dead remote actor would wait for its whole timeout), sent again to a
  // coordinator that resumed the job. `attempt` tells a stale answer from the live one.
  struct pending_barrier {
    caf::typed_response_promise<std::uint64_t> promise;
    std::uint64_t generation = 0;
    std::chrono::milliseconds timeout{0};
    std::uint64_t attempt = 0;
  };
  std::map<std::uint64_t, pending_barrier> barriers;
  std::uint64_t next_barrier = 0;
  std::uint64_t barrier_generation = 0;  // this worker's next barrier's number
  // The worker's end, until the coordinator acknowledged it (sent again after a rejoin).
  struct pending_done {
    worker_result result;
    caf::typed_response_promise<caf::ok_atom> promise;
    std::uint64_t attempt = 0;
  };
  std::optional<pending_done> done;
  bool finished = false;  // the coordinator has the worker's end: shards may end with the job now
  reconnect_options reconnect;    // kv_client_options::reconnect
  caf::actor worker_handle;       // kv_client_options::worker_handle
  std::string coordinator_lost;   // non-empty while the coordinator is away (why it went down)
  std::chrono::milliseconds timeout;
  bool overdue_armed = false;  // a sweep for overdue requests is scheduled
  std::shared_ptr<kv_cluster_events> stats;
  // The map requests are planned by (shared with the caller's thread through stats; its
  // epoch is core.map_epoch()); requests planned by an older one may still be on their way.
  std::shared_ptr<const partitioner> map;
  // By op_kind (push, init, pull, clock): the options' chunk_bytes_of(kind), for requests
  // planned again.
  std::array<std::uint64_t, static_cast<std::size_t>(op_kind::clock) + 1> chunk_bytes{};
  std::function<void(const std::string&, std::uint16_t)> dial;  // kv_client_options::dial
  // The highest clock this worker has ticked (a shard that joins gets it first).
  std::uint64_t issued_tick = 0;
  // Reads refused as moved before the map that moved them arrived, by batch: planned
  // again when it arrives, failed when it does not come within the request timeout.
  std::map<std::uint64_t, std::vector<pending_request>> moved_reads;
  std::uint64_t next_moved_batch = 0;
  // Lost messages: a request unanswered after `retry` goes out again (same sequence
  // number, so copies apply it once); the fault injector's drop, duplicate and delay.
  std::chrono::milliseconds retry{0};
  std::optional<message_faults> faults;
  // Large blocks: this process's data plane, and the plane token of each shard copy's
  // process (0: asked and not known yet, or it has none).
  std::shared_ptr<transport> plane;
  std::map<caf::actor_addr, std::uint64_t> plane_peers;
  // Shard copies whose plane token or connection is still being asked for, and the callers
  // of kv_client::await_data_connections waiting for that set to empty.
  std::set<caf::actor_addr> plane_asking;
  std::vector<caf::typed_response_promise<std::uint64_t>> plane_waiters;
  // Pull payloads the claimer waits for, as (route, origin): when the route's shard goes
  // down, an origin that never connected is told gone, so they fail now, not at the claim
  // timeout.
  std::multiset<std::pair<std::size_t, std::uint64_t>> awaited_payloads;
  payload_claimer_actor claimer;    // claims answers' payloads without blocking this actor
  plane_connector_actor connector;  // connects on a thread of its own, where connecting blocks (none: in the handler)
  static inline const char* name = "kv_client";
};

// The client actor: what the coordinator may send (client_actor), and its own messages.
using client_impl = client_actor::extend<
  // The failover deadline of route idx (generation gen): no new map came; fail its requests.
  caf::reacts_to<failover_atom, std::uint64_t, std::uint64_t>,
  // A request the fault injector delayed leaves now (route, tag).
  caf::reacts_to<send_atom, std::uint64_t, std::uint64_t>,
  // A request unanswered for --ps.retry-ms goes out again (route, tag).
  caf::reacts_to<resend_atom, std::uint64_t, std::uint64_t>,
  // Time to look for requests unanswered for the request timeout (sweep_overdue).
  caf::reacts_to<overdue_atom>,
  // From the caller's thread: a clock tick to every shard, and a planned push/init/pull.
  caf::reacts_to<clock_atom, std::shared_ptr<op_request>>,
  caf::reacts_to<dispatch_atom, std::shared_ptr<op_request>>,
  // From the caller's thread: a planned push or pull of rows.
  caf::reacts_to<dispatch_atom, std::shared_ptr<rows_request>>,
  // Reads refused as moved (batch) whose new map did not come in time: they fail.
  caf::reacts_to<handoff_atom, std::uint64_t>,
  // From the caller's thread: worker w's barrier at the coordinator (timeout in ms).
  caf::replies_to<barrier_atom, std::uint32_t, std::uint64_t>::with<std::uint64_t>,
  // From the caller's thread: a progress line, and the worker's end (answered once the
  // coordinator has it).
  caf::reacts_to<report_atom, std::string>,
  caf::replies_to<done_atom, worker_result>::with<caf::ok_atom>,
  // From the dialer (actors/reconnect.hpp): a coordinator answers at the old address again,
  // or none did in time (why).
  caf::reacts_to<rejoin_atom, caf::actor>,
  caf::reacts_to<rejoin_atom, std::string>,
  // From the caller's thread: answered once no data connection is still being set up, with
  // the number of shard copies connected (kv_client::await_data_connections).
  caf::replies_to<data_atom>::with<std::uint64_t>>;
// A burst of requests (and clock ticks) to one shard leaves in one write (write_batch).
using client_ptr = batched_writes<caf::stateful_actor<client_state, client_impl::base>>*;

void launch(client_ptr self, std::size_t idx, pending_request r);

// A request to a shard for sending `tag` of route idx: no CAF timeout (sweep_overdue), its
// answer's id noted.
template <class... Ts>
auto ask_shard(client_ptr self, std::size_t idx, std::uint64_t tag, const shard_actor& to, Ts&&... xs) {
  auto handle = self->request(to, caf::infinite, std::forward<Ts>(xs)...);
  const auto& route = self->state.routes[idx];
  auto* target = caf::actor_cast<caf::abstract_actor*>(to);
  if (target != caf::actor_cast<caf::abstract_actor*>(route.direct_head) &&
      target != caf::actor_cast<caf::abstract_actor*>(route.direct_tail))
    self->state.stats->caf_requests.fetch_add(1, std::memory_order_relaxed);
  auto& sent = self->state.core.at(idx).sent;
  if (auto it = sent.find(tag); it != sent.end()) it->second.answer_id = handle.id();
  return handle;
}

// ---- requests.cpp: sending requests to shards (flow control, the fence, timeouts, the data-connection path)

const char* names_of(op_kind k);
std::string describe_keys(const key_range& first, const key_range& last, std::size_t n);
std::string describe_keys(const chunk& c);
std::uint64_t next_sequence();
void lift_fence(client_ptr self);
void report_if_idle(client_ptr self, std::size_t idx);
bool crowded_over_tcp(const client_state& st, const shard_route& route);
void add_flow(client_state& st, shard_route r);
void pump(client_ptr self, std::size_t idx);
void submit(client_ptr self, std::size_t idx, pending_request r);
void arm_overdue_sweep(client_ptr self, caf::actor_clock::time_point due);
void answer_with_error(client_ptr self, caf::message_id id, caf::sec err);
void sweep_overdue(client_ptr self);
void transmit(client_ptr self, std::size_t idx, std::uint64_t tag);
void go_direct(client_ptr self, std::size_t idx);
void send_again_through_caf(client_ptr self, std::size_t idx, std::uint64_t tag);
void launch(client_ptr self, std::size_t idx, pending_request r);
bool settle(client_ptr self, std::size_t idx, std::uint64_t tag);
std::uint64_t plane_peers_connected(const client_state& st);
void plane_peer_settled(client_ptr self, const caf::actor_addr& addr, std::uint64_t peer);
std::uint64_t plane_peer(client_ptr self, const shard_actor& target);
void chunk_answered(kv_op_state* op);
std::string why_failed(client_ptr self, const shard_link& link, const caf::error& err);
void plane_connect_early(client_ptr self, std::size_t idx);

// ---- failover.cpp: shards down, map changes, moved reads

void read_moved(client_ptr self, std::size_t idx, std::uint64_t tag);
void request_failed(client_ptr self, std::size_t idx, std::uint64_t tag, const caf::error& err,
                    const std::string& what);
std::deque<pending_request> take_pending(client_ptr self, std::size_t idx);
void fail_all(client_ptr self, std::size_t idx, const std::string& reason, bool ticks_done = false);
void abandon_for_coordinator(client_ptr self, std::size_t i);
// expected: a normal end of an idle route's shard (the job's end), told at info level only.
void shard_down(client_ptr self, std::size_t i, const std::string& reason, bool expected = false);
pending_request clock_request(client_ptr self, std::size_t idx, request_header hdr, std::shared_ptr<kv_op_state> op);
void add_route(client_ptr self, const shard_entry& e, std::uint64_t epoch);
void catch_up(client_ptr self, std::size_t idx, std::uint64_t epoch);
void take_new_map(client_ptr self, const cluster_view& view);
bool same_shards(const partitioner& map, const cluster_view& view);
void apply_view(client_ptr self, const cluster_view& view);
bool reroute_retired(client_ptr self, std::size_t idx);
void peer_down(client_ptr self, const caf::down_msg& dm);
void expire_moved_reads(client_ptr self, std::uint64_t batch);

// ---- chunks.cpp: pushes, pulls and inits by chunks

std::uint64_t count_keys_of(const std::vector<chunk>& chunks);
std::map<std::size_t, std::size_t> last_chunks(client_ptr self, const op_request& req,
                                               std::vector<std::size_t>& untouched);
void queue_chunk(client_ptr self, const std::shared_ptr<op_request>& req, std::size_t c, bool ticks);
std::vector<piece> pieces_by_map(const client_state& st, const std::vector<chunk>& chunks);
void replan_request(client_ptr self, op_request& req);
void dispatch(client_ptr self, const std::shared_ptr<op_request>& req);

// ---- rows.cpp: pushes and pulls of sparse rows

void rows_landed(const std::shared_ptr<rows_request>& req, std::size_t g, const std::string& from,
                 const float_block& values);
void send_rows(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g, std::size_t idx,
               request_header h, std::uint64_t tag);
void queue_group(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g);
void regroup_rows(client_state& st, rows_request& req);
void dispatch_rows(client_ptr self, const std::shared_ptr<rows_request>& req);
void replan_rows(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g);

// ---- coordination.cpp: the coordinator (barriers, the worker's end, rejoining)

void coordinator_gone(client_ptr self, const std::string& why);
void send_barrier(client_ptr self, std::uint64_t tag);
caf::result<std::uint64_t> barrier(client_ptr self, std::chrono::milliseconds timeout);
void send_done(client_ptr self);
caf::result<caf::ok_atom> finish_worker(client_ptr self, worker_result& result);
void coordinator_down(client_ptr self, const caf::error& reason);
void rejoin(client_ptr self, coordinator_actor coordinator);
void set_live_workers(client_ptr self, std::vector<std::uint32_t> live);

// ---- client_actor.cpp: the actor's state and behaviour

void init_client(client_ptr self, std::vector<shard_link> shards, std::vector<shard_entry> entries,
                 const kv_client_options& opts, std::uint64_t epoch, std::shared_ptr<kv_cluster_events> stats);
void resend(client_ptr self, std::uint64_t idx, std::uint64_t tag);
caf::result<std::uint64_t> answer_when_connected(client_ptr self);
client_impl::behavior_type kv_client_actor(client_ptr self, std::vector<shard_link> shards, std::vector<shard_entry> entries,
                              kv_client_options opts, std::uint64_t epoch, std::shared_ptr<kv_cluster_events> stats);

}  // namespace ps::client_internal
