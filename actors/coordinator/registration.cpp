// Members registering: servers, workers and copies, parked until the map can take them.
#include "actors/coordinator/coordinator_internal.hpp"

namespace ps::coordinator_internal {

// A copy of a shard further down its chain; once every chain is complete the map is
// announced (heads first) and the parked workers get theirs.
caf::result<registration> register_replica(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                           const node_info& info) {
  auto& st = self->state;
  if (!st.core.accepts_copy() || info.shard >= opts.servers || info.position == 0 || info.position >= opts.replication ||
      !sender)
    return make_ps_error("coordinator: unexpected replica (shard " + std::to_string(info.shard) + ", position " +
                         std::to_string(info.position) + ")");
  self->monitor(sender);
  st.members[sender.address()] = "copy " + std::to_string(info.position) + " of shard " + std::to_string(info.shard) +
                                 " (pid " + std::to_string(info.pid) + ")";
  st.shard_ids[sender.address()] = info.shard;
  st.copy_positions[sender.address()] = info.position;
  st.copies.push_back(caf::actor_cast<shard_actor>(sender));
  auto& chain = st.shards[info.shard].chain;
  if (chain.size() <= info.position) chain.resize(info.position + 1);
  chain[info.position] = sender;
  auto reg = make_registration(self, opts, info.shard);
  if (opts.restore) reg.state = encoded_state(*opts.restore, info.shard);
  if (st.core.copy_registered()) {
    // Every chain is complete: heads first, then the copies in order.
    for (std::uint32_t i = 0; i < opts.servers; ++i)
      st.shards[i].chain[0] = caf::actor_cast<caf::actor>(st.shard_handles[i]);
    announce_view(self, opts, [=] { deliver_waiting(self, opts, false); });
  }
  return reg;
}

// A server or worker of the job's start waits for the map (and chains); once every
// server is in, the map goes out.
// `who` names the member in later news; `where` adds its address to the registration's.
caf::result<registration> park_registration(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                            std::uint32_t id, const std::string& who, bool server,
                                            const std::string& where) {
  auto& st = self->state;
  if (sender) {
    self->monitor(sender);
    st.members[sender.address()] = who;
  }
  tell_news(opts, "coordinator: " + who + where + " registered (" + std::to_string(st.shards.size()) + " of " +
                    std::to_string(opts.servers) + " servers, " + std::to_string(st.core.workers_registered()) + " of " +
                    std::to_string(opts.workers) + " workers)");
  auto rp = self->make_response_promise<registration>();
  st.waiting.push_back({rp, id, server});
  if (st.core.map_complete()) {  // the map is complete: hand it out
    // With chains, servers first: each then starts the copies it keeps, and workers
    // wait until every chain is complete.
    deliver_waiting(self, opts, !st.core.chains_complete());
  }
  persist(self, opts);
  return rp;
}

caf::result<registration> register_server(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                          const node_info& info) {
  auto& st = self->state;
  auto admitted = st.core.admit_server();
  if (!admitted) {
    if (!st.core.chains_complete())
      return make_ps_error("coordinator: all " + std::to_string(opts.servers) +
                           " servers have registered already; join once the job runs");
    return join_shard(self, opts, sender, info);
  }
  auto id = *admitted;
  st.shards.push_back({id, info.host, info.port, info.pid, info.handle, {}, 1});
  st.shard_handles.push_back(caf::actor_cast<shard_actor>(sender));
  st.copies.push_back(caf::actor_cast<shard_actor>(sender));
  st.process_heads[id] = caf::actor_cast<shard_actor>(sender);
  st.shard_ids[sender.address()] = id;
  auto who = "server shard " + std::to_string(id) +
             (info.host.empty() ? "" : " (" + info.host + ":" + std::to_string(info.port) + ", pid " +
                                         std::to_string(info.pid) + ")");
  return park_registration(self, opts, sender, id, who, true);
}

caf::result<registration> register_worker(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                          const node_info& info) {
  auto& st = self->state;
  auto admitted = st.core.admit_worker();
  if (!admitted) {
    if (!st.core.chains_complete())
      return make_ps_error("coordinator: all " + std::to_string(opts.workers) +
                           " workers have registered already; join once the job runs");
    return join_running_job(self, opts, sender, info);
  }
  auto id = *admitted;
  st.worker_ids[sender.address()] = id;
  if (sender) st.worker_handles.push_back(caf::actor_cast<worker_actor>(sender));
  auto where = info.host.empty() ? "" : " (" + info.host + ", pid " + std::to_string(info.pid) + ")";
  return park_registration(self, opts, sender, id, "worker " + std::to_string(id), false, where);
}

// A member registers: refused when its version or given settings differ from the job's
// (before the job has all its members that ends the job: it would wait forever).
caf::result<registration> register_member(self_ptr self, const coordinator_options& opts, const node_info& info) {
  auto& st = self->state;
  if (st.core.ending()) return st.end_reason ? st.end_reason : make_ps_error("coordinator: the job has ended");
  if (auto why = refusal(opts, info); !why.empty()) {
    auto text = "the coordinator refused " + member_name(info) + ": " + why;
    auto rp = self->make_response_promise<registration>();
    rp.deliver(make_error(errc::refused, text));
    if (!st.core.chains_complete() || st.core.workers_registered() < opts.workers) end_job(self, opts, errc::job_failed, text);
    return rp;
  }
  if (st.core.resuming())
    return make_error(errc::refused, "coordinator: " + member_name(info) + " cannot register while the coordinator "
                                     "resumes the job; register again once its members are back");
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (info.role == "server") return register_server(self, opts, sender, info);
  if (info.role == "worker") return register_worker(self, opts, sender, info);
  if (info.role == "replica") return register_replica(self, opts, sender, info);
  return make_ps_error("coordinator: unknown role \"" + info.role + "\"");
}

// ---- a resumed job (--resume) ------------------------------------------------------

// Whether shard `id` was leaving when the coordinator died: out of the map, yet holding
// keys it has not handed over, so it must come back.
bool leaving_now(const coordinator_state& st, std::uint32_t id) { return st.change == "leave" && st.change_shard == id; }

}  // namespace ps::coordinator_internal
