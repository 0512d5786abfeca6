// The client actor: its state from its options, and its behaviour (each message handed
// to the concern it belongs to).
#include "actors/client/client_state.hpp"

namespace ps::client_internal {

// The client's state from its options; every shard copy is monitored, and the data
// connections are asked for early (blocks go inline until then).
void init_client(client_ptr self, std::vector<shard_link> shards, std::vector<shard_entry> entries,
                 const kv_client_options& opts, std::uint64_t epoch, std::shared_ptr<kv_cluster_events> stats) {
  auto& st = self->state;
  st.timeout = opts.timeout;
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
  // Flow control per shard: CAF's broker buffers every queued message in one growing
  // buffer and shifts it after each partial write, so hundreds of MB queued on one
  // connection cost quadratic copying (window 8 x 16 MiB ran 4x slower than window 1).
  // Chunks beyond the in-flight budget wait in the client instead.
  st.core = client_core<pending_request>({opts.inflight_bytes, opts.crowded_inflight_bytes, opts.retry.count() > 0},
                                         st.map->epoch());
  for (std::size_t i = 0; i < shards.size(); ++i) {
    shard_route r;
    r.link = std::move(shards[i]);
    r.entry = std::move(entries[i]);
    add_flow(st, std::move(r));
  }
  for (auto kind : {op_kind::push, op_kind::init, op_kind::pull, op_kind::clock})
    st.chunk_bytes[static_cast<std::size_t>(kind)] = opts.chunk_bytes_of(kind);
  st.dial = opts.dial;
  st.retry = opts.retry;
  if (opts.faults.touches_messages()) st.faults.emplace(opts.faults, opts.worker);
  st.plane = opts.plane;
  if (st.plane) {
    st.claimer = self->spawn<caf::linked>(payload_claimer, st.plane, false);
    if (st.plane->connect_blocks()) st.connector = self->spawn<caf::linked + caf::detached>(plane_connector, st.plane);
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

// Request `tag` of route idx unanswered for --ps.retry-ms: it goes out again, or fails once
// the request timeout has passed since it first left.
void resend(client_ptr self, std::uint64_t idx, std::uint64_t tag) {
  auto& st = self->state;
  if (!st.routes[idx].down.empty()) return;  // waiting for a failover
  auto settled = st.core.settle(idx, tag);
  if (!settled) return;  // answered
  auto r = std::move(*settled);
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
      auto& sent = st.core.at(idx).sent;
      if (auto it = sent.find(tag); it != sent.end()) it->second.send(tag);
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
      req->hdr.epoch = std::max(req->hdr.epoch, st.core.map_epoch());  // a tick of the client's map (replan_request says why)
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

}  // namespace ps::client_internal
