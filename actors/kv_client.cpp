#include "actors/kv_client.hpp"
#include "actors/inline_runner.hpp"
#include "libps/log.hpp"

#include "libps/consistency.hpp"
#include "libps/faults.hpp"

#include <array>
#include <atomic>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

namespace ps {

// ---- kv_op_state / kv_future -------------------------------------------------------

bool kv_op_state::done_flag() { return done.is_set(); }

void kv_op_state::finish(std::string err) {
  std::function<void()> next;
  {
    std::lock_guard<std::mutex> guard(mtx);
    if (done.is_set()) return;
    if (latency && err.empty())
      latency->record(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started).count());
    error = std::move(err);
    next = std::move(continuation);
    done.set([this] { return shared_from_this(); });  // under mtx: then() registers a continuation or runs it, never neither
  }
  if (next) next();
}

bool kv_future::ready() const { return st_->done.is_set(); }

namespace {

// The write batch of a thread that runs the client actor for its own requests
// (dispatch_here): what it sends may linger until the thread waits for an answer.
write_batch& callers_batch() {
  static thread_local write_batch batch(true);
  return batch;
}

// This thread is about to block: the requests it made and left lingering go first.
void send_before_blocking() { callers_batch().flush_lingering(); }

}  // namespace

void kv_future::wait() const {
  if (st_->done.is_set()) return;
  send_before_blocking();
  st_->done.wait();
}

bool kv_future::wait_for(std::chrono::milliseconds d) const {
  if (st_->done.is_set()) return true;
  send_before_blocking();
  return st_->done.wait_for(d);
}

std::string kv_future::error() const {
  wait();
  return st_->error;
}

std::vector<float> kv_future::get() {
  wait();
  if (!st_->error.empty()) throw kv_error(st_->error);
  return std::move(st_->values);
}

void kv_future::then(std::function<void(kv_future)> f) {
  auto self = *this;
  {
    std::lock_guard<std::mutex> guard(st_->mtx);
    if (!st_->done.is_set()) {
      st_->continuation = [f = std::move(f), self] { f(self); };
      return;
    }
  }
  f(self);
}

// ---- the client actor -----------------------------------------------------------

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

namespace ps {
namespace {

using detail::op_request;
using detail::rows_request;

const char* names_of(op_kind k) {
  static const char* names[] = {"push", "init", "pull", "clock"};
  return names[static_cast<int>(k)];
}

std::string describe_keys(const key_range& first, const key_range& last, std::size_t n) {
  std::string s = "keys " + to_string(first);
  if (n > 1) s += " .. " + to_string(last) + " (" + std::to_string(n) + " ranges)";
  return s;
}

std::string describe_keys(const chunk& c) {
  return describe_keys(c.pieces.front().keys, c.pieces.back().keys, c.pieces.size());
}

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
};

// Everything the client keeps about one shard: one record per shard.
struct shard_route {
  shard_link link;        // the shard's head (pushes, ticks)
  shard_actor tail;       // who answers pulls (the head without replication)
  shard_entry entry;      // the map's view of it (host, port, handle)
  std::string down;       // non-empty: why it is gone
  // Requests sent and not yet answered, by tag (send order), and requests waiting for the
  // in-flight budget or for a failover, in order.
  std::map<std::uint64_t, pending_request> sent;
  std::deque<pending_request> queued;
  std::uint64_t inflight_bytes = 0;
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
const shard_actor& head_of(const shard_route& r) {
  return r.direct_head && r.direct_head.address() == r.link.handle.address() ? r.direct_head : r.link.handle;
}
const shard_actor& tail_of(const shard_route& r) {
  return r.direct_tail && r.direct_tail.address() == r.tail.address() ? r.direct_tail : r.tail;
}

struct client_state {
  std::vector<shard_route> routes;
  std::map<std::uint32_t, std::size_t> index;  // shard id -> position in routes
  std::uint64_t next_tag = 0;
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
  // Flow control per shard: CAF's broker buffers every queued message in one growing
  // buffer and shifts it after each partial write, so hundreds of MB queued on one
  // connection cost quadratic copying (window 8 x 16 MiB ran 4x slower than window 1).
  // Chunks beyond inflight_limit bytes wait here instead.
  std::uint64_t inflight_limit = 0;
  std::uint64_t crowded_inflight_limit = 0;  // instead, on a crowded host, when smaller
  std::shared_ptr<kv_cluster_events> stats;
  // The map requests are planned by (shared with the caller's thread through stats) and
  // its epoch; requests planned by an older one may still be on their way.
  std::shared_ptr<const partitioner> map;
  std::uint64_t map_epoch = 0;
  // By op_kind (push, init, pull, clock): the options' chunk_bytes_of(kind), for requests
  // planned again.
  std::array<std::uint64_t, static_cast<std::size_t>(op_kind::clock) + 1> chunk_bytes{};
  std::function<void(const std::string&, std::uint16_t)> dial;  // kv_client_options::dial
  // The highest clock this worker has ticked (a shard that joins gets it first).
  std::uint64_t issued_tick = 0;
  // After a map change: while writes planned by an older map are unacknowledged (a shard
  // passes their moved part on to the new owner), reads and ticks planned by the new map
  // wait, so a new owner never counts a clock, or answers a read, before those updates.
  bool fence = false;
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
  std::shared_ptr<data_plane> plane;
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
  plane_connector_actor connector;  // connects to planes on a thread of its own
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

// Sequence numbers of pushes: unique in this process (so two clients of one worker id,
// as in tests, never collide), increasing per client.
std::uint64_t next_sequence() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1);
}

// With a chain, pushes go to the head and pulls to the tail: a pull sent while one of this
// worker's updates is still on its way down the chain could be answered without it (its
// own write missed; found by `sim`). So a pull waits until the updates before it are
// acknowledged, which happens once the tail has applied them.
bool read_would_overtake(const shard_route& r) {
  if (!r.queued.front().read || r.tail.address() == r.link.handle.address()) return false;
  return std::any_of(r.sent.begin(), r.sent.end(), [](const auto& kv) { return !kv.second.read; });
}

bool writes_in_flight(const shard_route& r) {
  return std::any_of(r.sent.begin(), r.sent.end(), [](const auto& kv) { return kv.second.write; });
}

// Whether a write planned by an older map than the client's is still unacknowledged.
bool stale_writes_outstanding(const client_state& st) {
  auto stale = [&](const pending_request& r) { return r.write && r.plan_epoch < st.map_epoch; };
  for (const auto& route : st.routes) {
    for (const auto& [tag, r] : route.sent)
      if (stale(r)) return true;
    if (std::any_of(route.queued.begin(), route.queued.end(), stale)) return true;
  }
  return false;
}

// Reads and ticks planned by the newest map wait behind the fence (client_state::fence).
// Older ones never do: writes they follow may be queued behind them.
bool held_by_fence(const client_state& st, const pending_request& r) {
  return st.fence && (r.read || r.tick) && r.plan_epoch >= st.map_epoch && stale_writes_outstanding(st);
}

void pump(client_ptr self, std::size_t idx);

// A write settled while the fence stood: once no stale write is left, everything held moves.
void lift_fence(client_ptr self) {
  auto& st = self->state;
  if (!st.fence || stale_writes_outstanding(st)) return;
  st.fence = false;
  for (std::size_t i = 0; i < st.routes.size(); ++i) pump(self, i);
}

// A shard that left the map: once this client has nothing left for it, the coordinator
// hears so (it stops the shard when every client has).
void report_if_idle(client_ptr self, std::size_t idx) {
  auto& st = self->state;
  auto& route = st.routes[idx];
  if (!route.retired || route.idle_reported || !route.sent.empty() || !route.queued.empty() || !st.coordinator) return;
  route.idle_reported = true;
  self->send(st.coordinator, idle_atom::value, route.link.id, st.worker);
}

// Whether route's requests are held to the smaller budget of a crowded host: its payloads
// go over TCP, whose bytes in flight on a crowded host cost cache misses and add no overlap
// (libps/host_share.hpp). A shared-memory ring keeps its own room and is not held to it.
bool crowded_over_tcp(const client_state& st, const shard_route& route) {
  if (!st.plane || !st.plane->host_crowded()) return false;
  auto it = st.plane_peers.find(caf::actor_cast<caf::actor_addr>(head_of(route)));
  return it == st.plane_peers.end() || it->second == 0 || !st.plane->sends_by_ring(it->second);
}

// Sends queued requests while the shard is up and its in-flight budget allows (always
// one when nothing is in flight). Requests to a shard leave in the order they were made
// (read-my-writes and clock ticks depend on it).
void pump(client_ptr self, std::size_t idx) {
  auto& st = self->state;
  while (!st.routes[idx].queued.empty() && st.routes[idx].down.empty()) {
    // With retries a request may be lost and sent again later: a tick must not overtake
    // the pushes before it, so it waits until they are acknowledged. Not for reads: a
    // read parked at the shard may wait for this very tick (found by `sim --elastic`).
    if (st.retry.count() > 0 && st.routes[idx].queued.front().tick && writes_in_flight(st.routes[idx])) return;
    if (read_would_overtake(st.routes[idx])) return;
    if (held_by_fence(st, st.routes[idx].queued.front())) return;
    const auto& route = st.routes[idx];
    const auto after = route.inflight_bytes + route.queued.front().bytes;
    if (route.inflight_bytes > 0 &&
        (after > st.inflight_limit || (after > st.crowded_inflight_limit && crowded_over_tcp(st, route))))
      return;
    auto r = std::move(st.routes[idx].queued.front());
    st.routes[idx].queued.pop_front();
    launch(self, idx, std::move(r));
  }
}

void submit(client_ptr self, std::size_t idx, pending_request r) {
  auto& st = self->state;
  if (!st.routes[idx].down.empty() && (!st.coordinator || st.routes[idx].abandoned)) {  // no replacement can come
    r.op->finish(r.op->what + " failed: " + st.routes[idx].down);
    return;
  }
  st.routes[idx].queued.push_back(std::move(r));
  pump(self, idx);
}

// Requests to shards carry no timeout of CAF's own: CAF 0.17 hands every one to its clock
// thread and wakes it, once per request (5-6% of the CPU at window 8, and 20% more small
// requests a second without it, BENCHMARKS.md). The client keeps one timer instead, due when its oldest unanswered
// request is (requests are sent in order, so a later one is never due sooner), and a
// request unanswered for the timeout gets sec::request_timeout under its answer's id, as
// CAF's timeout would deliver it.
void arm_overdue_sweep(client_ptr self, caf::actor_clock::time_point due) {
  auto& st = self->state;
  if (st.overdue_armed) return;
  st.overdue_armed = true;
  self->delayed_send(self, std::max(due - self->clock().now(), caf::actor_clock::duration_type{0}),
                     overdue_atom::value);
}

// Delivers err as the answer to the request whose response id is `id`: its handler runs
// (with no CAF timeout, the only way a request to a dead remote peer ends: CAF 0.17 never fails it by itself)
// and CAF lets go of it.
void answer_with_error(client_ptr self, caf::message_id id, caf::sec err) {
  self->enqueue(caf::make_mailbox_element(nullptr, id, {}, caf::make_error(err)), self->context());
}

void sweep_overdue(client_ptr self) {
  auto& st = self->state;
  st.overdue_armed = false;
  const auto now = self->clock().now();
  std::optional<caf::actor_clock::time_point> next;
  std::vector<caf::message_id> overdue;
  for (auto& route : st.routes)
    for (auto& [tag, r] : route.sent) {
      if (!r.answer_id.is_response()) continue;  // not sent yet, or its handler had its timeout
      if (now - r.sent_at < st.timeout) {
        next = std::min(next.value_or(r.sent_at), r.sent_at);
        continue;
      }
      overdue.push_back(r.answer_id);
      r.answer_id = caf::message_id{};  // a request kept for a failover is not timed out again
    }
  for (auto id : overdue) answer_with_error(self, id, caf::sec::request_timeout);
  if (next) arm_overdue_sweep(self, *next + st.timeout);
}

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
  auto& sent = self->state.routes[idx].sent;
  if (auto it = sent.find(tag); it != sent.end()) it->second.answer_id = handle.id();
  return handle;
}

