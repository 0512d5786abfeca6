// Copies and shards that fail: failover along a chain, recovery from a copy or a
// checkpoint, and members that go down.
#include "actors/coordinator/coordinator_internal.hpp"

namespace ps::coordinator_internal {

// A copy of shard `id` died. With a copy left, the chain closes over the gap; with none,
// the shard is recovered from a checkpoint (or the job ends).
void copy_failed(self_ptr self, const coordinator_options& opts, std::uint32_t id, const caf::actor_addr& gone,
                 const std::string& who, const caf::error& reason) {
  auto& st = self->state;
  st.copies.erase(std::remove_if(st.copies.begin(), st.copies.end(), [&](const shard_actor& c) { return c.address() == gone; }),
                  st.copies.end());
  if (st.core.resuming() && !copy_failed_while_resuming(self, id, gone)) return;
  // A growth whose seeding tail this was is given up at once (its request would wait for
  // its timeout), once the chain no longer names it.
  auto give_up = st.growing && st.growth_tail == gone ? std::exchange(st.growth_abort, nullptr) : nullptr;
  const std::string tail_died = "its tail went down while seeding the new copy";
  auto& chain = st.shards[id].chain;
  chain.erase(std::remove_if(chain.begin(), chain.end(), [&](const caf::actor& c) { return c.address() == gone; }),
              chain.end());
  if (opts.replication < 2 || !st.core.chains_complete() || chain.empty()) {
    if (give_up) give_up(tail_died);
    return recover_shard(self, opts, id, who, reason);
  }
  ++st.epoch;
  st.shards[id].handle = chain.front();
  st.shards[id].since_epoch = st.epoch;
  st.shard_handles[id] = caf::actor_cast<shard_actor>(chain.front());
  if (give_up) give_up(tail_died);
  tell_news(opts, who + " went down (" + describe(reason) + "); shard " + std::to_string(id) + "'s chain closed over it: " +
    std::to_string(chain.size()) + " cop" + (chain.size() == 1 ? "y" : "ies") + " left, epoch " +
    std::to_string(st.epoch) + "; nothing lost");
  if (!st.change.empty()) {  // the clients get the map once the change is over
    tell_chains(self, opts);
    return ask_again_after_failover(self, opts, id);
  }
  announce_view(self, opts);
  if (auto retry = std::move(st.retry_move)) {  // shards were being asked whether they can move
    st.retry_move = nullptr;
    return retry();
  }
  if (!st.joining) grow_chains(self, opts);  // while shards are asked whether they can move: after that
}


// A shard with no copy left died: its recovery reads the newest checkpoint, so a file
// still being written (its parts were all in before the death) is waited for first.
void recover_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                   const caf::error& reason) {
  if (!opts.checkpointer || opts.checkpoint_dir.empty()) return shard_failed(self, opts, id, who, reason);
  self->request(opts.checkpointer, std::chrono::seconds(60), flush_atom::value)
    .then([=](caf::ok_atom) { shard_failed(self, opts, id, who, reason); },
          [=](caf::error&) { shard_failed(self, opts, id, who, reason); });  // recovers from what is there
}

// The newest intact checkpoint in dir laid out for map, or why there is none; read on a
// thread of its own (the file holds the whole model, and rows on a disk tier laid out for
// another map are streamed into new stores), never in a handler.
void read_recovery_source(self_ptr self, const coordinator_options& opts, const partitioner& map, std::uint32_t dead,
                          std::function<void(std::shared_ptr<const recovery_source>)> then) {
  // Rows on a disk tier go to a directory of this recovery's own (two shards that die
  // together are recovered side by side), only the dead shard's.
  auto read = [dir = opts.checkpoint_dir, map, dead](caf::event_based_actor* reader) -> caf::behavior {
    return {[=](restore_atom) {
      auto out = std::make_shared<recovery_source>();
      try {
        auto latest = load_latest(dir);
        out->refused = std::move(latest.refused);
        out->path = latest.path;
        if (!latest.found) {
          out->error = "no checkpoint has been written to " + dir + " yet";
        } else {
          const auto rows_dir = (std::filesystem::path(dir) / disk_rows_dir_name(latest.found->header.clock)).string();
          try {  // written under another map (before shards joined or left): its keys go where they are now
            out->found = laid_out_for(std::move(*latest.found), map, recovery_layout_dir(rows_dir, map.epoch(), dead), dead);
          } catch (const bad_request& e) {
            out->error = latest.path + " cannot be laid out for the current map: " + e.what();
          }
        }
      } catch (const bad_request& e) {
        out->error = std::string("no checkpoint to recover from: ") + e.what();
      }
      reader->quit();
      return std::shared_ptr<const recovery_source>(std::move(out));
    }};
  };
  auto reader = opts.checkpoint_reads_on_scheduler ? self->spawn(read) : self->spawn<caf::detached>(read);
  self->request(reader, caf::infinite, restore_atom::value)
    .then([then](std::shared_ptr<const recovery_source>& source) { then(std::move(source)); },
          [then](caf::error& e) {
            auto failed = std::make_shared<recovery_source>();
            failed->error = "reading the checkpoint failed: " + describe(e);
            then(std::move(failed));
          });
}


