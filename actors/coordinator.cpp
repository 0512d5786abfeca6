#include "actors/coordinator.hpp"

#include <cstdio>

namespace ps {

namespace {

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;

cluster_view make_view(self_ptr self, const coordinator_options& opts) {
  cluster_view v;
  v.epoch = 1;
  v.vnodes = opts.vnodes;
  v.bucket_bits = opts.bucket_bits;
  v.num_workers = opts.workers;
  v.staleness = opts.staleness;
  v.checkpoint_every = opts.checkpoint_every;
  v.checkpointer = opts.checkpointer;
  v.shards = self->state.shards;
  v.rule = rule_msg::from(opts.rule);
  return v;
}

void tell_observer(self_ptr, const coordinator_options& opts, caf::message msg) {
  if (opts.observer) {
    caf::anon_send(opts.observer, std::move(msg));
    return;
  }
  // Standalone coordinator: print what an observer would get.
  if (msg.match_elements<report_atom, std::uint32_t, std::string>())
    std::printf("worker %u: %s\n", msg.get_as<std::uint32_t>(1), msg.get_as<std::string>(2).c_str());
  else if (msg.match_elements<done_atom, std::uint32_t, std::string>())
    std::printf("worker %u finished: %s\n", msg.get_as<std::uint32_t>(1), msg.get_as<std::string>(2).c_str());
  else if (msg.match_elements<failed_atom, std::string>())
    std::fprintf(stderr, "coordinator: %s\n", msg.get_as<std::string>(1).c_str());
  std::fflush(stdout);
}

void release_barrier_if_complete(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  auto live = opts.workers - st.finished_workers;
  if (st.barrier.empty() || st.barrier.size() < live) return;
  auto gen = st.barrier_generation++;
  for (auto& rp : st.barrier) rp.deliver(gen);
  st.barrier.clear();
}

void worker_finished(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto& st = self->state;
  if (id >= st.worker_done.size() || st.worker_done[id]) return;
  st.worker_done[id] = true;
  ++st.finished_workers;
  // It leaves the clock vector: BSP and SSP reads stop waiting for it.
  for (auto& shard : st.shard_handles) caf::anon_send(shard, leave_atom::value, id);
  if (st.finished_workers == opts.workers) {
    self->quit();
    return;
  }
  release_barrier_if_complete(self, opts);
}

}  // namespace

coordinator_actor::behavior_type coordinator(self_ptr self, coordinator_options opts) {
  self->state.worker_done.assign(opts.workers, false);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    auto it = st.members.find(dm.source);
    if (it == st.members.end()) return;
    auto who = it->second;
    st.members.erase(it);
    auto w = st.worker_ids.find(dm.source);
    if (w != st.worker_ids.end() && st.worker_done[w->second]) return;  // left after finishing
    tell_observer(self, opts, caf::make_message(failed_atom::value,
                                                who + " went down (" + describe(dm.reason) + ")"));
    if (w != st.worker_ids.end()) worker_finished(self, opts, w->second);
  });
  return {
    [=](register_atom, node_info& info) -> caf::result<registration> {
      auto& st = self->state;
      auto sender = caf::actor_cast<caf::actor>(self->current_sender());
      std::uint32_t id = 0;
      std::string who;
      if (info.role == "server") {
        if (st.shards.size() >= opts.servers)
          return make_ps_error("coordinator: all " + std::to_string(opts.servers) +
                               " servers have registered already");
        id = static_cast<std::uint32_t>(st.shards.size());
        st.shards.push_back({id, info.host, info.port, info.pid, info.handle});
        st.shard_handles.push_back(caf::actor_cast<shard_actor>(sender));
        who = "server shard " + std::to_string(id) +
              (info.host.empty() ? "" : " (" + info.host + ":" + std::to_string(info.port) +
                                          ", pid " + std::to_string(info.pid) + ")");
      } else if (info.role == "worker") {
        if (st.next_worker >= opts.workers)
          return make_ps_error("coordinator: all " + std::to_string(opts.workers) +
                               " workers have registered already");
        id = st.next_worker++;
        who = "worker " + std::to_string(id);
        st.worker_ids[sender.address()] = id;
      } else {
        return make_ps_error("coordinator: unknown role \"" + info.role + "\"");
      }
      if (sender) {
        self->monitor(sender);
        st.members[sender.address()] = who;
      }
      auto rp = self->make_response_promise<registration>();
      st.waiting.push_back(rp);
      st.waiting_ids.push_back(id);
      if (st.shards.size() == opts.servers) {  // the map is complete: hand it out
        auto view = make_view(self, opts);
        for (std::size_t i = 0; i < st.waiting.size(); ++i)
          st.waiting[i].deliver(registration{st.waiting_ids[i], view});
        st.waiting.clear();
        st.waiting_ids.clear();
      }
      return rp;
    },
    [=](barrier_atom, std::uint32_t) -> caf::result<std::uint64_t> {
      auto rp = self->make_response_promise<std::uint64_t>();
      self->state.barrier.push_back(rp);
      release_barrier_if_complete(self, opts);
      return rp;
    },
    [=](report_atom, std::uint32_t worker, std::string& text) {
      tell_observer(self, opts, caf::make_message(report_atom::value, worker, std::move(text)));
    },
    [=](done_atom, std::uint32_t worker, std::string& text) {
      tell_observer(self, opts, caf::make_message(done_atom::value, worker, std::move(text)));
      worker_finished(self, opts, worker);
    },
  };
}

}  // namespace ps