// Puts request `tag` on the wire, through the fault injector's message faults if any.
void transmit(client_ptr self, std::size_t idx, std::uint64_t tag) {
  auto& st = self->state;
  auto it = st.routes[idx].sent.find(tag);
  if (it == st.routes[idx].sent.end()) return;
  auto send = it->second.send;
  it->second.sent_at = self->clock().now();
  arm_overdue_sweep(self, it->second.sent_at + st.timeout);
  message_faults::verdict v;
  if (st.faults) v = st.faults->next();
  if (st.retry.count() > 0)
    self->delayed_send(self, st.retry + std::chrono::milliseconds(v.delay_ms), resend_atom::value,
                       static_cast<std::uint64_t>(idx), tag);
  if (v.drop) return;  // lost on the way: the retry timer sends it again
  if (v.delay_ms > 0) {
    self->delayed_send(self, std::chrono::milliseconds(v.delay_ms), send_atom::value,
                       static_cast<std::uint64_t>(idx), tag);
    return;
  }
  send(tag);
  if (v.duplicate) send(tag);  // the copies drop the second; its reply finds the tag settled
}

std::uint64_t plane_peer(client_ptr self, const shard_actor& target);

// With nothing in flight to shard idx, its requests may move to the data connections
// (to a copy whose process is connected and takes messages), or back to CAF.
void go_direct(client_ptr self, std::size_t idx) {
  auto& st = self->state;
  auto& r = st.routes[idx];
  if (!st.plane || !st.plane->messages_enabled()) return;
  auto stand_in = [&](const shard_actor& target) {
    auto peer = plane_peer(self, target);
    return peer ? caf::actor_cast<shard_actor>(st.plane->proxy(peer, target->id(), target->node())) : shard_actor{};
  };
  r.direct_head = r.link.handle ? stand_in(r.link.handle) : shard_actor{};
  r.direct_tail = r.tail ? stand_in(r.tail) : shard_actor{};
}

// The request's data connection ended before its answer came: it goes again through CAF
// (with its sequence number, so a copy that had it applies it once), and so do the
// route's next requests until it is idle again.
void send_again_through_caf(client_ptr self, std::size_t idx, std::uint64_t tag) {
  auto& route = self->state.routes[idx];
  route.direct_head = shard_actor{};
  route.direct_tail = shard_actor{};
  auto it = route.sent.find(tag);
  auto r = std::move(it->second);
  route.inflight_bytes -= r.bytes;
  route.sent.erase(it);
  launch(self, idx, std::move(r));
}

void launch(client_ptr self, std::size_t idx, pending_request r) {
  auto& st = self->state;
  if (r.op->done_flag()) return;  // failed meanwhile (another chunk, a dead shard): skip
  if (st.routes[idx].sent.empty()) go_direct(self, idx);
  auto tag = ++st.next_tag;
  st.routes[idx].inflight_bytes += r.bytes;
  if (r.attempts++ == 0) r.first_sent = std::chrono::steady_clock::now();
  st.routes[idx].sent.emplace(tag, std::move(r));
  transmit(self, idx, tag);
}

// The answer to request `tag` arrived: false if it is stale (the request was sent again
// after a failover, or already failed), so the caller ignores it.
bool settle(client_ptr self, std::size_t idx, std::uint64_t tag) {
  auto& st = self->state;
  auto it = st.routes[idx].sent.find(tag);
  if (it == st.routes[idx].sent.end()) return false;
  if (st.faults && st.faults->next().drop) return false;  // the reply was lost: the retry comes
  st.routes[idx].inflight_bytes -= it->second.bytes;
  bool write = it->second.write;
  st.routes[idx].sent.erase(it);
  pump(self, idx);
  if (write) lift_fence(self);
  report_if_idle(self, idx);
  return true;
}

// Shard copies whose data connection is up.
std::uint64_t plane_peers_connected(const client_state& st) {
  return static_cast<std::uint64_t>(
    std::count_if(st.plane_peers.begin(), st.plane_peers.end(), [](const auto& p) { return p.second != 0; }));
}

// The data connection to the process at addr is up (peer != 0) or will not come (0):
// callers waiting for every connection's outcome are answered once none is pending.
void plane_peer_settled(client_ptr self, const caf::actor_addr& addr, std::uint64_t peer) {
  auto& st = self->state;
  if (peer != 0) st.plane_peers[addr] = peer;
  st.plane_asking.erase(addr);
  if (!st.plane_asking.empty()) return;
  auto connected = plane_peers_connected(st);
  for (auto& waiter : st.plane_waiters) waiter.deliver(connected);
  st.plane_waiters.clear();
}

// The data plane token of the process that hosts `target` once it is connected; 0 until
// then (blocks go through CAF meanwhile) or when it has none. Asks the first time.
std::uint64_t plane_peer(client_ptr self, const shard_actor& target) {
  auto& st = self->state;
  if (!st.plane || !target) return 0;
  auto addr = caf::actor_cast<caf::actor_addr>(target);
  auto [it, fresh] = st.plane_peers.emplace(addr, 0);
  if (!fresh) return it->second;
  st.plane_asking.insert(addr);
  self->request(target, st.timeout, data_atom::value)
    .then(
      [=](const std::string& host, std::uint16_t port, std::uint64_t token) {
        if (port == 0 || token == 0) return plane_peer_settled(self, addr, 0);
        self->request(self->state.connector, caf::infinite, connect_atom::value, token, host, port)
          .then([=](std::uint64_t peer) { plane_peer_settled(self, addr, peer); },
                [=](caf::error& err) {
                  log_line(log_level::warning, "worker " + std::to_string(self->state.worker) + ": " +
                                                   describe(err) + "; its blocks go through CAF");
                  plane_peer_settled(self, addr, 0);
                });
      },
      [=](caf::error&) { plane_peer_settled(self, addr, 0); });  // gone: a failover brings a new handle, asked in turn
  return 0;
}

void chunk_answered(kv_op_state* op) {
  if (--op->pending == 0) op->finish({});
}

std::string why_failed(client_ptr self, const shard_link& link, const caf::error& err) {
  return err == caf::sec::request_timeout
           ? "no reply from " + link.name + " within " + std::to_string(self->state.timeout.count()) + " ms"
           : describe(err);
}

// A request failed. While its shard is down and a new map may come, it is kept to be
// sent again; otherwise its op fails with what went wrong.
void shard_down(client_ptr self, std::size_t i, const std::string& reason);

// A read refused because its keys moved: planned again by the newest map, or, when that
// map has not come yet, parked until it does (at most the request timeout).
void read_moved(client_ptr self, std::size_t idx, std::uint64_t tag) {
  auto& st = self->state;
  auto it = st.routes[idx].sent.find(tag);
  auto r = std::move(it->second);
  st.routes[idx].inflight_bytes -= r.bytes;
  st.routes[idx].sent.erase(it);
  pump(self, idx);
  report_if_idle(self, idx);
  if (st.map_epoch > r.plan_epoch) return r.replan();
  auto batch = st.next_moved_batch;
  if (st.moved_reads.empty() || st.moved_reads.rbegin()->first != batch) {
    batch = ++st.next_moved_batch;
    self->delayed_send(self, st.timeout, handoff_atom::value, batch);
  }
  st.moved_reads[batch].push_back(std::move(r));
}

void request_failed(client_ptr self, std::size_t idx, std::uint64_t tag, const caf::error& err,
                    const std::string& what) {
  auto& st = self->state;
  auto it = st.routes[idx].sent.find(tag);
  if (it == st.routes[idx].sent.end()) return;
  if (code_of(err) == errc::moved && it->second.replan) return read_moved(self, idx, tag);
  if (code_of(err) == errc::unsent) return send_again_through_caf(self, idx, tag);
  // Bounced by a copy that has ended (before its down message got here): the same news.
  if (err == caf::sec::request_receiver_down && st.routes[idx].down.empty() && !st.routes[idx].abandoned) {
    shard_down(self, idx, st.routes[idx].link.name + " is down (" + describe(err) + ")");
    it = st.routes[idx].sent.find(tag);  // shard_down may have failed it already (fail_all)
    if (it == st.routes[idx].sent.end()) return;
  }
  if (!st.routes[idx].down.empty() && st.coordinator && !st.routes[idx].abandoned) return;
  auto op = it->second.op;
  op->finish(what + " failed: " + why_failed(self, st.routes[idx].link, err));
  settle(self, idx, tag);
}

// Every request of a route, sent (in send order) then queued, taken out of it. The
// sendings taken are not answered under their tags any more: each one's CAF response
// handler is released with an error (else a dead shard's would be kept for good), which
// finds its tag gone and does nothing.
std::deque<pending_request> take_pending(client_ptr self, shard_route& route) {
  std::deque<pending_request> all;
  for (auto& [tag, r] : route.sent) {
    if (r.answer_id.is_response()) answer_with_error(self, r.answer_id, caf::sec::request_receiver_down);
    all.push_back(std::move(r));
  }
  for (auto& r : route.queued) all.push_back(std::move(r));
  route.sent.clear();
  route.queued.clear();
  route.inflight_bytes = 0;
  return all;
}

// Every request to shard idx (sent or queued) fails with `reason`; with ticks_done, its
// clock ticks count as done instead (a shard that left the map holds no keys: its clocks
// gate nothing).
void fail_all(client_ptr self, std::size_t idx, const std::string& reason, bool ticks_done = false) {
  auto& st = self->state;
  for (auto& r : take_pending(self, st.routes[idx])) {
    if (ticks_done && r.tick) chunk_answered(r.op.get());
    else r.op->finish(r.op->what + " failed: " + reason);
  }
  lift_fence(self);
  report_if_idle(self, idx);
}

