// A resumed job (--resume): the coordinator's record read back, members rejoining, the
// chains assembled again, absentees given up.
#include "actors/coordinator/coordinator_internal.hpp"

namespace ps::coordinator_internal {

// The chain of shard `id` in a resumed job's saved order: its copies by the place they
// were started at (a job without chains: its one copy at 0).
std::vector<std::uint32_t> saved_chain(const coordinator_options& opts, std::uint32_t id) {
  if (!opts.resume || id >= opts.resume->shards.size() || opts.resume->shards[id].chain.empty()) return {0};
  return opts.resume->shards[id].chain;
}

// The copies that came back take their places: each shard's chain in its saved order,
// closed over those that did not, and its head.
void assemble_chains(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  for (auto& [id, back] : st.rejoined_copies) {
    std::vector<caf::actor> chain;
    for (auto position : saved_chain(opts, id))
      if (auto copy = back.find(position); copy != back.end()) chain.push_back(copy->second);
    if (chain.empty()) continue;
    st.shard_handles[id] = caf::actor_cast<shard_actor>(chain.front());
    st.shards[id].since_epoch = st.epoch + 1;  // the map that announces it (clients take newer entries only)
    if (opts.replication >= 2) {
      st.shards[id].handle = chain.front();
      st.shards[id].chain = std::move(chain);
    }
  }
  st.rejoined_copies.clear();
}


// Every member is back (or given up): a map change that was under way is finished, then
// the job goes on.
void finish_resume(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  if (!st.core.resuming() || !st.absent_copies.empty() || !st.core.absent_workers().empty()) return;
  assemble_chains(self, opts);
  if (!st.change.empty()) return finish_change(self, opts);
  go_on_resumed(self, opts);
}

// A map change was under way when the coordinator died: its shards are asked for their
// handoffs again under the saved (new) map, in the order the change asks them; those that
// had made theirs answer once it is complete. A leaver then goes, as it would have.
void finish_change(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  auto view = make_view(self, opts);
  view.epoch = std::min(view.epoch, st.change_epoch);  // the change's own map (chains may have closed since)
  const bool leaving = st.change == "leave";
  const auto id = st.change_shard;
  const auto what = std::string(leaving ? "shard " : "server shard ") + std::to_string(id) + (leaving ? " leaving" : " joining");
  tell_news(opts, "coordinator: " + what + " was under way when the coordinator went down; finishing its handoffs (epoch " +
                    std::to_string(view.epoch) + ")");
  auto failed = [=](const std::string& why) {
    end_job(self, opts, errc::job_failed, what + " could not be finished after the coordinator's restart: " + why);
  };
  auto done = [=] {
    if (leaving) let_leaver_go(self, id);
    else end_change(self);
    tell_news(opts, "coordinator: " + what + ": done");
    go_on_resumed(self, opts);
    if (leaving) stop_if_drained(self, opts, id);
  };
  tell_map_change(opts, true);
  // The chains as they were assembled (copies that did not come back left them): a copy
  // waiting on a dead successor would hold its head's takeovers, and so the change.
  tell_chains(self, opts);
  hand_over(self, opts, live_ids(st), view, [=](const std::string& why) {
    if (!why.empty()) return failed(why);
    if (!leaving) return done();
    hand_over(self, opts, {id}, view, [=](const std::string& why) {
      if (!why.empty()) return failed(why);
      done();
    });
  });
}

// The resumed job goes on under a new epoch, whose map names this coordinator's
// checkpointer, and is saved again.
void go_on_resumed(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  st.core.resumed();
  ++st.epoch;
  tell_news(opts, "coordinator: resumed the job: " + std::to_string(live_heads(st).size()) + " shards" +
                    (opts.replication >= 2 ? " (" + std::to_string(st.copies.size()) + " copies)" : "") + " and " +
                    std::to_string(st.core.running_workers()) + " running workers are back; epoch " +
                    std::to_string(st.epoch));
  tell_members(self);
  announce_view(self, opts);
  go_on(self, opts);
  grow_chains(self, opts);  // over copies that did not come back
}

// Takes over the dead coordinator's job from its saved state: the map as it was, the
// shards without handles until they rejoin, the finished workers' results (the observer
// hears them again), the barriers released.
void resume_job(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  const auto& r = *opts.resume;
  st.epoch = r.epoch;
  st.placement = r.placement;
  st.retired.insert(r.retired.begin(), r.retired.end());
  st.change = r.change;
  st.change_shard = r.change_shard;
  st.change_epoch = r.change_epoch;
  st.joining = !st.change.empty();  // finished once the members are back; no other change before
  std::size_t copies = 0;
  for (const auto& s : r.shards) {
    st.shards.push_back({s.id, s.host, s.port, s.pid, {}, {}, 1});
    if (st.retired.count(s.id) && !leaving_now(st, s.id)) continue;
    auto chain = saved_chain(opts, s.id);
    st.absent_copies[s.id].insert(chain.begin(), chain.end());
    copies += chain.size();
  }
  st.shard_handles.resize(r.shards.size());
  st.core.resume_from(r);
  for (const auto& [w, res] : r.results) {
    tell(opts, "worker " + std::to_string(w) + " finished: " + res.json, done_atom::value, worker_result{w, res.ok, res.json});
  }
  tell_checkpointer(opts, make_view(self, opts));  // the map as it was: parts may come before the members
  tell_news(opts, "coordinator: resuming the job at epoch " + std::to_string(st.epoch) + "; waiting up to " +
                    std::to_string(opts.rejoin_patience.count()) + " ms for " + std::to_string(st.absent_copies.size()) +
                    " shards" + (opts.replication >= 2 ? " (" + std::to_string(copies) + " copies)" : "") + " and " +
                    std::to_string(st.core.absent_workers().size()) + " workers to come back");
  self->delayed_send(self, opts.rejoin_patience, rejoin_atom::value);
  finish_resume(self, opts);
}

// The rejoin deadline: a shard with no copy back is dead (recovered from a checkpoint,
// or the job fails), its chain closes over the copies still away; a worker still away
// leaves the clock vector.
void give_up_absent(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  if (!st.core.resuming()) return;
  const auto why = make_ps_error("it did not come back within " + std::to_string(opts.rejoin_patience.count()) +
                                 " ms of the coordinator's restart");
  for (auto w : st.core.give_up_absent()) {
    tell_news(opts, "worker " + std::to_string(w) + " went down (" + describe(why) + "); it leaves the clock vector");
    worker_finished(self, opts, w);
  }
  if (!st.core.resuming()) return;  // the last worker's end finished the resume
  auto absent = std::move(st.absent_copies);
  st.absent_copies.clear();
  std::vector<std::uint32_t> dead;
  for (const auto& [id, positions] : absent) {
    if (!st.rejoined_copies.count(id)) {
      dead.push_back(id);
      continue;
    }
    for (auto position : positions)
      tell_news(opts, "copy " + std::to_string(position) + " of shard " + std::to_string(id) + " went down (" +
                        describe(why) + "); the shard's chain closes over it, nothing lost");
  }
  if (dead.empty()) return finish_resume(self, opts);
  if (!st.change.empty()) {  // the change cannot be finished: a shard's keys would have no owner
    std::string ids;
    for (auto id : dead) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    return end_job(self, opts, errc::job_failed,
                   "a " + st.change + " of shard " + std::to_string(st.change_shard) +
                     " was under way when the coordinator went down, and shard " + ids + " did not come back within " +
                     std::to_string(opts.rejoin_patience.count()) +
                     " ms: the change cannot be finished; restart the job from its newest checkpoint (--restore)");
  }
  assemble_chains(self, opts);  // the shards that are back, before the replacements' maps go out
  st.core.resumed();            // the replacements' maps go out as they are placed
  for (auto id : dead) recover_shard(self, opts, id, "server shard " + std::to_string(id), why);
}

// A shard that left the map before the coordinator died, still serving the requests
// clients had sent it: it stops as it would have, once they say they need it no more
// (their word to the dead coordinator is lost: at the latest, when the job ends).
caf::result<registration> rejoin_drained_leaver(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                                std::uint32_t id) {
  auto& st = self->state;
  st.shard_handles[id] = caf::actor_cast<shard_actor>(sender);
  auto& waiting = st.draining_clients[id];
  for (auto w : st.core.running_ids()) waiting.insert(w);
  auto reg = make_registration(self, opts, id);
  stop_if_drained(self, opts, id);
  return reg;
}

// A copy of a shard comes back (role "server": the shard's own, or its replacement;
// "replica": a copy further down its chain, by the place it was started at).
caf::result<registration> rejoin_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                       const node_info& info) {
  auto& st = self->state;
  auto id = info.shard;
  const bool replica = info.role == "replica";
  const auto position = replica ? info.position : 0;
  auto who = (replica ? "copy " + std::to_string(position) + " of shard " : "server shard ") + std::to_string(id) +
             (info.host.empty() ? "" : " (" + info.host + ":" + std::to_string(info.port) + ", pid " +
                                         std::to_string(info.pid) + ")");
  if (id < st.shards.size() && st.retired.count(id) && !leaving_now(st, id)) {
    if (!replica) return rejoin_drained_leaver(self, opts, sender, id);
    // A copy of a shard that left, not stopped yet: it stops with its shard, as it would have.
    st.leavers_copies[id].push_back(sender);
    return make_registration(self, opts, id);
  }
  auto absent = st.absent_copies.find(id);
  if (id >= st.shards.size() || (st.retired.count(id) && !leaving_now(st, id)) || absent == st.absent_copies.end() ||
      !absent->second.count(position))
    return make_error(errc::refused, "coordinator: " + who + " cannot rejoin: the resumed job " +
                                       (id < st.shards.size() && !st.retired.count(id) ? "has it back already or gave it up"
                                                                                     : "has no such shard"));
  absent->second.erase(position);
  if (absent->second.empty()) st.absent_copies.erase(absent);
  if (!replica) {
    auto& entry = st.shards[id];
    std::tie(entry.host, entry.port, entry.pid) = std::tie(info.host, info.port, info.pid);
    if (!st.retired.count(id)) st.process_heads[id] = caf::actor_cast<shard_actor>(sender);  // joiners host copies too
  } else {
    st.copy_positions[sender.address()] = position;
  }
  st.rejoined_copies[id][position] = sender;
  st.copies.push_back(caf::actor_cast<shard_actor>(sender));
  st.shard_ids[sender.address()] = id;
  st.members[sender.address()] = who + " (rejoined)";
  self->monitor(sender);
  // Workers that ended while it was away (or before it came back) leave its clock vector.
  for (auto w : st.core.finished_ids()) caf::anon_send(sender, leave_atom::value, w);
  auto reg = make_registration(self, opts, id);
  finish_resume(self, opts);
  return reg;
}