// A dead shard that cannot be recovered (why): workers stop waiting for a replacement
// that will not come; the job ends.
void unrecoverable(self_ptr self, const coordinator_options& opts, const std::string& who, const caf::error& reason,
                   const std::string& why) {
  end_job(self, opts, errc::job_failed, who + " went down (" + describe(reason) + "); " + why);
}

// A shard died. Without replicas its keys come back from the newest intact checkpoint,
// onto a replacement shard in a live server process; what the checkpoint lacks is reported.
void shard_failed(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                  const caf::error& reason) {
  auto& st = self->state;
  auto fail = [=](const std::string& why) { unrecoverable(self, opts, who, reason, why); };
  if (!st.core.map_out()) return fail("the cluster never formed");
  if (opts.checkpoint_dir.empty())
    return fail("its keys are lost: recovery needs checkpoints (--checkpoint-dir, --checkpoint-every)");
  const auto map = map_of(make_view(self, opts));
  read_recovery_source(self, opts, map, id, [=](std::shared_ptr<const recovery_source> source) {
    if (self->state.core.ending()) return;
    for (const auto& r : source->refused) tell_news(opts, "checkpoint refused: " + r);
    if (!source->error.empty()) return fail(source->error);
    if (self->state.epoch != map.epoch())  // the map changed meanwhile: laid out again for the new one
      return shard_failed(self, opts, id, who, reason);
    recover_from(self, opts, id, who, reason, *source->found, source->path);
  });
}

// The dead shard's section of ckpt (laid out for the current map) onto a replacement.
void recover_from(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                  const caf::error& reason, const checkpoint& ckpt, const std::string& source) {
  auto& st = self->state;
  auto section = std::find_if(ckpt.shards.begin(), ckpt.shards.end(), [&](const shard_snapshot& s) { return s.shard == id; });
  if (section == ckpt.shards.end())
    return unrecoverable(self, opts, who, reason, source + " has no section for shard " + std::to_string(id));
  // The dead entry stays in the map until the replacement is placed; the epoch moves then
  // (each announced map needs its own epoch: clients ignore one they have seen).
  auto reg = make_registration(self, opts, id, encoded_state(ckpt, id));
  auto departed = st.core.finished_ids();
  auto clock = ckpt.header.clock;
  auto placed = [=](shard_actor shard, const std::string& where, std::uint32_t pid) {
    auto& st = self->state;
    ++st.epoch;
    auto handle = caf::actor_cast<caf::actor>(shard);
    st.shards[id] = {id, "", 0, pid, handle, {}, st.epoch};
    if (opts.replication >= 2) st.shards[id].chain = {handle};
    st.shard_handles[id] = shard;
    st.copies.push_back(shard);
    self->monitor(handle);
    st.members[handle.address()] = "replacement shard " + std::to_string(id) + " (in " + where + ")";
    st.shard_ids[handle.address()] = id;
    tell_news(opts, who + " went down (" + describe(reason) + "); its keys were restored from " + source + " (clock " +
      std::to_string(clock) + ") onto a replacement shard in " + where + "; epoch " + std::to_string(st.epoch) +
      ". Updates to those keys from clock " + std::to_string(clock) +
      " on that the workers cannot resend are lost; the replacement reports them per worker.");
    announce_view(self, opts);
  };
  // Here, in the coordinator's process: only when no server process can take it.
  auto place_here = [=](const std::string& why) {
    auto sopts = opts.replacement;
    sopts.replaces = std::make_shared<shard_options::replacement>(shard_options::replacement{reg, clock, departed, source});
    placed(self->spawn(server_shard, caf::actor_cast<coordinator_actor>(self), sopts),
           "the coordinator's process (" + why + ")", static_cast<std::uint32_t>(getpid()));
  };
  // A live server process takes it: the head of the lowest-numbered live shard that is
  // not in the dead shard's process (its other actors die with it, their down messages
  // may still be on the way).
  shard_actor host;
  std::string host_name;
  std::uint32_t host_pid = 0;
  auto dead_pid = st.shards[id].pid;
  for (std::uint32_t i = 0; i < st.shard_handles.size() && !host; ++i) {
    if (i == id || !st.shard_ids.count(st.shard_handles[i].address()) || st.shards[i].pid == dead_pid) continue;
    host = st.shard_handles[i];
    host_name = "the process of server shard " + std::to_string(i) +
                (st.shards[i].host.empty() ? "" : " (" + st.shards[i].host + ", pid " + std::to_string(st.shards[i].pid) + ")");
    host_pid = st.shards[i].pid;
  }
  if (!host) return place_here("no live server left");
  self->request(host, std::chrono::seconds(3), restore_atom::value, reg, clock, departed, source)
    .then([=](caf::actor& shard) { placed(caf::actor_cast<shard_actor>(shard), host_name, host_pid); },
          [=](caf::error& err) { place_here(host_name + " refused: " + describe(err)); });
}