// Shard i is gone. Without a coordinator its requests fail now. Otherwise they wait for
// the new map (requests to a dead shard never fail on their own in CAF 0.17), at most
// the request timeout.
// Route i's shard is down and the coordinator too: no new map can come, so its requests,
// and later ones, fail now.
void abandon_for_coordinator(client_ptr self, std::size_t i) {
  auto& route = self->state.routes[i];
  route.abandoned = true;
  route.down += "; " + self->state.coordinator_down + ": no replacement can come";
  fail_all(self, i, route.down);
}

void shard_down(client_ptr self, std::size_t i, const std::string& reason) {
  auto& st = self->state;
  st.routes[i].down = reason;
  for (auto it = st.awaited_payloads.lower_bound({i, 0}); it != st.awaited_payloads.end() && it->first == i; ++it)
    st.plane->origin_gone(it->second, reason);
  if (!st.coordinator_down.empty()) return abandon_for_coordinator(self, i);
  if (!st.coordinator) {
    fail_all(self, i, st.routes[i].down);
    return;
  }
  st.routes[i].down_since = std::chrono::steady_clock::now();
  log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": " + st.routes[i].down + "; waiting up to " +
                                   std::to_string(st.timeout.count()) + " ms for a replacement");
  self->delayed_send(self, st.timeout, failover_atom::value, static_cast<std::uint64_t>(i), st.routes[i].generation);
}

pending_request clock_request(client_ptr self, std::size_t idx, request_header hdr, std::shared_ptr<kv_op_state> op) {
  pending_request r;
  r.op = op;
  r.tick = true;
  r.plan_epoch = hdr.epoch;
  r.send = [=](std::uint64_t tag) {
    auto& st = self->state;
    ask_shard(self, idx, tag, head_of(st.routes[idx]), clock_atom::value, hdr)
      .then(
        [=](std::uint64_t) {
          if (!settle(self, idx, tag)) return;
          auto& a = self->state.routes[idx].acked_tick;
          a = std::max(a, hdr.clock);
          chunk_answered(op.get());
        },
        [=](caf::error& err) { request_failed(self, idx, tag, err, op->what); });
  };
  return r;
}

void plane_connect_early(client_ptr self, std::size_t idx);

// A shard the client has not known (it joined): a route to it.
void add_route(client_ptr self, const shard_entry& e, std::uint64_t epoch) {
  auto& st = self->state;
  shard_route r;
  auto where = e.host.empty() ? std::string() : e.host + ":" + std::to_string(e.port) + ", ";
  r.link = {e.id, "shard " + std::to_string(e.id) + " (" + where + "joined at epoch " + std::to_string(epoch) + ")",
            caf::actor_cast<shard_actor>(e.handle)};
  r.entry = e;
  r.tail = r.link.handle;
  st.routes.push_back(std::move(r));
  auto idx = st.routes.size() - 1;
  st.index[e.id] = idx;
  self->monitor(e.handle);
  plane_connect_early(self, idx);
  if (st.dial && !e.host.empty())
    self->spawn<caf::detached>([dial = st.dial, host = e.host, port = e.port] { dial(host, port); });
  std::lock_guard<std::mutex> lock(st.stats->mtx);
  st.stats->joined.push_back(st.routes[idx].link);
}

// A tick that brings a shard's clock for this worker up to date after a map change (a
// joined shard never had one; one that took keys took the givers' lower clocks too).
// Ticks are idempotent; the fence holds it until the older writes are acknowledged.
void catch_up(client_ptr self, std::size_t idx, std::uint64_t epoch) {
  auto& st = self->state;
  if (st.issued_tick == 0) return;
  auto op = std::make_shared<kv_op_state>();
  op->pending = 1;
  op->what = "clock tick to " + std::to_string(st.issued_tick) + " for " + st.routes[idx].link.name + " after a map change";
  submit(self, idx, clock_request(self, idx, request_header{epoch, st.worker, st.issued_tick, 0}, op));
}

bool reroute_retired(client_ptr self, std::size_t idx);

// A map whose shards differ from the client's (a shard joined): later requests are
// planned by it; reads refused as moved meanwhile are planned again.
void take_new_map(client_ptr self, const cluster_view& view) {
  auto& st = self->state;
  std::shared_ptr<const partitioner> next;
  try {
    next = std::make_shared<const partitioner>(map_of(view));
  } catch (const bad_request& e) {
    log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": a map of epoch " +
                                     std::to_string(view.epoch) + " is malformed (" + e.what() + "); ignored");
    return;
  }
  for (const auto& e : view.shards)
    if (!st.index.count(e.id) && !e.handle) {
      log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": shard " + std::to_string(e.id) +
                                       " joined without a handle; the map of epoch " + std::to_string(view.epoch) +
                                       " is ignored");
      return;
    }
  st.map = next;
  st.map_epoch = next->epoch();
  {
    std::lock_guard<std::mutex> lock(st.stats->mtx);
    st.stats->map = next;
  }
  st.stats->changed.notify_all();
  st.fence = true;
  for (const auto& e : view.shards)
    if (!st.index.count(e.id)) add_route(self, e, view.epoch);
  for (std::size_t idx = 0; idx < st.routes.size(); ++idx) {
    const auto id = st.routes[idx].link.id;
    st.routes[idx].retired = std::none_of(view.shards.begin(), view.shards.end(), [&](const shard_entry& e) { return e.id == id; });
    if (!st.routes[idx].retired) catch_up(self, idx, view.epoch);
    else if (st.routes[idx].down.empty() || st.routes[idx].abandoned || !reroute_retired(self, idx)) report_if_idle(self, idx);
  }
  auto parked = std::move(st.moved_reads);
  st.moved_reads.clear();
  for (auto& [batch, reads] : parked)
    for (auto& r : reads) r.replan();
  lift_fence(self);  // at once when no stale write is left
}

bool same_shards(const partitioner& map, const cluster_view& view) {
  if (map.shard_ids().size() != view.shards.size()) return false;
  for (std::size_t i = 0; i < view.shards.size(); ++i)
    if (map.shard_ids()[i] != view.shards[i].id) return false;
  return true;
}

// A new shard map: after a join, the new map (take_new_map); after a failover, shards
// with a new address get every request that was in flight to the old one again, in
// order, behind a tick that brings the new shard's clock for this worker up to date.
void apply_view(client_ptr self, const cluster_view& view) {
  auto& st = self->state;
  st.epoch = std::max(st.epoch, view.epoch);
  if (view.epoch > st.map_epoch && !same_shards(*st.map, view)) take_new_map(self, view);
  for (const auto& e : view.shards) {
    auto at = st.index.find(e.id);
    if (at == st.index.end()) continue;
    auto idx = at->second;
    auto& old = st.routes[idx].entry;
    if (e.since_epoch <= old.since_epoch) continue;  // not newer than what this client has
    auto head = !e.chain.empty() ? e.chain.front() : e.handle;
    auto tail = !e.chain.empty() ? e.chain.back() : head;
    bool moved = head ? head != caf::actor_cast<caf::actor>(st.routes[idx].link.handle) ||
                          tail != caf::actor_cast<caf::actor>(st.routes[idx].tail)
                      : (e.host != old.host || e.port != old.port);
    old.since_epoch = e.since_epoch;
    if (!moved) continue;
    if (!head) {  // a new address we would have to connect to: not produced by this coordinator
      fail_all(self, idx, st.routes[idx].link.name + " moved to " + e.host + ":" + std::to_string(e.port) +
                            ", which this client cannot reach without a handle");
      continue;
    }
    old = e;
    // Learning of the failure from the new map (before its own down message) counts as
    // learning of it: recovery time runs from here then.
    if (!st.routes[idx].down_since) st.routes[idx].down_since = std::chrono::steady_clock::now();
    st.routes[idx].link.handle = caf::actor_cast<shard_actor>(head);
    {
      std::lock_guard<std::mutex> lock(st.stats->mtx);
      st.stats->new_heads[e.id] = st.routes[idx].link.handle;
    }
    st.routes[idx].tail = caf::actor_cast<shard_actor>(tail);
    st.routes[idx].link.name = "shard " + std::to_string(e.id) + " (epoch " + std::to_string(view.epoch) + ")";
    self->monitor(head);
    if (tail != head) self->monitor(tail);
    ++st.routes[idx].generation;
    st.routes[idx].down.clear();
    std::deque<pending_request> again;
    if (st.routes[idx].acked_tick > 0) {
      auto op = std::make_shared<kv_op_state>();
      op->pending = 1;
      op->what = "clock tick to " + std::to_string(st.routes[idx].acked_tick) + " after failover";
      again.push_back(clock_request(self, idx, request_header{0, st.worker, st.routes[idx].acked_tick, 0}, op));
    }
    for (auto& r : take_pending(self, st.routes[idx])) again.push_back(std::move(r));
    st.routes[idx].queued = std::move(again);
    log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": " + st.routes[idx].link.name +
                                     " takes over; " + std::to_string(st.routes[idx].queued.size()) +
                                     " requests sent again");
    pump(self, idx);
  }
  for (std::size_t idx = 0; idx < st.routes.size(); ++idx)
    if (st.routes[idx].retired && !st.routes[idx].down.empty() && !st.routes[idx].abandoned) reroute_retired(self, idx);
}

// One chunk of a request on its way to shard idx: what every sending of it needs.
struct chunk_send {
  client_ptr self;
  std::shared_ptr<op_request> req;  // the chunk stays in req (kept alive here): read there, not copied
  std::size_t c;                    // the chunk's index in req
  std::size_t idx;                  // the shard's route
  request_header hdr;               // numbered once, for every sending
};

void request_failed(client_ptr self, std::size_t idx, std::uint64_t tag, const caf::error& err,
                    const std::string& what);

void pull_landed(const chunk_send& s, float_block& values);

// Before a pull chunk counts as answered or failed, nothing may still land in it. An
// answer that names its payload needs none once claimed: the claim ends when the payload
// landed, and a landing takes the expectation. Otherwise this waits for a landing under
// way, which only a failed or duplicate answer can meet (an answer that came inline has
// no payload to land).
void withdraw_landing(const chunk_send& s) {
  if (!s.req->landing.empty() && s.req->landing[s.c] != 0) s.self->state.plane->forget(s.req->landing[s.c], s.hdr.seq);
}

void queue_chunk(client_ptr self, const std::shared_ptr<op_request>& req, std::size_t c, bool ticks);

// How often one pull chunk is asked again for a payload that was lost.
constexpr std::uint8_t max_payload_asks = 2;

