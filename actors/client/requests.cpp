// Sending requests to shards: the in-flight budget, the fence after a map change, the
// client's own request timeout, retries and the direct path over the data connections.
#include "actors/client/client_state.hpp"

namespace ps::client_internal {

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


// Sequence numbers of pushes: unique in this process (so two clients of one worker id,
// as in tests, never collide), increasing per client.
std::uint64_t next_sequence() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1);
}

void pump(client_ptr self, std::size_t idx);

// A write settled while the fence stood (client_core::map_changed): once no stale write is
// left, everything held moves.
void lift_fence(client_ptr self) {
  auto& st = self->state;
  if (!st.core.lift_fence()) return;
  for (std::size_t i = 0; i < st.routes.size(); ++i) pump(self, i);
}

// A shard's route and its flow of requests in the core, at the same position.
void add_flow(client_state& st, shard_route r) {
  st.routes.push_back(std::move(r));
  st.core.add_flow();
}

// A shard that left the map: once this client has nothing left for it, the coordinator
// hears so (it stops the shard when every client has).
void report_if_idle(client_ptr self, std::size_t idx) {
  auto& st = self->state;
  auto& route = st.routes[idx];
  if (!route.retired || route.idle_reported || !st.core.at(idx).idle() || !st.coordinator) return;
  route.idle_reported = true;
  self->send(st.coordinator, idle_atom::value, route.link.id, st.worker);
}

// Whether route's requests are held to the smaller budget of a crowded host: its payloads
// go over TCP, whose bytes in flight on a crowded host cost cache misses and add no overlap
// (libps/net/host_share.hpp). A shared-memory ring keeps its own room and is not held to it.
bool crowded_over_tcp(const client_state& st, const shard_route& route) {
  if (!st.plane || !st.plane->host_crowded()) return false;
  auto it = st.plane_peers.find(caf::actor_cast<caf::actor_addr>(head_of(route)));
  return it == st.plane_peers.end() || it->second == 0 || !st.plane->sends_by_ring(it->second);
}

// Sends queued requests while the core lets them go (client_core::why_held: the shard is
// up, order, the in-flight budget, the fence). Requests to a shard leave in the order
// they were made (read-my-writes and clock ticks depend on it).
// With a chain, pushes go to the head and pulls to the tail: a pull sent while one of this
// worker's updates is still on its way down the chain could be answered without it (found
// by `sim`), so the core holds it until they are acknowledged. With retries a tick waits
// for the pushes before it; not reads: a read parked at the shard may wait for this very
// tick (found by `sim --elastic`).
void pump(client_ptr self, std::size_t idx) {
  auto& st = self->state;
  for (;;) {
    const auto& route = st.routes[idx];
    auto chained = [&] { return route.tail.address() != route.link.handle.address(); };
    auto crowded = [&] { return crowded_over_tcp(st, route); };
    if (st.core.why_held(idx, route.down.empty(), chained, crowded) != held_by::nothing) return;
    launch(self, idx, st.core.take_next(idx));
  }
}

void submit(client_ptr self, std::size_t idx, pending_request r) {
  auto& st = self->state;
  if (!st.routes[idx].down.empty() && (!st.coordinator || st.routes[idx].abandoned)) {  // no replacement can come
    r.op->finish(r.op->what + " failed: " + st.routes[idx].down);
    return;
  }
  st.core.submit(idx, std::move(r));
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
  std::optional<caf::actor_clock::time_point> next;
  std::vector<caf::message_id> overdue;
  for (auto [idx, tag] : st.core.overdue(self->clock().now(), st.timeout, next)) {
    auto& r = st.core.at(idx).sent.at(tag);
    overdue.push_back(r.answer_id);
    r.answer_id = caf::message_id{};  // a request kept for a failover is not timed out again
  }
  for (auto id : overdue) answer_with_error(self, id, caf::sec::request_timeout);
  if (next) arm_overdue_sweep(self, *next);
}


// Puts request `tag` on the wire, through the fault injector's message faults if any.
void transmit(client_ptr self, std::size_t idx, std::uint64_t tag) {
  auto& st = self->state;
  auto& sent = st.core.at(idx).sent;
  auto it = sent.find(tag);
  if (it == sent.end()) return;
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
  launch(self, idx, std::move(*self->state.core.settle(idx, tag)));
}

void launch(client_ptr self, std::size_t idx, pending_request r) {
  auto& st = self->state;
  if (r.op->done_flag()) return;  // failed meanwhile (another chunk, a dead shard): skip
  if (st.core.at(idx).sent.empty()) go_direct(self, idx);
  if (r.attempts++ == 0) r.first_sent = std::chrono::steady_clock::now();
  transmit(self, idx, st.core.sent(idx, std::move(r)));
}

// The answer to request `tag` arrived: false if it is stale (the request was sent again
// after a failover, or already failed), so the caller ignores it.
bool settle(client_ptr self, std::size_t idx, std::uint64_t tag) {
  auto& st = self->state;
  // The fault injector may lose the reply of a request in flight: the retry comes.
  if (st.faults && st.core.at(idx).sent.count(tag) && st.faults->next().drop) return false;
  auto settled = st.core.settle(idx, tag);
  if (!settled) return false;
  bool write = settled->write;
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
        auto refused = [=](const std::string& why) {
          log_line(log_level::warning,
                   "worker " + std::to_string(self->state.worker) + ": " + why + "; its blocks go through CAF");
          plane_peer_settled(self, addr, 0);
        };
        if (!self->state.connector) {  // connecting does not block: here and now
          std::string why;
          return self->state.plane->connect(token, host, port, &why) ? plane_peer_settled(self, addr, token)
                                                                      : refused(why);
        }
        self->request(self->state.connector, caf::infinite, connect_atom::value, token, host, port)
          .then([=](std::uint64_t peer) { plane_peer_settled(self, addr, peer); },
                [=](caf::error& err) { refused(describe(err)); });
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


// Data connections early: blocks go inline until then.
void plane_connect_early(client_ptr self, std::size_t idx) {
  plane_peer(self, self->state.routes[idx].link.handle);
  plane_peer(self, self->state.routes[idx].tail);
}

}  // namespace ps::client_internal