encoded_block encoded_state(const checkpoint& c, std::uint32_t shard) {
  for (const auto& s : c.shards)
    if (s.shard == shard) return snapshot_block(s);
  throw bad_request("the checkpoint has no section for shard " + std::to_string(shard));
}

// A worker joins the running job: every shard copy enters it into its clock vector; it
// starts at the highest of their minimum clocks, so it never reads behind anyone.
caf::result<registration> join_running_job(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                           const node_info& info) {
  auto& st = self->state;
  auto id = st.core.add_worker();
  if (sender) {
    self->monitor(sender);
    st.members[sender.address()] = "worker " + std::to_string(id) + " (joined, pid " + std::to_string(info.pid) + ")";
    st.worker_ids[sender.address()] = id;
    st.worker_handles.push_back(caf::actor_cast<worker_actor>(sender));
  }
  auto rp = self->make_response_promise<registration>();
  auto start = std::make_shared<std::uint64_t>(0);
  auto remaining = std::make_shared<std::size_t>(st.copies.size());
  auto answer = [=]() mutable {
    if (--*remaining > 0) return;
    tell_news(opts, "worker " + std::to_string(id) + " joined at clock " + std::to_string(*start) + " (pid " +
      std::to_string(info.pid) + "); " + std::to_string(self->state.core.running_workers()) +
      " workers now");
    auto reg = make_registration(self, opts, id, {}, *start);
    rp.deliver(std::move(reg));
    tell_members(self);
    persist(self, opts);
  };
  for (auto& copy : st.copies)
    self->request(copy, std::chrono::seconds(10), join_atom::value, id)
      .then([=](std::uint64_t min) mutable { *start = std::max(*start, min); answer(); },
            [=](caf::error&) mutable { answer(); });  // a dead copy: its failover carries the vector on
  return rp;
}

std::chrono::milliseconds checkpoint_period(const coordinator_options& opts) {
  return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  std::chrono::duration<double>(opts.checkpoint_seconds)));
}

// A member went down: a shard copy fails over, a worker leaves the clock vector.
void member_down(self_ptr self, const coordinator_options& opts, const caf::down_msg& dm) {
  auto& st = self->state;
  auto it = st.members.find(dm.source);
  if (it == st.members.end()) return;
  auto who = it->second;
  st.members.erase(it);
  if (st.core.ending()) return;  // members end with the job: no failover, no news
  for (auto p = st.process_heads.begin(); p != st.process_heads.end(); ++p)
    if (p->second.address() == dm.source) {
      st.process_heads.erase(p);
      break;
    }
  if (auto s = st.shard_ids.find(dm.source); s != st.shard_ids.end()) {
    auto id = s->second;
    st.shard_ids.erase(s);
    copy_failed(self, opts, id, dm.source, who, dm.reason);
    return;
  }
  auto w = st.worker_ids.find(dm.source);
  if (w == st.worker_ids.end() || !st.core.worker_running(w->second)) return;  // left after finishing
  // A dead worker leaves the clock vector; the others go on without it.
  tell_news(opts, who + " went down (" + describe(dm.reason) + "); it leaves the clock vector, the others go on");
  worker_finished(self, opts, w->second);
}

}  // namespace ps::coordinator_internal