// A pull chunk's answer named a payload that cannot come any more (errc::payload_lost):
// the copy that answered may have died before writing it, maybe before its process ever
// connected to this one (then no end of a connection tells, only the claim timeout). A
// read is safe to ask again: it goes to the chunk's shard as the client knows it now (after
// a failover, the new tail). False when it was asked again enough, or its shard is gone.
bool ask_again_for_payload(const chunk_send& s, const std::string& why) {
  auto& st = s.self->state;
  auto& req = *s.req;
  if (req.payload_asks.empty()) req.payload_asks.resize(req.chunks.size());
  if (req.payload_asks[s.c] >= max_payload_asks || req.op->done_flag() || !st.index.count(req.chunks[s.c].shard))
    return false;
  ++req.payload_asks[s.c];
  log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": pull of " + describe_keys(req.chunks[s.c]) +
                                   ": " + why + "; asking " + st.routes[s.idx].link.name + " again");
  queue_chunk(s.self, s.req, s.c, false);  // its part of the result is copied in (landing stays taken)
  return true;
}

// A pull's answer: claimed (it may come over the data plane, and may still be on its way
// there: then the claimer answers once it landed), then checked and put in place.
void pull_answered(const chunk_send& s, float_block& values) {
  auto& st = s.self->state;
  auto failed = [s](const std::string& why, bool lost) {
    withdraw_landing(s);
    if (lost && ask_again_for_payload(s, why)) return;
    s.req->op->finish("pull of " + describe_keys(s.req->chunks[s.c]) + " failed: " +
                      s.self->state.routes[s.idx].link.name + ": " + why);
  };
  std::optional<float_block> claimed;
  try {
    claimed = claim_values(st.plane.get(), values);
  } catch (const bad_request& e) {
    return failed(e.what(), dynamic_cast<const payload_lost*>(&e) != nullptr);
  }
  if (claimed) return pull_landed(s, *claimed);
  auto awaited = st.awaited_payloads.emplace(s.idx, values.origin);
  auto arrived = [s, awaited] { s.self->state.awaited_payloads.erase(awaited); };
  s.self->request(st.claimer, caf::infinite, claim_atom::value, values)
    .then(
      [s, arrived](float_block& landed) {
        arrived();
        pull_landed(s, landed);
      },
      [failed, arrived](caf::error& err) {
        arrived();
        failed(describe(err), code_of(err) == errc::payload_lost);
      });
}

void pull_landed(const chunk_send& s, float_block& values) {
  auto& st = s.self->state;
  const auto& ch = s.req->chunks[s.c];
  auto op = s.req->op;
  auto& route = st.routes[s.idx];
  if (route.down_since) {  // the first pull after a failover: recovery time
    auto ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - *route.down_since).count();
    route.down_since.reset();
    std::lock_guard<std::mutex> guard(st.stats->mtx);
    st.stats->recoveries_ms.push_back(ms);
  }
  if (values.size != ch.num_values) {
    op->finish("pull of " + describe_keys(ch) + " failed: " + route.link.name + " sent " + std::to_string(values.size) +
               " values for " + std::to_string(ch.num_values) + " keys");
    return;
  }
  if (!s.req->in_place) {  // the common case: one chunk, its answer is the result
    if (values.whole())
      op->values = std::move(*values.storage);
    else
      op->values.assign(values.data(), values.data() + values.size);
  } else if (values.storage) {  // else it landed in place
    scatter(values.data(), ch, op->values.data());
  }
  chunk_answered(op.get());
}

void send_pull(const chunk_send& s, std::uint64_t tag, request_header h) {
  auto self = s.self;
  auto& st = self->state;
  auto req = s.req;
  auto c = s.c;
  const auto& ch = req->chunks[c];
  auto tail = tail_of(st.routes[s.idx]);
  if (auto peer = h.pull_codec == 0 ? plane_peer(self, tail) : 0) {
    h.reply_plane = st.plane->token();
    // A piece of a larger answer: its payload is read straight into place.
    if (!req->landing.empty() && req->landing[c] == 0 && data_plane::in_pieces(ch.pieces.size(), ch.num_values)) {
      std::vector<std::span<float>> into;
      for (const auto& p : ch.pieces) into.emplace_back(req->op->values.data() + p.value_offset, p.keys.size());
      st.plane->expect(peer, h.seq, std::move(into), req->op);
      req->landing[c] = peer;
    }
  }
  auto unexpect = [s] { withdraw_landing(s); };
  ask_shard(self, s.idx, tag, tail, pull_atom::value, h, range_list{ch.ranges()})
    .then(
      [=](float_block& values) {
        if (!settle(self, s.idx, tag)) return unexpect();  // answered already
        if (values.ticket == 0) unexpect();                 // inline: nothing will land in the places named
        pull_answered(s, values);
      },
      [=](caf::error& err) {
        // A sending taken for a failover: its landing, if any, is the next sending's.
        if (!self->state.routes[s.idx].sent.count(tag)) return;
        unexpect();
        request_failed(self, s.idx, tag, err, std::string(names_of(req->kind)) + " of " + describe_keys(req->chunks[c]));
      });
}

// A push or init: a large block goes over the data connection and the message names it;
// a chunk of scattered pieces is written straight from the caller's buffer if it can be.
void send_values(const chunk_send& s, std::uint64_t tag, const request_header& h) {
  auto self = s.self;
  auto& st = self->state;
  auto req = s.req;
  auto c = s.c;
  const auto& ch = req->chunks[c];
  auto handle = head_of(st.routes[s.idx]);
  auto acked = [=](std::uint64_t) {
    if (!settle(self, s.idx, tag)) return;
    auto& tick = self->state.routes[s.idx].acked_tick;
    tick = std::max(tick, s.hdr.tick);  // a failover resends from here
    chunk_answered(req->op.get());
  };
  auto on_error = [=](caf::error& err) {  // the text is built only when needed
    request_failed(self, s.idx, tag, err, std::string(names_of(req->kind)) + " of " + describe_keys(req->chunks[c]));
  };
  range_list ranges{ch.ranges()};
  if (!req->encoded.empty()) {
    ask_shard(self, s.idx, tag, handle, push_atom::value, h, std::move(ranges), req->encoded[c]).then(acked, on_error);
    return;
  }
  auto block = req->blocks[c];
  auto peer = plane_peer(self, handle);
  std::optional<float_block> named;
  if (peer && !block.storage) {
    std::vector<std::span<const float>> parts;
    for (const auto& p : ch.pieces) parts.emplace_back(req->source->data() + req->base + p.value_offset, p.keys.size());
    named = st.plane->offload(peer, parts, ch.num_values, req->source);  // the source is not changed after the push
  }
  if (!named && !block.storage) {  // gathered after all (kept for resends)
    std::vector<float> gathered(ch.num_values);
    gather(req->source->data() + req->base, ch, gathered.data());
    block = req->blocks[c] = float_block::own(std::move(gathered));
  }
  if (peer && !named) named = st.plane->offload(peer, block);
  if (named) block = std::move(*named);
  if (req->kind == op_kind::push)
    ask_shard(self, s.idx, tag, handle, push_atom::value, h, std::move(ranges), std::move(block)).then(acked, on_error);
  else
    ask_shard(self, s.idx, tag, handle, init_atom::value, h, std::move(ranges), std::move(block)).then(acked, on_error);
}

std::uint64_t count_keys_of(const std::vector<chunk>& chunks) {
  std::uint64_t n = 0;
  for (const auto& c : chunks) n += c.num_values;
  return n;
}

// A push, pull or init split into chunks: each is queued to its shard, numbered here in
// the order the shards will see them (callers on several threads could otherwise
// overtake each other): duplicate filters rely on it.
// With then_tick: the index of the last chunk to each shard (it carries the tick), and
// the shards no chunk reaches (they get a plain tick).
std::map<std::size_t, std::size_t> last_chunks(client_ptr self, const op_request& req,
                                               std::vector<std::size_t>& untouched) {
  auto& st = self->state;
  std::map<std::size_t, std::size_t> last;  // route -> chunk
  for (std::size_t c = 0; c < req.chunks.size(); ++c) last[st.index.at(req.chunks[c].shard)] = c;
  for (std::size_t idx = 0; idx < st.routes.size(); ++idx)
    if (!last.count(idx) && !st.routes[idx].retired) untouched.push_back(idx);
  return last;
}

void replan_pull(const chunk_send& s);

// Chunk c of req, queued to its shard (numbered now: see last_chunks); `ticks`: it
// carries the clock tick for that shard.
void queue_chunk(client_ptr self, const std::shared_ptr<op_request>& req, std::size_t c, bool ticks) {
  auto& st = self->state;
  const auto& ch = req->chunks[c];
  chunk_send s{self, req, c, st.index.at(ch.shard), req->hdr};
  s.hdr.seq = next_sequence();
  if (ticks) s.hdr.tick = req->then_tick;
  pending_request r;
  r.op = req->op;
  r.tick = ticks;  // with retries it waits for the requests before it, as a tick does
  r.read = req->kind == op_kind::pull;
  r.write = !r.read;
  r.plan_epoch = req->hdr.epoch;
  r.bytes = (req->encoded.empty() ? ch.num_values * sizeof(float) : req->encoded[c].bytes->size()) + ch.header_bytes();
  if (r.read) r.replan = [s] { replan_pull(s); };
  r.send = [s](std::uint64_t tag) {
    if (s.req->kind == op_kind::pull)
      send_pull(s, tag, s.hdr);
    else
      send_values(s, tag, s.hdr);
  };
  submit(s.self, s.idx, std::move(r));
}

// The pieces of req's chunks cut again by the client's map (keeping where their values sit).
std::vector<piece> pieces_by_map(const client_state& st, const std::vector<chunk>& chunks) {
  std::vector<piece> out;
  for (const auto& ch : chunks)
    for (const auto& p : ch.pieces)
      for (auto q : st.map->split(key_set::single(p.keys))) {
        q.value_offset += p.value_offset;
        out.push_back(q);
      }
  std::sort(out.begin(), out.end(), [](const piece& a, const piece& b) { return a.keys.begin < b.keys.begin; });
  return out;
}

