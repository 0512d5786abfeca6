// Checkpoint rounds (the consistent cut), psctl checkpoint and psctl status.
#include "actors/coordinator/coordinator_internal.hpp"

namespace ps::coordinator_internal {

// Every head takes `boundary` unless its minimum clock passed it while it was picked (the
// workers run on): then a boundary above the highest such minimum is proposed again, at
// most `attempts` times. The parts of a boundary some head refused never complete: the
// checkpointer drops them once a later file completes.
void propose_cut(self_ptr self, std::vector<shard_actor> heads, std::uint64_t boundary, int attempts,
                 std::function<void(std::uint64_t)> cut, std::function<void(std::string)> failed) {
  auto answered = [=](std::vector<std::uint64_t> passed) {  // 0: taken, else that head's minimum
    if (std::find(passed.begin(), passed.end(), left_clock) != passed.end())
      return failed("coordinator: no checkpoint: a shard has no worker left");
    auto highest = *std::max_element(passed.begin(), passed.end());
    if (highest == 0) return cut(boundary);
    if (attempts <= 1)
      return failed("coordinator: no checkpoint: the workers kept passing the boundary (last proposed: clock " +
                    std::to_string(boundary) + ")");
    propose_cut(self, heads, highest + 2, attempts - 1, cut, failed);
  };
  ask_heads(self, heads, "take the boundary", answered,
            [=](const std::string& why) { failed("coordinator: no checkpoint: " + why); }, cut_atom::value, boundary);
}

// A checkpoint one clock boundary above every head's minimum, so each shard's part holds
// the same clocks (exactly, under BSP): cut(boundary) once every head took it, or
// failed(why) when a head did not answer (that round's file could not complete).
void cut_checkpoint(self_ptr self, std::function<void(std::uint64_t)> cut, std::function<void(std::string)> failed) {
  if (self->state.joining) return failed("coordinator: no checkpoint while a shard joins or leaves; try again once it has");
  auto heads = live_heads(self->state);
  if (heads.empty()) return failed("coordinator: no checkpoint: no shard yet");
  auto with_minimums = [=](std::vector<std::uint64_t> mins) {
    std::uint64_t highest = 0;
    for (auto m : mins)
      if (m != left_clock) highest = std::max(highest, m);
    propose_cut(self, heads, highest + 1, 5, cut, failed);
  };
  ask_heads(self, heads, "say its clock", with_minimums,
            [=](const std::string& why) { failed("coordinator: no checkpoint: " + why); }, min_clock_atom::value);
}

// Time-based checkpoints (--checkpoint-seconds).
void checkpoint_round(self_ptr self, const coordinator_options& opts) {
  self->delayed_send(self, checkpoint_period(opts), checkpoint_atom::value);
  if (!self->state.core.chains_complete()) return;
  cut_checkpoint(self, [](std::uint64_t) {}, [=](std::string why) { tell_news(opts, why); });
}

// While the job has not every member it was started for: who is there, who is awaited.
void report_waiting(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  const std::size_t servers = st.shards.size(), workers = st.core.workers_registered();
  if (st.core.ending() || st.core.all_registered()) return;  // formed: no more reports
  std::string have;
  for (const auto& [addr, who] : st.members) have += (have.empty() ? "" : ", ") + who;
  auto missing = [](std::size_t want, std::size_t got, const char* what) {
    return std::to_string(want - std::min(want, got)) + " of " + std::to_string(want) + " " + what;
  };
  tell_news(opts, "coordinator: still waiting for " + missing(opts.servers, servers, "servers") + " and " +
                    missing(opts.workers, workers, "workers") + "; registered: " + (have.empty() ? "none" : have));
  self->delayed_send(self, opts.wait_report, wait_report_atom::value);
}

// psctl checkpoint: one now, at the next boundary.
caf::result<std::uint64_t> checkpoint_now(self_ptr self, const coordinator_options& opts) {
  if (!opts.checkpointer)
    return make_ps_error("coordinator: this job writes no checkpoints (start it with --checkpoint-dir=DIR)");
  const auto& core = self->state.core;
  if (!core.chains_complete())
    return make_ps_error(std::string("coordinator: no checkpoint: the job ") +
                         (core.ending() ? "is ending" : "has not formed yet"));
  auto rp = self->make_response_promise<std::uint64_t>();
  cut_checkpoint(self, [=](std::uint64_t boundary) mutable { rp.deliver(boundary); },
                 [=](std::string why) mutable { rp.deliver(make_ps_error(why)); });
  return rp;
}

// The job's phase as psctl status names it (a contract with scripts: forming, running,
// resuming, ending): chains being built count as forming, a stop under way as running.
std::string status_name(job_phase p) {
  switch (p) {
    case job_phase::forming:
    case job_phase::chaining: return "forming";
    case job_phase::running:
    case job_phase::stopping: return "running";
    default: return to_string(p);
  }
}

// psctl status: what the coordinator knows of its members, and each shard's own figures.
caf::result<std::string> cluster_status(self_ptr self) {
  auto& st = self->state;
  auto shards = std::make_shared<std::vector<status_shard>>();
  std::vector<shard_actor> heads;
  for (const auto& e : st.shards) {
    if (st.retired.count(e.id)) continue;
    shards->push_back({e.id, e.host.empty() ? "in the coordinator's process" : e.host + ":" + std::to_string(e.port),
                       e.pid, "", "", static_cast<std::uint32_t>(std::max<std::size_t>(e.chain.size(), 1))});
    heads.push_back(st.shard_handles[e.id]);
  }
  std::vector<status_worker> workers;
  const auto& done = st.core.worker_done();
  for (std::uint32_t w = 0; w < done.size(); ++w) workers.push_back({w, "", done[w]});
  for (const auto& [addr, id] : st.worker_ids)
    if (auto m = st.members.find(addr); m != st.members.end()) workers[id].member = m->second;
  const std::string job = status_name(st.core.phase());
  const auto epoch = st.epoch;
  auto rp = self->make_response_promise<std::string>();
  auto remaining = std::make_shared<std::size_t>(heads.size());
  auto finish = [=]() mutable {
    try {
      rp.deliver(status_json(epoch, job, *shards, workers));
    } catch (const bad_request& e) {
      rp.deliver(make_ps_error(e.what()));
    }
  };
  if (*remaining == 0) finish();
  for (std::size_t i = 0; i < heads.size(); ++i)
    self->request(heads[i], std::chrono::seconds(5), stats_atom::value)
      .then(
        [=](std::string& text) mutable {
          (*shards)[i].stats = std::move(text);
          if (--*remaining == 0) finish();
        },
        [=](caf::error& e) mutable {
          (*shards)[i].error = describe(e);
          if (--*remaining == 0) finish();
        });
  return rp;
}

}  // namespace ps::coordinator_internal
