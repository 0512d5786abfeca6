// The job as a whole: its view, the news, the coordinator's record, barriers, and its end
// (finished, stopped or failed, with the final checkpoint).
#include "actors/coordinator/coordinator_internal.hpp"

namespace ps::coordinator_internal {

cluster_view make_view(self_ptr self, const coordinator_options& opts) {
  cluster_view v;
  v.epoch = self->state.epoch;
  v.vnodes = opts.vnodes;
  v.bucket_bits = opts.bucket_bits;
  v.dense.ranges = dense_ranges(opts.spec);
  for (const auto& t : opts.tables) v.tables.push_back(table_msg::from(t));
  v.num_workers = static_cast<std::uint32_t>(self->state.core.worker_done().size());
  v.job_workers = opts.workers;
  v.consistency = {opts.staleness};
  v.checkpoint_every = opts.checkpoint_every;
  v.checkpointer = opts.checkpointer;
  if (opts.checkpointer) v.checkpoint_dir = opts.checkpoint_dir;
  v.replication = opts.replication;
  // Every entry names its head: shards hand keys to each other when the map changes.
  for (const auto& e : self->state.shards)
    if (!self->state.retired.count(e.id)) {
      v.shards.push_back(e);
      if (!v.shards.back().handle && e.id < self->state.shard_handles.size())
        v.shards.back().handle = caf::actor_cast<caf::actor>(self->state.shard_handles[e.id]);
    }
  v.rule = rule_msg::from(opts.rule);
  for (const auto& [bucket, owner] : self->state.placement) {
    v.placed_buckets.push_back(bucket);
    v.placed_owners.push_back(owner);
  }
  return v;
}

// A registration answer: the member's id, the map and the job contract.
registration make_registration(self_ptr self, const coordinator_options& opts, std::uint32_t id,
                               encoded_block state, std::uint64_t start_clock) {
  return {id, make_view(self, opts), std::move(state), start_clock, job_spec_msg::from(opts.spec),
          self->state.core.barrier_generation()};
}

// The ids of the shards in the map (not those that left it).
std::vector<std::uint32_t> live_ids(const coordinator_state& st) {
  std::vector<std::uint32_t> ids;
  for (std::uint32_t i = 0; i < st.shard_handles.size(); ++i)
    if (!st.retired.count(i)) ids.push_back(i);
  return ids;
}

// The heads of those shards.
std::vector<shard_actor> live_heads(const coordinator_state& st) {
  std::vector<shard_actor> heads;
  for (auto id : live_ids(st)) heads.push_back(st.shard_handles[id]);
  return heads;
}

// The cluster's own news (failovers, joins, departures).
void tell_news(const coordinator_options& opts, const std::string& text) { tell(opts, text, news_atom::value, text); }

// The workers that are still running, for the clients (data partitions follow them).
void tell_members(self_ptr self) {
  auto& st = self->state;
  auto live = st.core.running_ids();
  for (auto& sub : st.view_subscribers) caf::anon_send(sub, members_atom::value, live);
}

coordinator_record record_of(const coordinator_state& st, const coordinator_options& opts) {
  coordinator_record r;
  r.job_fingerprint = fingerprint_hex(opts.spec);
  r.servers = opts.servers;
  r.workers = opts.workers;
  r.epoch = st.epoch;
  r.placement = st.placement;
  r.retired.assign(st.retired.begin(), st.retired.end());
  for (const auto& e : st.shards) {
    r.shards.push_back({e.id, e.host, e.port, e.pid, {}});
    for (const auto& copy : e.chain) {
      auto at = st.copy_positions.find(copy.address());
      r.shards.back().chain.push_back(at == st.copy_positions.end() ? 0 : at->second);
    }
  }
  r.worker_done = st.core.worker_done();
  r.results = st.core.results();
  r.barrier_generation = st.core.barrier_generation();
  r.change = st.change;
  r.change_shard = st.change_shard;
  r.change_epoch = st.change_epoch;
  return r;
}

// --state-dir: saves what a resumed coordinator needs, once the job has formed (before,
// there is nothing to resume: members started afresh find a fresh coordinator).
void persist(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  if (opts.state_dir.empty() || !st.core.may_persist()) return;
  try {
    save_record(opts.state_dir, record_of(st, opts));
  } catch (const bad_request& e) {
    tell_news(opts, std::string("coordinator: ") + e.what() + "; a restart could not resume from it");
  }
}

// Carries out what the core decided, in its order (job_effects): workers leave the clock
// vector (and the drains of shards that left), the clients hear who runs, the record is
// saved, then a released barrier is delivered; last the job finishes, fails, or a resume
// may be complete.
void carry_out(self_ptr self, const coordinator_options& opts, const job_effects& fx) {
  auto& st = self->state;
  for (auto w : fx.left) {
    std::vector<std::uint32_t> drained;
    for (auto& [shard, workers] : st.draining_clients)
      if (workers.erase(w) && workers.empty()) drained.push_back(shard);
    for (auto shard : drained) stop_if_drained(self, opts, shard);
    for (auto& copy : st.copies) caf::anon_send(copy, leave_atom::value, w);
  }
  if (fx.members_changed) tell_members(self);
  if (fx.persist) persist(self, opts);
  if (fx.released)
    for (auto w : fx.release_to)
      if (auto it = st.barrier.find(w); it != st.barrier.end()) {
        it->second.deliver(*fx.released);
        st.barrier.erase(it);
      }
  if (fx.check_resume) finish_resume(self, opts);
  else if (!fx.fail.empty()) end_job(self, opts, errc::job_failed, fx.fail);
  else if (fx.finish) finish_job(self, opts);
}

// A worker's barrier number `generation`: answered at once when released before.
caf::result<std::uint64_t> enter_barrier(self_ptr self, const coordinator_options& opts, std::uint32_t worker,
                                         std::uint64_t generation) {
  auto& st = self->state;
  job_effects fx;
  auto answer = st.core.enter_barrier(worker, generation, fx);
  if (answer.kind == barrier_answer::ended) return st.end_reason;
  if (answer.kind == barrier_answer::now) return answer.generation;
  if (answer.kind == barrier_answer::refused) return make_ps_error(answer.why);
  auto rp = self->make_response_promise<std::uint64_t>();
  st.barrier[worker] = rp;  // one sent again (after a restart) replaces the first
  carry_out(self, opts, fx);
  return rp;
}

// The job cannot go on, or was stopped: parked registrations and barriers get the
// reason, the workers' clients fail their requests to every shard at once, the observer
// hears it, and the coordinator quits with it (every member monitors the coordinator and
// ends with this reason and its exit status).
// The reason reaches members as a message, acknowledged by the shards before the
// coordinator quits: its process may exit at once, and a down message still queued in
// the network layer would then arrive as a plain lost connection.
// completed: the job ended as it should (code and text unused), members end normally.
void end_job(self_ptr self, const coordinator_options& opts, errc code, const std::string& text,
             bool completed) {
  auto& st = self->state;
  std::vector<std::uint32_t> parked;  // the workers at the barrier
  if (!st.core.begin_end(parked)) return;
  auto err = completed ? caf::error{} : make_error(code, text);
  st.end_reason = err;
  auto wire_code = completed ? std::uint8_t{0} : static_cast<std::uint8_t>(code);
  for (auto& w : st.waiting) w.promise.deliver(err);
  st.waiting.clear();
  for (auto w : parked)
    if (auto it = st.barrier.find(w); it != st.barrier.end()) it->second.deliver(err);
  st.barrier.clear();
  // Nothing is left to resume (a restart with --resume is refused, naming why).
  if (!opts.state_dir.empty()) std::remove(record_path(opts.state_dir).c_str());
  if (!completed) {
    for (auto& w : st.worker_handles) caf::anon_send(w, stop_atom::value, wire_code, text);
    for (auto& sub : st.view_subscribers)
      for (const auto& s : st.shards) caf::anon_send(sub, failed_atom::value, s.id, text);
  }
  // A stop is no failure: the observer learns it from the coordinator's exit reason.
  if (!completed && (code == errc::job_failed || code == errc::failed))
    tell(opts, "coordinator: " + text, job_failed_atom::value, text);
  // A failed job lingers a moment, so a member whose registration was on its way when the
  // job ended learns why (the register handler answers with the reason).
  auto quit = [=] {
    if (completed)
      self->quit();
    else
      self->delayed_send(self, std::chrono::milliseconds(500), end_atom::value);
  };
  auto to_stop = st.copies;
  for (const auto& [id, workers] : st.draining_clients) to_stop.push_back(st.shard_handles[id]);
  st.draining_clients.clear();
  auto remaining = std::make_shared<std::size_t>(to_stop.size());
  if (*remaining == 0) return quit();
  auto acked = [=] {
    if (--*remaining == 0) quit();
  };
  for (auto& copy : to_stop)
    self->request(copy, std::chrono::seconds(2), stop_atom::value, wire_code, text)
      .then([=](caf::ok_atom) { acked(); }, [=](caf::error&) { acked(); });
}

// The final checkpoint at `clock`: every head sends its part; the job ends once the file
// is written, or fails when it cannot be (the trained parameters would be lost).
void write_final_checkpoint(self_ptr self, const coordinator_options& opts, std::uint64_t clock) {
  self->request(opts.checkpointer, std::chrono::seconds(120), await_atom::value, clock)
    .then([=](const std::string& path) {
            tell_news(opts, "coordinator: final checkpoint " + path + " (clock " + std::to_string(clock) + ")");
            end_job(self, opts, errc::failed, "", true);
          },
          [=](caf::error& err) {
            end_job(self, opts, errc::job_failed, "the final checkpoint was not written: " + describe(err));
          });
  for (auto& head : live_heads(self->state)) caf::anon_send(head, final_atom::value, clock);
}


// An operator's stop (psctl stop, SIGINT, SIGTERM): with --checkpoint-dir the job first
// cuts a checkpoint at the next clock boundary and waits for its file, at most 1.5 s (a
// stop must end the job within 2 s); a failure for any other reason ends it at once.
void stop_job(self_ptr self, const coordinator_options& opts, errc kind, const std::string& why) {
  switch (self->state.core.begin_stop(kind == errc::job_failed, static_cast<bool>(opts.checkpointer))) {
    case stop_plan::end_now: return end_job(self, opts, kind, why);
    case stop_plan::already_stopping: return;  // its checkpoint is on the way; the job ends after it
    case stop_plan::checkpoint_first: break;
  }
  auto end = [=](const std::string& news) {
    tell_news(opts, news);
    end_job(self, opts, kind, why);
  };
  cut_checkpoint(
    self,
    [=](std::uint64_t boundary) {
      self->request(opts.checkpointer, std::chrono::milliseconds(1500), await_atom::value, boundary)
        .then([=](const std::string& path) { end("coordinator: last checkpoint before the stop: " + path); },
              [=](caf::error& e) { end("coordinator: no checkpoint before the stop (" + describe(e) + ")"); });
    },
    [=](std::string failed) { end(failed); });
}

// Every worker is done. With --checkpoint-dir the job ends with a final checkpoint,
// labelled above every clock a worker reached or pushed; otherwise it ends now.
void finish_job(self_ptr self, const coordinator_options& opts) {
  auto heads = live_heads(self->state);
  if (!opts.checkpointer || heads.empty()) return end_job(self, opts, errc::failed, "", true);
  auto not_written = [=](const std::string& why) {
    end_job(self, opts, errc::job_failed, "the final checkpoint was not written: " + why);
  };
  auto with_clocks = [=](std::vector<std::uint64_t> clocks) {
    auto highest = *std::max_element(clocks.begin(), clocks.end());
    // A periodic checkpoint at that clock already holds the final state.
    self->request(opts.checkpointer, std::chrono::seconds(5), final_atom::value, highest)
      .then([=](const std::string& path) {
              if (path.empty()) return write_final_checkpoint(self, opts, highest);
              tell_news(opts, "coordinator: final checkpoint " + path + " (clock " + std::to_string(highest) + ")");
              end_job(self, opts, errc::failed, "", true);
            },
            [=](caf::error& err) { not_written(describe(err)); });
  };
  ask_heads(self, heads, "say its clock", with_clocks, not_written, final_atom::value);
}


// After a worker left or the members came back: the job ends once every worker is done
// (it failed when none left a result), else the barrier may be complete now.
void go_on(self_ptr self, const coordinator_options& opts) { carry_out(self, opts, self->state.core.go_on()); }


// A worker is done (its end or its death): it leaves the clock vector, so BSP and SSP
// reads stop waiting for it; a resumed job goes on (or ends) once its members are back.
void worker_finished(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto fx = self->state.core.worker_finished(id);
  if (fx.left.empty()) return;  // not running
  self->state.barrier.erase(id);
  carry_out(self, opts, fx);
}

// Why a member cannot join this job (empty: it can): another protocol version, or job
// settings it was given that differ from the spec.
std::string refusal(const coordinator_options& opts, const node_info& info) {
  if (auto v = version_mismatch(info.version, opts.spec.version); !v.empty()) return v;
  auto diffs = opts.spec.differences(info.given);
  if (diffs.empty()) return {};
  return "its settings differ from the job's: " + describe_differences(diffs);
}

std::string member_name(const node_info& info) {
  return info.role + (info.pid ? " (pid " + std::to_string(info.pid) + (info.host.empty() ? "" : " on " + info.host) + ")"
                               : std::string());
}

}  // namespace ps::coordinator_internal