// A request the caller planned by an older map than the client's (the client learned the
// new one meanwhile): planned again by the client's map before anything is sent, so it
// names no shard that left, and its tick is one of the new map (a shard that took keys
// ignores older ticks: they could overtake writes passed on to it). A push's values come
// from its source (a compressed push's decoded, as the shard would apply them).
void replan_request(client_ptr self, op_request& req) {
  auto& st = self->state;
  if (req.kind != op_kind::pull && !req.encoded.empty()) {
    std::uint64_t total = 0;
    for (const auto& ch : req.chunks)
      for (const auto& p : ch.pieces) total = std::max(total, p.value_offset + p.keys.size());
    auto source = std::make_shared<std::vector<float>>(total);
    for (std::size_t c = 0; c < req.chunks.size(); ++c) {
      std::vector<float> values(req.chunks[c].num_values);
      decode(std::span<const std::byte>(*req.encoded[c].bytes), values.data(), values.size());
      scatter(values.data(), req.chunks[c], source->data());
    }
    req.source = source;
    req.base = 0;
    req.encoded.clear();
  }
  auto keys = req.chunks.empty() ? 0 : count_keys_of(req.chunks);
  req.chunks = plan_chunks(pieces_by_map(st, req.chunks), st.chunk_bytes[static_cast<std::size_t>(req.kind)]);
  req.hdr.epoch = st.map_epoch;
  if (req.kind == op_kind::pull) {
    if (!req.in_place) req.op->values.resize(keys);
    req.in_place = true;
    req.landing.clear();
    return;
  }
  req.blocks.clear();
  for (const auto& c : req.chunks) {
    if (c.contiguous()) {
      req.blocks.push_back({req.source, req.base + c.first_offset(), c.num_values});
      continue;
    }
    std::vector<float> gathered(c.num_values);
    gather(req.source->data() + req.base, c, gathered.data());
    req.blocks.push_back(float_block::own(std::move(gathered)));
  }
}

void dispatch(client_ptr self, const std::shared_ptr<op_request>& req) {
  auto& st = self->state;
  if (req->hdr.epoch < st.map_epoch) replan_request(self, *req);
  auto op = req->op;
  std::vector<std::size_t> untouched;
  auto last = req->then_tick ? last_chunks(self, *req, untouched) : std::map<std::size_t, std::size_t>{};
  st.issued_tick = std::max(st.issued_tick, req->then_tick);
  op->pending = req->chunks.size() + untouched.size();
  if (op->pending == 0) {
    op->finish({});
    return;
  }
  for (std::size_t c = 0; c < req->chunks.size(); ++c)
    queue_chunk(self, req, c, req->then_tick && last.at(st.index.at(req->chunks[c].shard)) == c);
  for (auto idx : untouched)
    submit(self, idx, clock_request(self, idx, request_header{req->hdr.epoch, req->hdr.worker, req->then_tick, 0}, op));
}

// A pull chunk whose keys moved (a shard joined): its pieces cut again by the newest
// map, each new chunk landing where the old one would have.
void replan_pull(const chunk_send& s) {
  auto self = s.self;
  auto& st = self->state;
  const auto& ch = s.req->chunks[s.c];
  auto pieces = pieces_by_map(st, {ch});
  auto again = std::make_shared<op_request>();
  again->kind = op_kind::pull;
  again->hdr = s.req->hdr;
  again->hdr.epoch = st.map_epoch;
  again->op = s.req->op;
  again->chunks = plan_chunks(pieces, st.chunk_bytes[static_cast<std::size_t>(op_kind::pull)]);
  again->in_place = true;
  if (!s.req->in_place) again->op->values.resize(ch.num_values);  // one chunk: its answer was to be the result
  again->op->pending += again->chunks.size();
  for (std::size_t c = 0; c < again->chunks.size(); ++c) queue_chunk(self, again, c, false);
  chunk_answered(again->op.get());  // the moved chunk: its new chunks answer for it
}

// A pull of rows answered by one shard: each row goes to every position its id had.
void rows_landed(const std::shared_ptr<rows_request>& req, std::size_t g, const std::string& from,
                 const float_block& values) {
  const auto& grp = req->groups[g];
  auto expected = grp.rows.ids.size() * req->dim;
  if (values.size != expected || !values.data()) {
    req->op->finish(req->op->what + " failed: " + from + " sent " + std::to_string(values.size) + " values for " +
                    std::to_string(grp.rows.ids.size()) + " rows of dimension " + std::to_string(req->dim));
    return;
  }
  for (std::size_t k = 0; k < grp.positions.size(); ++k)
    for (auto p : grp.positions[k])
      std::copy_n(values.data() + k * req->dim, req->dim, req->op->values.data() + std::size_t{p} * req->dim);
  chunk_answered(req->op.get());
}

void send_rows(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g, std::size_t idx,
               request_header h, std::uint64_t tag) {
  auto& st = self->state;
  auto on_error = [=](caf::error& err) { request_failed(self, idx, tag, err, req->op->what); };
  const auto& grp = req->groups[g];
  if (req->kind == op_kind::push) {
    ask_shard(self, idx, tag, head_of(st.routes[idx]), push_rows_atom::value, h, grp.rows, grp.grads)
      .then([=](std::uint64_t) { if (settle(self, idx, tag)) chunk_answered(req->op.get()); }, on_error);
    return;
  }
  ask_shard(self, idx, tag, tail_of(st.routes[idx]), pull_rows_atom::value, h, grp.rows)
    .then([=](float_block& values) {
            if (settle(self, idx, tag)) rows_landed(req, g, self->state.routes[idx].link.name, values);
          },
          on_error);
}

void replan_rows(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g);

// Group g of a push or pull of rows, queued behind the earlier requests to its shard (a
// worker's pushes and ticks keep their order).
void queue_group(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g) {
  auto& st = self->state;
  auto idx = st.index.at(req->groups[g].shard);
  auto h = req->hdr;
  h.seq = next_sequence();
  pending_request r;
  r.op = req->op;
  r.read = req->kind == op_kind::pull;
  r.write = !r.read;
  r.plan_epoch = req->hdr.epoch;
  r.bytes = req->groups[g].rows.ids.size() * (sizeof(std::uint64_t) + req->dim * sizeof(float));
  if (r.read) r.replan = [=] { replan_rows(self, req, g); };
  r.send = [=](std::uint64_t tag) { send_rows(self, req, g, idx, h, tag); };
  submit(self, idx, std::move(r));
}

// Rows the caller grouped by an older map than the client's: grouped again by the client's
// map (a push's gradients and a pull's positions travel with their rows).
void regroup_rows(client_state& st, rows_request& req) {
  std::vector<rows_request::shard_rows> groups;
  std::map<std::uint32_t, std::size_t> group_of;
  std::vector<std::vector<float>> grads;
  for (const auto& old : req.groups)
    for (std::size_t k = 0; k < old.rows.ids.size(); ++k) {
      auto owner = st.map->row_owner(req.table, old.rows.ids[k]);
      auto [it, fresh] = group_of.emplace(owner, groups.size());
      if (fresh) {
        groups.push_back({owner, row_ids{req.table, {}}, {}, {}});
        grads.emplace_back();
      }
      auto& g = groups[it->second];
      g.rows.ids.push_back(old.rows.ids[k]);
      if (!old.positions.empty()) g.positions.push_back(old.positions[k]);
      if (old.grads.size > 0)
        grads[it->second].insert(grads[it->second].end(), old.grads.data() + k * req.dim, old.grads.data() + (k + 1) * req.dim);
    }
  for (std::size_t g = 0; g < groups.size(); ++g)
    if (!grads[g].empty()) groups[g].grads = float_block::own(std::move(grads[g]));
  req.groups = std::move(groups);
  req.hdr.epoch = st.map_epoch;
}

void dispatch_rows(client_ptr self, const std::shared_ptr<rows_request>& req) {
  if (req->hdr.epoch < self->state.map_epoch) regroup_rows(self->state, *req);
  req->op->pending = req->groups.size();
  if (req->op->pending == 0) return req->op->finish({});
  for (std::size_t g = 0; g < req->groups.size(); ++g) queue_group(self, req, g);
}

// A pull of rows whose rows moved: grouped again by their owners under the newest map.
void replan_rows(client_ptr self, const std::shared_ptr<rows_request>& req, std::size_t g) {
  auto& st = self->state;
  const auto& moved = req->groups[g];
  auto again = std::make_shared<rows_request>();
  again->kind = op_kind::pull;
  again->hdr = req->hdr;
  again->hdr.epoch = st.map_epoch;
  again->table = req->table;
  again->dim = req->dim;
  again->op = req->op;
  std::map<std::uint32_t, std::size_t> group_of;
  for (std::size_t k = 0; k < moved.rows.ids.size(); ++k) {
    auto owner = st.map->row_owner(req->table, moved.rows.ids[k]);
    auto [it, fresh] = group_of.emplace(owner, again->groups.size());
    if (fresh) again->groups.push_back({owner, row_ids{req->table, {}}, {}, {}});
    again->groups[it->second].rows.ids.push_back(moved.rows.ids[k]);
    again->groups[it->second].positions.push_back(moved.positions[k]);
  }
  again->op->pending += again->groups.size();
  for (std::size_t k = 0; k < again->groups.size(); ++k) queue_group(self, again, k);
  chunk_answered(again->op.get());
}

// Data connections early: blocks go inline until then.
void plane_connect_early(client_ptr self, std::size_t idx) {
  plane_peer(self, self->state.routes[idx].link.handle);
  plane_peer(self, self->state.routes[idx].tail);
}

// The client's state from its options; every shard copy is monitored, and the data
// connections are asked for early (blocks go inline until then).
void init_client(client_ptr self, std::vector<shard_link> shards, std::vector<shard_entry> entries,
                 const kv_client_options& opts, std::uint64_t epoch, std::shared_ptr<kv_cluster_events> stats) {
  auto& st = self->state;
  for (std::size_t i = 0; i < shards.size(); ++i) {
    shard_route r;
    r.link = std::move(shards[i]);
    r.entry = std::move(entries[i]);
    st.routes.push_back(std::move(r));
  }
  st.timeout = opts.timeout;
  st.inflight_limit = opts.inflight_bytes;
  st.crowded_inflight_limit = opts.crowded_inflight_bytes;
  st.coordinator = opts.coordinator;
  st.reconnect = opts.reconnect;
  st.worker_handle = opts.worker_handle;
  st.barrier_generation = opts.first_barrier;
  st.worker = opts.worker;
  st.epoch = epoch;
  st.stats = std::move(stats);
  {
    std::lock_guard<std::mutex> lock(st.stats->mtx);
    st.map = st.stats->map;
  }
  st.map_epoch = st.map->epoch();
  for (auto kind : {op_kind::push, op_kind::init, op_kind::pull, op_kind::clock})
    st.chunk_bytes[static_cast<std::size_t>(kind)] = opts.chunk_bytes_of(kind);
  st.dial = opts.dial;
  st.retry = opts.retry;
  if (opts.faults.touches_messages()) st.faults.emplace(opts.faults, opts.worker);
  st.plane = opts.plane;
  if (st.plane) {
    st.claimer = self->spawn<caf::linked>(payload_claimer, st.plane, false);
    st.connector = self->spawn<caf::linked + caf::detached>(plane_connector, st.plane);
    if (st.plane->messages_enabled())  // the shards' answers to requests sent over data connections
      st.plane->serve(caf::actor_cast<caf::strong_actor_ptr>(self),
                      [](caf::message_id mid, const caf::message&) { return mid.is_response(); });
  }
  auto n = st.routes.size();
  for (std::size_t i = 0; i < n; ++i) {
    st.index[st.routes[i].link.id] = i;
    self->monitor(st.routes[i].link.handle);
    const auto& chain = st.routes[i].entry.chain;
    st.routes[i].tail = chain.empty() ? st.routes[i].link.handle : caf::actor_cast<shard_actor>(chain.back());
    if (st.routes[i].tail != st.routes[i].link.handle) self->monitor(st.routes[i].tail);
  }
  for (std::size_t i = 0; i < n; ++i) plane_connect_early(self, i);
  if (st.coordinator) {
    self->monitor(st.coordinator);
    self->send(st.coordinator, view_atom::value, st.worker);
  }
}

