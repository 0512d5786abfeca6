// The client and the coordinator: barriers, the worker's end, the coordinator lost and
// rejoined, the live workers.
#include "actors/client/client_state.hpp"

namespace ps::client_internal {

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

// The coordinator's word on the live workers; await_live_workers callers look again.
void set_live_workers(client_ptr self, std::vector<std::uint32_t> live) {
  {
    std::lock_guard<std::mutex> guard(self->state.stats->mtx);
    self->state.stats->live_workers = std::move(live);
  }
  self->state.stats->changed.notify_all();
}

}  // namespace ps::client_internal