// A worker's client rejoins for its worker (info.handle, told when the job ends); a
// worker that finished only comes back to send its result again.
caf::result<registration> rejoin_worker(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                        const node_info& info) {
  auto& st = self->state;
  auto id = info.shard;
  auto who = "worker " + std::to_string(id) + " (pid " + std::to_string(info.pid) + ")";
  if (id >= st.core.worker_done().size())
    return make_error(errc::refused, "coordinator: " + who + " cannot rejoin: no such worker");
  if (st.core.worker_done()[id]) return make_registration(self, opts, id);
  if (!st.core.worker_back(id))
    return make_error(errc::refused, "coordinator: " + who + " cannot rejoin: the resumed job has it back already or gave it up");
  if (info.handle) {
    self->monitor(info.handle);
    st.worker_ids[info.handle.address()] = id;
    st.worker_handles.push_back(caf::actor_cast<worker_actor>(info.handle));
    st.members[info.handle.address()] = who + " (rejoined)";
  }
  auto sub = caf::actor_cast<client_actor>(sender);
  st.view_subscribers.push_back(sub);
  st.subscriber_workers[sub.address()] = id;
  auto reg = make_registration(self, opts, id);
  finish_resume(self, opts);
  return reg;
}

// A member of the dead coordinator's job comes back: only to a coordinator that resumed it.
caf::result<registration> rejoin_member(self_ptr self, const coordinator_options& opts, const node_info& info) {
  auto& st = self->state;
  auto refuse = [&](const std::string& why) {
    return make_error(errc::refused, "coordinator: " + member_name(info) + " cannot rejoin: " + why);
  };
  if (!opts.resume) return refuse("this coordinator did not resume a job (start it with --state-dir=DIR --resume)");
  if (st.core.ending()) return refuse("the job is ending");
  if (auto why = refusal(opts, info); !why.empty()) return refuse(why);
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (!sender) return refuse("the message came without a sender");
  if (info.role == "server" || info.role == "replica") return rejoin_shard(self, opts, sender, info);
  if (info.role == "worker") return rejoin_worker(self, opts, sender, info);
  return refuse("a " + info.role + " does not rejoin");
}

}  // namespace ps::coordinator_internal