// The coordinator is gone for good without ending the job (`why`): barriers and the
// worker's end fail now, and so do the requests waiting for a shard's replacement (only
// the coordinator could send one).
void coordinator_gone(client_ptr self, const std::string& why) {
  auto& st = self->state;
  st.coordinator_down = why;
  st.coordinator_lost.clear();
  for (auto& [tag, b] : st.barriers) b.promise.deliver(make_ps_error(why));
  st.barriers.clear();
  if (st.done) st.done->promise.deliver(make_ps_error(why));
  st.done.reset();
  for (std::size_t i = 0; i < st.routes.size(); ++i)
    if (!st.routes[i].down.empty() && !st.routes[i].abandoned) abandon_for_coordinator(self, i);
}

// Sends barrier `tag` to the coordinator (again, after a rejoin).
void send_barrier(client_ptr self, std::uint64_t tag) {
  auto& st = self->state;
  auto& b = st.barriers.at(tag);
  auto attempt = ++b.attempt;
  auto settle = [=](auto answer) {
    auto it = self->state.barriers.find(tag);
    if (it == self->state.barriers.end() || it->second.attempt != attempt) return;  // failed, or sent again
    it->second.promise.deliver(std::move(answer));
    self->state.barriers.erase(it);
  };
  self->request(st.coordinator, b.timeout, barrier_atom::value, st.worker, b.generation)
    .then([=](std::uint64_t generation) { settle(generation); },
          [=](caf::error& e) {
            if (!self->state.coordinator_lost.empty()) return;  // sent again once a coordinator is back
            settle(std::move(e));
          });
}

// A barrier at the coordinator, answered here (so that a dead coordinator fails it).
caf::result<std::uint64_t> barrier(client_ptr self, std::chrono::milliseconds timeout) {
  auto& st = self->state;
  if (!st.coordinator) return make_ps_error("this client has no coordinator");
  if (!st.coordinator_down.empty()) return make_ps_error(st.coordinator_down);
  auto tag = st.next_barrier++;
  auto rp = self->make_response_promise<std::uint64_t>();
  st.barriers[tag] = {rp, st.barrier_generation++, timeout, 0};
  if (st.coordinator_lost.empty()) send_barrier(self, tag);
  return rp;
}

// Sends the worker's end to the coordinator (again, after a rejoin).
void send_done(client_ptr self) {
  auto& st = self->state;
  auto attempt = ++st.done->attempt;
  auto settle = [=](auto answer) {
    auto& done = self->state.done;
    if (!done || done->attempt != attempt) return;
    done->promise.deliver(std::move(answer));
    done.reset();
  };
  auto acknowledged = [=](caf::ok_atom ok) {
    self->state.finished = true;
    settle(ok);
  };
  self->request(st.coordinator, st.timeout, done_atom::value, st.done->result)
    .then(acknowledged,
          [=](caf::error& e) {
            if (!self->state.coordinator_lost.empty()) return;  // sent again once a coordinator is back
            settle(std::move(e));
          });
}

caf::result<caf::ok_atom> finish_worker(client_ptr self, worker_result& result) {
  auto& st = self->state;
  if (!st.coordinator) return make_ps_error("this client has no coordinator");
  if (!st.coordinator_down.empty()) return make_ps_error(st.coordinator_down);
  auto rp = self->make_response_promise<caf::ok_atom>();
  st.done = client_state::pending_done{std::move(result), rp, 0};
  if (st.coordinator_lost.empty()) send_done(self);
  return rp;
}

// The coordinator went down without ending the job: with a dial, its address is dialled
// again while requests to the shards go on; else it is gone for good.
void coordinator_down(client_ptr self, const caf::error& reason) {
  auto& st = self->state;
  if (!reason || reason == caf::exit_reason::normal) return;  // the job ended
  if (!st.reconnect.enabled()) return coordinator_gone(self, "the coordinator went down (" + describe(reason) + ")");
  st.coordinator_lost = describe(reason);
  log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": the coordinator at " + st.reconnect.address +
                                   " went down (" + st.coordinator_lost + "); working on, waiting up to " +
                                   std::to_string(st.reconnect.patience.count()) + " ms for it to come back");
  redial_coordinator(self, st.reconnect, st.coordinator.address());
}

// A coordinator answers at the old address: the client rejoins it for its worker (which
// also subscribes it to new maps), then sends what waited: barriers and the worker's end.
void rejoin(client_ptr self, coordinator_actor coordinator) {
  auto& st = self->state;
  node_info me{"worker", "", 0, static_cast<std::uint32_t>(getpid()), st.worker_handle, st.worker, 0,
               protocol_version, {}};
  rejoin_coordinator(
    self, coordinator, me, st.reconnect,
    [=] {
      auto& st = self->state;
      st.coordinator = coordinator;
      st.coordinator_lost.clear();
      log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": rejoined the coordinator at " +
                                       st.reconnect.address);
      for (auto& [tag, b] : st.barriers) send_barrier(self, tag);
      if (st.done) send_done(self);
    },
    [=](const std::string& why) { coordinator_gone(self, why); });
}

// A shard that left the map is down (or went down before this client learned it left)
// with requests still waiting for it: they go to a live shard of the new map instead,
// with the same headers, as the leaver would have passed them on. It passes a write's
// parts to their owners (whose duplicate filters count each once, should the leaver have
// passed it on already) and refuses a read as moved, which is planned again by the new
// map; a clock tick for the leaver counts as done (it gates nothing). False when no live
// shard is left.
bool reroute_retired(client_ptr self, std::size_t idx) {
  auto& st = self->state;
  auto live = std::find_if(st.routes.begin(), st.routes.end(), [](const shard_route& r) {
    return !r.retired && r.down.empty() && !r.abandoned;
  });
  if (live == st.routes.end()) return false;
  auto& route = st.routes[idx];
  route.link.handle = live->link.handle;
  route.tail = live->tail;
  self->monitor(route.link.handle);
  if (route.tail != route.link.handle) self->monitor(route.tail);
  ++route.generation;
  route.down.clear();
  for (auto& r : take_pending(self, route)) {
    if (r.tick) chunk_answered(r.op.get());
    else route.queued.push_back(std::move(r));
  }
  log_line(log_level::warning, "worker " + std::to_string(st.worker) + ": " + route.link.name + ", which left the map, is down; " +
                                   std::to_string(route.queued.size()) + " requests sent again through " + live->link.name);
  lift_fence(self);
  pump(self, idx);
  report_if_idle(self, idx);
  return true;
}

// The coordinator or a shard copy went down.
void peer_down(client_ptr self, const caf::down_msg& dm) {
  auto& st = self->state;
  if (st.finished) return;  // the worker has ended: its shards end with the job
  if (st.coordinator && dm.source == st.coordinator.address()) return coordinator_down(self, dm.reason);
  // Its data connection will not come: CAF never fails the question to a dead peer itself.
  if (st.plane_asking.count(dm.source)) plane_peer_settled(self, dm.source, 0);
  for (std::size_t i = 0; i < st.routes.size(); ++i) {
    if (st.routes[i].link.handle.address() != dm.source && st.routes[i].tail.address() != dm.source) continue;
    if (!st.routes[i].down.empty()) continue;  // head and tail of one chain: once is enough
    if (st.routes[i].abandoned) continue;  // the coordinator's word came first and failed it all
    if (st.routes[i].retired) {  // it left the map: no replacement comes, nothing new goes there
      auto why = st.routes[i].link.name + ", which left the map, is down (" + describe(dm.reason) + ")";
      st.routes[i].down = why;
      if (!reroute_retired(self, i)) shard_down(self, i, why);  // until a map names a live shard
      continue;
    }
    shard_down(self, i, st.routes[i].link.name + " is down (" + describe(dm.reason) + ")");
  }
}

// Reads refused as moved (batch) whose new map did not come within the request timeout.
void expire_moved_reads(client_ptr self, std::uint64_t batch) {
  auto it = self->state.moved_reads.find(batch);
  if (it == self->state.moved_reads.end()) return;
  auto reads = std::move(it->second);
  self->state.moved_reads.erase(it);
  for (auto& r : reads)
    r.op->finish(r.op->what + " failed: its keys moved to another shard and no map naming the new owner came within " +
                 std::to_string(self->state.timeout.count()) + " ms");
}

// The coordinator's word on the live workers; await_live_workers callers look again.
void set_live_workers(client_ptr self, std::vector<std::uint32_t> live) {
  {
    std::lock_guard<std::mutex> guard(self->state.stats->mtx);
    self->state.stats->live_workers = std::move(live);
  }
  self->state.stats->changed.notify_all();
}

// Request `tag` of route idx unanswered for --ps.retry-ms: it goes out again, or fails once
// the request timeout has passed since it first left.
void resend(client_ptr self, std::uint64_t idx, std::uint64_t tag) {
  auto& st = self->state;
  auto it = st.routes[idx].sent.find(tag);
  if (it == st.routes[idx].sent.end() || !st.routes[idx].down.empty()) return;  // answered, or waiting for a failover
  auto r = std::move(it->second);
  st.routes[idx].inflight_bytes -= r.bytes;
  st.routes[idx].sent.erase(it);
  // Its answer would be stale now: CAF lets go of its handler (take_pending).
  if (r.answer_id.is_response()) answer_with_error(self, r.answer_id, caf::sec::request_timeout);
  if (std::chrono::steady_clock::now() - r.first_sent >= st.timeout) {
    r.op->finish(r.op->what + " failed: no reply from " + st.routes[idx].link.name + " within " +
                 std::to_string(st.timeout.count()) + " ms (" + std::to_string(r.attempts) + " attempts)");
    pump(self, idx);
    return;
  }
  launch(self, idx, std::move(r));
}

// kv_client::await_data_connections: the count now, or once no connection is pending.
caf::result<std::uint64_t> answer_when_connected(client_ptr self) {
  auto& st = self->state;
  if (st.plane_asking.empty()) return plane_peers_connected(st);
  st.plane_waiters.push_back(self->make_response_promise<std::uint64_t>());
  return st.plane_waiters.back();
}

client_impl::behavior_type kv_client_actor(client_ptr self, std::vector<shard_link> shards, std::vector<shard_entry> entries,
                              kv_client_options opts, std::uint64_t epoch, std::shared_ptr<kv_cluster_events> stats) {
  init_client(self, std::move(shards), std::move(entries), opts, epoch, std::move(stats));
  self->set_down_handler([=](caf::down_msg& dm) { peer_down(self, dm); });
  return {
    [=](failover_atom, std::uint64_t idx, std::uint64_t gen) {
      auto& st = self->state;
      if (st.routes[idx].generation != gen || st.routes[idx].down.empty()) return;
      fail_all(self, idx, st.routes[idx].down + " and no replacement came within " + std::to_string(st.timeout.count()) + " ms");
    },
    [=](view_atom, const cluster_view& view) { apply_view(self, view); },
    [=](handoff_atom, std::uint64_t batch) { expire_moved_reads(self, batch); },
    [=](members_atom, std::vector<std::uint32_t>& live) { set_live_workers(self, std::move(live)); },
    [=](send_atom, std::uint64_t idx, std::uint64_t tag) {  // a delayed request leaves now
      auto& st = self->state;
      auto it = st.routes[idx].sent.find(tag);
      if (it != st.routes[idx].sent.end()) it->second.send(tag);
    },
    [=](overdue_atom) { sweep_overdue(self); },
    [=](resend_atom, std::uint64_t idx, std::uint64_t tag) { resend(self, idx, tag); },
    [=](failed_atom, std::uint32_t id, const std::string& why) {
      auto& st = self->state;
      auto at = st.index.find(id);
      if (at == st.index.end()) return;
      auto idx = at->second;
      st.routes[idx].abandoned = true;
      if (st.routes[idx].down.empty()) st.routes[idx].down = st.routes[idx].link.name + " is down";
      st.routes[idx].down += " (coordinator: " + why + ")";
      fail_all(self, idx, st.routes[idx].down);
    },
    // A clock tick goes to every shard, behind this worker's earlier requests to it.
    [=](clock_atom, std::shared_ptr<op_request>& req) {
      auto& st = self->state;
      auto op = req->op;
      st.issued_tick = std::max(st.issued_tick, req->hdr.clock);
      req->hdr.epoch = std::max(req->hdr.epoch, st.map_epoch);  // a tick of the client's map (replan_request says why)
      op->pending = 0;
      for (const auto& route : st.routes) op->pending += !route.retired;
      for (std::size_t idx = 0; idx < st.routes.size(); ++idx)
        if (!st.routes[idx].retired) submit(self, idx, clock_request(self, idx, req->hdr, op));
    },
    [=](barrier_atom, std::uint32_t, std::uint64_t timeout_ms) {
      return barrier(self, std::chrono::milliseconds(timeout_ms));
    },
    [=](report_atom, std::string& text) {
      auto& st = self->state;
      if (st.coordinator && st.coordinator_lost.empty()) self->send(st.coordinator, report_atom::value, st.worker, std::move(text));
    },
    [=](done_atom, worker_result& result) { return finish_worker(self, result); },
    [=](rejoin_atom, const caf::actor& coordinator) { rejoin(self, caf::actor_cast<coordinator_actor>(coordinator)); },
    [=](rejoin_atom, const std::string& why) {
      auto& st = self->state;
      auto text = coordinator_gone_text(st.reconnect, st.coordinator_lost) + " (" + why + ")";
      std::fprintf(stderr, "worker %u: %s\n", st.worker, text.c_str());
      coordinator_gone(self, text);
    },
    [=](dispatch_atom, std::shared_ptr<op_request>& req) { dispatch(self, req); },
    [=](dispatch_atom, std::shared_ptr<rows_request>& req) { dispatch_rows(self, req); },
    [=](data_atom) { return answer_when_connected(self); },
  };
}

}  // namespace

// ---- kv_client ------------------------------------------------------------------

kv_client::kv_client(caf::actor_system& sys, const cluster_view& view,
                     std::vector<shard_link> shards, kv_client_options opts)
    : opts_(opts), sys_(sys), shards_(shards) {
  stats_->map = std::make_shared<const partitioner>(map_of(view));
  for (const auto& t : view.tables) tables_.push_back(t.to_spec());
  for (std::uint32_t w = 0; w < view.num_workers; ++w) stats_->live_workers.push_back(w);
  if (shards.size() != view.shards.size())
    throw bad_request("kv_client: " + std::to_string(shards.size()) + " shard links for " +
                      std::to_string(view.shards.size()) + " shards in the map");
  if (opts_.timeout.count() <= 0)
    throw bad_request("kv_client: the request timeout must be positive");
  opts_.compression.validate();
  if (opts_.pull_compression.kind == codec_kind::topk)
    throw bad_request("kv_client: pulls take none, fp16 or int8 compression, not top-k (it would drop most parameters)");
  // Message faults act on CAF messages: under them blocks stay inside the messages.
  if (opts_.faults.touches_messages()) opts_.plane.reset();
  actor_ = caf::actor_cast<client_actor>(
    sys.spawn(kv_client_actor, std::move(shards), view.shards, opts_, view.epoch, stats_));
}

std::vector<shard_link> kv_client::current_shards() const {
  auto links = shards_;
  std::lock_guard<std::mutex> lock(stats_->mtx);
  for (auto& l : links)
    if (auto it = stats_->new_heads.find(l.id); it != stats_->new_heads.end()) l.handle = it->second;
  links.insert(links.end(), stats_->joined.begin(), stats_->joined.end());
  return links;
}

// A compressed push keeps its chunks the same every time: top-k residuals follow them. A
// request that fits a TCP push chunk is one chunk either way: the plane is not asked.
std::uint64_t kv_client::chunk_bytes_now(op_kind kind, std::uint64_t values) const {
  auto bytes = opts_.chunk_bytes_of(kind);
  if (kind == op_kind::pull || opts_.compression.kind != codec_kind::none || !opts_.plane ||
      values * sizeof(float) <= opts_.tcp_push_chunk_bytes)
    return bytes;
  if (opts_.plane->host_crowded() || opts_.plane->sends_by_ring_to_all()) return bytes;
  return std::min(bytes, opts_.tcp_push_chunk_bytes);
}

std::shared_ptr<const partitioner> kv_client::current_map() const {
  std::lock_guard<std::mutex> lock(stats_->mtx);
  return stats_->map;
}

namespace {
// CAF keeps an actor's response handlers in a protected member; a derived name reaches it.
struct response_handlers : caf::scheduled_actor {
  using caf::scheduled_actor::multiplexed_responses_;
};
}  // namespace

std::size_t kv_client::awaited_answers() const {
  auto* actor = dynamic_cast<caf::scheduled_actor*>(caf::actor_cast<caf::abstract_actor*>(actor_));
  return (actor->*(&response_handlers::multiplexed_responses_)).size();
}

std::vector<std::string> kv_client::shard_stats() const {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::vector<std::string> out;
  for (const auto& s : current_shards())
    self->request(s.handle, opts_.timeout, stats_atom::value)
      .receive([&](std::string& json) { out.push_back(std::move(json)); },
               [&](caf::error& e) { throw bad_request(s.name + ": no figures: " + describe(e)); });
  return out;
}

void kv_client::prefetch_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids) {
  table_dim(table);  // an unknown table is refused
  std::map<std::uint32_t, std::vector<std::uint64_t>> by_shard;
  auto map = current_map();
  for (auto id : merge_rows(ids, nullptr, 1).ids) by_shard[map->row_owner(table, id)].push_back(id);
  request_header hdr{map->epoch(), opts_.worker, clock_, 0};
  const auto links = current_shards();
  for (auto& [shard, rows] : by_shard)
    for (const auto& s : links)
      if (s.id == shard) caf::anon_send(s.handle, prefetch_atom::value, hdr, row_ids{table, std::move(rows)});
}

std::uint64_t kv_client::fill_rows(std::uint32_t table, std::uint64_t count) const {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::uint64_t made = 0;
  for (const auto& s : current_shards())
    self->request(s.handle, caf::infinite, fill_atom::value, table, count)
      .receive([&](std::uint64_t rows) { made += rows; },
               [&](caf::error& e) { throw bad_request(s.name + ": filling table " + std::to_string(table) + ": " + describe(e)); });
  return made;
}

kv_client::~kv_client() {
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

kv_future kv_client::push(const key_set& keys, std::vector<float> values) {
  return send(op_kind::push, keys, std::make_shared<std::vector<float>>(std::move(values)));
}

kv_future kv_client::push(const key_set& keys, std::shared_ptr<std::vector<float>> values) {
  if (!values) throw bad_request("push: no values (null buffer)");
  return send(op_kind::push, keys, std::move(values));
}

kv_future kv_client::push(const key_set& keys, std::shared_ptr<std::vector<float>> values,
                          std::size_t offset) {
  if (!values) throw bad_request("push: no values (null buffer)");
  return send(op_kind::push, keys, std::move(values), offset);
}

void kv_client::barrier(std::chrono::milliseconds timeout) {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::string err;
  // The client answers: with the coordinator's reply, its timeout, or its death.
  self->request(caf::actor_cast<client_impl>(actor_), caf::infinite, barrier_atom::value, opts_.worker,
                static_cast<std::uint64_t>(timeout.count()))
    .receive([](std::uint64_t) {}, [&](caf::error& e) { err = describe(e); });
  if (!err.empty()) throw kv_error("barrier failed: " + err);
}

std::uint64_t kv_client::await_data_connections(std::chrono::milliseconds timeout) {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::uint64_t connected = 0;
  std::string err;
  self->request(caf::actor_cast<client_impl>(actor_), timeout, data_atom::value)
    .receive([&](std::uint64_t n) { connected = n; }, [&](caf::error& e) { err = describe(e); });
  if (!err.empty()) throw kv_error("waiting for the data connections to the shards: " + err);
  return connected;
}

void kv_client::report(std::string text) {
  caf::anon_send(caf::actor_cast<client_impl>(actor_), report_atom::value, std::move(text));
}

void kv_client::finish(worker_result result) {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::string err;
  // The client answers: with the coordinator's acknowledgment, or why it cannot come.
  self->request(caf::actor_cast<client_impl>(actor_), caf::infinite, done_atom::value, std::move(result))
    .receive([](caf::ok_atom) {}, [&](caf::error& e) { err = describe(e); });
  if (!err.empty()) throw kv_error("the worker's result did not reach the coordinator: " + err);
}

std::vector<double> kv_client::recovery_times_ms() const {
  std::lock_guard<std::mutex> guard(stats_->mtx);
  return stats_->recoveries_ms;
}

std::vector<std::uint32_t> kv_client::live_workers() const {
  std::lock_guard<std::mutex> guard(stats_->mtx);
  return stats_->live_workers;
}

bool kv_client::await_live_workers(std::size_t n, std::chrono::milliseconds timeout) const {
  send_before_blocking();
  std::unique_lock<std::mutex> lock(stats_->mtx);
  return stats_->changed.wait_for(lock, timeout, [&] { return stats_->live_workers.size() >= n; });
}

bool kv_client::await_map(const std::function<bool(const partitioner&)>& holds, std::chrono::milliseconds timeout) const {
  send_before_blocking();
  std::unique_lock<std::mutex> lock(stats_->mtx);
  return stats_->changed.wait_for(lock, timeout, [&] { return holds(*stats_->map); });
}

kv_future kv_client::leave_clock_vector() {
  auto op = std::make_shared<kv_op_state>();
  op->what = "leaving the clock vector (worker " + std::to_string(opts_.worker) + ")";
  auto req = std::make_shared<detail::op_request>();
  req->kind = op_kind::clock;
  req->op = op;
  req->hdr = request_header{current_map()->epoch(), opts_.worker, left_clock, 0};  // a tick to infinity
  caf::anon_send(caf::actor_cast<client_impl>(actor_), clock_atom::value, std::move(req));
  return kv_future(op);
}

void kv_client::die_if_killed_at(std::uint64_t c) {
  if (opts_.kill_at && c >= *opts_.kill_at)
    die_abruptly("worker " + std::to_string(opts_.worker) + " reached clock " + std::to_string(c) +
                 " (--faults: kill worker=" + std::to_string(opts_.worker) + " at=" + std::to_string(*opts_.kill_at) + ")");
}

kv_future kv_client::push_and_advance(const key_set& keys, std::shared_ptr<std::vector<float>> values,
                                      std::size_t offset, std::uint64_t then_tick) {
  if (!values) throw bad_request("push: no values (null buffer)");
  if (opts_.kill_at && then_tick >= *opts_.kill_at) {  // the push counts, then the worker dies ticking
    push(keys, std::move(values), offset).get();
    return advance_clock(then_tick);
  }
  auto f = send(op_kind::push, keys, std::move(values), offset, then_tick);
  clock_ = then_tick;
  return f;
}

kv_future kv_client::advance_clock(std::uint64_t c) {
  die_if_killed_at(c);
  clock_ = c;
  auto op = std::make_shared<kv_op_state>();
  op->what = "clock tick to " + std::to_string(c) + " of worker " + std::to_string(opts_.worker);
  auto req = std::make_shared<detail::op_request>();
  req->kind = op_kind::clock;
  req->op = op;
  req->hdr = request_header{current_map()->epoch(), opts_.worker, c, 0};
  caf::anon_send(caf::actor_cast<client_impl>(actor_), clock_atom::value, std::move(req));
  return kv_future(op);
}

kv_future kv_client::init(const key_set& keys, std::vector<float> values) {
  return send(op_kind::init, keys, std::make_shared<std::vector<float>>(std::move(values)));
}

std::pair<latency_summary, latency_summary> kv_client::take_latencies() {
  return {push_latency_->take(), pull_latency_->take()};
}

kv_future kv_client::pull(const key_set& keys) {
  return send(op_kind::pull, keys, nullptr);
}

kv_future kv_client::pull(const key_set& keys, std::vector<float> into) {
  return send(op_kind::pull, keys, nullptr, {}, 0, std::move(into));
}

std::uint32_t kv_client::table_dim(std::uint32_t table) const {
  if (table >= tables_.size())
    throw bad_request("no sparse table " + std::to_string(table) + " (the job has " + std::to_string(tables_.size()) +
                      ")");
  return tables_[table].dim;
}

kv_future kv_client::pull_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids) {
  return send_rows(op_kind::pull, table, ids, nullptr);
}

kv_future kv_client::push_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids,
                               const std::vector<float>& grads) {
  auto dim = table_dim(table);
  if (grads.size() != ids.size() * dim)
    throw bad_request("push of " + std::to_string(ids.size()) + " rows of table '" + tables_[table].name + "' (dim " +
                      std::to_string(dim) + "): " + std::to_string(grads.size()) + " gradient values, not " +
                      std::to_string(ids.size() * dim));
  return send_rows(op_kind::push, table, ids, grads.data());
}

// The request goes to the client actor, and the caller's thread runs the actor itself
// when this message woke it (inline_runner), as a data connection's reader does for
// answers: waking the scheduler's thread for it cost a futex wake, a sleep and two context
// switches per request, more than the dispatch. What the actor writes meanwhile goes into
// the thread's lingering batch, so the requests a caller makes between two waits leave
// in one write (write_batch).
template <class Request>
void dispatch_here(caf::actor_system& sys, const client_actor& actor, bool on_caller, std::shared_ptr<Request> req) {
  inline_runner here(sys);
  caf::actor_cast<caf::strong_actor_ptr>(actor)->enqueue(
      caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, dispatch_atom::value, std::move(req)),
      on_caller ? &here : nullptr);  // nullptr: the scheduler takes the actor
  if (here.waiting() == 0) return;  // not woken here: it runs (or was running) elsewhere
  auto& batch = callers_batch();
  {
    write_batch::scope open(batch);
    here.run();
  }
  batch.release();
}

// Duplicates merged, then the distinct rows grouped by the shard that owns them.
kv_future kv_client::send_rows(op_kind kind, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                               const float* grads) {
  auto dim = table_dim(table);
  auto op = std::make_shared<kv_op_state>();
  op->latency = kind == op_kind::pull ? pull_latency_ : push_latency_;
  op->what = std::string(names_of(kind)) + " of " + std::to_string(ids.size()) + " rows of table '" +
             tables_[table].name + "'";
  auto merged = merge_rows(ids, grads, dim);
  auto req = std::make_shared<rows_request>();
  auto map = current_map();
  req->kind = kind;
  req->hdr = request_header{map->epoch(), opts_.worker, clock_, 0};
  req->table = table;
  req->dim = dim;
  req->op = op;
  std::map<std::uint32_t, std::size_t> group_of;  // shard -> index in groups
  std::vector<std::pair<std::size_t, std::uint32_t>> place(merged.ids.size());  // distinct row -> (group, row)
  std::vector<std::vector<float>> group_grads;
  for (std::size_t j = 0; j < merged.ids.size(); ++j) {
    auto shard = map->row_owner(table, merged.ids[j]);
    auto [it, fresh] = group_of.emplace(shard, req->groups.size());
    if (fresh) {
      req->groups.push_back({shard, row_ids{table, {}}, {}, {}});
      group_grads.emplace_back();
    }
    auto& grp = req->groups[it->second];
    place[j] = {it->second, static_cast<std::uint32_t>(grp.rows.ids.size())};
    grp.rows.ids.push_back(merged.ids[j]);
    if (grads) group_grads[it->second].insert(group_grads[it->second].end(), merged.grads.begin() + j * dim,
                                              merged.grads.begin() + (j + 1) * dim);
  }
  for (std::size_t g = 0; g < req->groups.size(); ++g) {
    if (grads) req->groups[g].grads = float_block::own(std::move(group_grads[g]));
    req->groups[g].positions.resize(req->groups[g].rows.ids.size());
  }
  if (kind == op_kind::pull) {
    op->values.resize(ids.size() * dim);
    for (std::size_t p = 0; p < ids.size(); ++p) {
      auto [g, k] = place[merged.slot[p]];
      req->groups[g].positions[k].push_back(static_cast<std::uint32_t>(p));
    }
  }
  kv_future f(op);
  dispatch_here(sys_, actor_, opts_.dispatch_on_caller, std::move(req));
  return f;
}

kv_future kv_client::send(op_kind kind, const key_set& keys, std::shared_ptr<std::vector<float>> whole,
                          std::optional<std::size_t> offset, std::uint64_t then_tick,
                          std::optional<std::vector<float>> pull_into) {
  auto op = std::make_shared<kv_op_state>();
  op->what = names_of(kind);
  op->latency = kind == op_kind::pull ? pull_latency_ : kind == op_kind::push ? push_latency_ : nullptr;
  if (kind != op_kind::pull && !offset && whole->size() != keys.num_keys())
    throw bad_request(op->what + ": " + std::to_string(whole->size()) + " values for " +
                      std::to_string(keys.num_keys()) + " keys");
  if (kind != op_kind::pull && offset && (*offset > whole->size() || whole->size() - *offset < keys.num_keys()))
    throw bad_request(op->what + ": " + std::to_string(keys.num_keys()) + " keys need values [" +
                      std::to_string(*offset) + ", " + std::to_string(*offset + keys.num_keys()) +
                      ") of a buffer of " + std::to_string(whole->size()));
  if (!keys.ranges().empty())
    op->what += " of " + describe_keys(keys.ranges().front(), keys.ranges().back(), keys.ranges().size());
  auto req = std::make_shared<detail::op_request>();
  req->kind = kind;
  req->op = op;
  auto map = current_map();
  req->hdr = request_header{map->epoch(), opts_.worker, clock_, 0};
  req->chunks = plan_chunks(map->split(keys), chunk_bytes_now(kind, keys.num_keys()));
  if (kind == op_kind::pull) {
    req->hdr.pull_codec = static_cast<std::uint8_t>(opts_.pull_compression.kind);
    if (req->chunks.size() > 1 || pull_into) {
      req->in_place = true;
      if (pull_into) op->values = std::move(*pull_into);
      op->values.resize(keys.num_keys());
      if (req->hdr.pull_codec == 0) req->landing.assign(req->chunks.size(), 0);  // encoded answers come inline
    }
  } else {
    auto base = offset.value_or(0);
    // Over a data plane, chunks of scattered pieces may be written from `whole` directly.
    bool defer_gather = opts_.plane && !(kind == op_kind::push && opts_.compression.kind != codec_kind::none);
    req->source = whole;
    req->base = base;
    for (const auto& c : req->chunks) {
      if (c.contiguous()) {  // a view: no copy
        req->blocks.push_back({whole, base + c.first_offset(), c.num_values});
      } else if (defer_gather) {
        req->blocks.push_back({nullptr, 0, c.num_values});
      } else {
        std::vector<float> gathered(c.num_values);
        gather(whole->data() + base, c, gathered.data());
        req->blocks.push_back(float_block::own(std::move(gathered)));
      }
    }
  }
  if (kind == op_kind::push && opts_.compression.kind != codec_kind::none) {
    for (std::size_t c = 0; c < req->chunks.size(); ++c) {
      const auto& b = req->blocks[c];
      auto* residual = &residuals_[{req->chunks[c].pieces.front().keys.begin, c}];
      if (!residual->values().empty() && residual->values().size() != b.size) residual->clear();
      auto bytes = std::make_shared<std::vector<std::byte>>();
      encode(opts_.compression, b.data(), b.size, residual, *bytes);
      req->encoded.push_back({std::move(bytes)});
    }
    req->blocks.clear();
  }
  req->then_tick = then_tick;
  dispatch_here(sys_, actor_, opts_.dispatch_on_caller, std::move(req));
  return kv_future(op);
}

}  // namespace ps
