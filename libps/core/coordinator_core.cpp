// The coordinator's decisions about the job as a whole (libps/core/coordinator_core.hpp).
#include "libps/core/coordinator_core.hpp"

#include <algorithm>

namespace ps {

const char* to_string(job_phase p) {
  static const char* names[] = {"forming", "chaining", "running", "resuming", "stopping", "ending"};
  return names[static_cast<int>(p)];
}

coordinator_core::coordinator_core(std::uint32_t servers, std::uint32_t workers, std::uint32_t replication)
    : servers_(servers), workers_(workers), replication_(replication), done_(workers, false) {}

std::optional<std::uint32_t> coordinator_core::admit_server() {
  if (servers_in_ >= servers_) return std::nullopt;
  return servers_in_++;
}

std::optional<std::uint32_t> coordinator_core::admit_worker() {
  if (next_worker_ >= workers_) return std::nullopt;
  return next_worker_++;
}

std::uint32_t coordinator_core::add_worker() {
  done_.push_back(false);
  return next_worker_++;
}

bool coordinator_core::map_complete() {
  if (servers_in_ < servers_) return false;
  if (phase_ == job_phase::forming) phase_ = replication_ < 2 ? job_phase::running : job_phase::chaining;
  return true;
}

bool coordinator_core::copy_registered() {
  if (++copies_in_ < servers_ * (replication_ - 1)) return false;
  if (phase_ == job_phase::chaining) phase_ = job_phase::running;
  return true;
}

std::vector<std::uint32_t> coordinator_core::running_ids() const {
  std::vector<std::uint32_t> live;
  for (std::uint32_t w = 0; w < done_.size(); ++w)
    if (!done_[w]) live.push_back(w);
  return live;
}

std::vector<std::uint32_t> coordinator_core::finished_ids() const {
  std::vector<std::uint32_t> gone;
  for (std::uint32_t w = 0; w < done_.size(); ++w)
    if (done_[w]) gone.push_back(w);
  return gone;
}

// A barrier number below the released ones is answered at once (sent again after a
// restart); one sent again while parked replaces the first.
barrier_answer coordinator_core::enter_barrier(std::uint32_t worker, std::uint64_t generation, job_effects& fx) {
  if (ending()) return {barrier_answer::ended, 0, {}};
  if (generation < generation_) return {barrier_answer::now, generation, {}};
  if (!worker_running(worker))
    return {barrier_answer::refused, 0,
            "coordinator: worker " + std::to_string(worker) + " is not running, it has no barrier"};
  barrier_.insert(worker);
  fx = release_if_complete();
  return {barrier_answer::parked, 0, {}};
}

// The barrier is released once every running worker reached it; the record is saved
// first, so a coordinator resumed after a death answers a barrier sent again at once.
job_effects coordinator_core::release_if_complete() {
  job_effects fx;
  if (resuming() || barrier_.empty() || barrier_.size() < running_workers()) return fx;
  fx.released = generation_++;
  fx.persist = true;
  fx.release_to.assign(barrier_.begin(), barrier_.end());
  barrier_.clear();
  return fx;
}

bool coordinator_core::record_result(std::uint32_t worker, bool ok, const std::string& json) {
  if (!worker_running(worker)) return false;
  results_[worker] = {ok, json};
  return true;
}

job_effects coordinator_core::worker_finished(std::uint32_t worker) {
  if (!worker_running(worker)) return {};
  done_[worker] = true;
  absent_.erase(worker);
  ++finished_;
  barrier_.erase(worker);
  job_effects fx;
  if (resuming()) {
    fx.check_resume = true;  // a resumed job goes on (or ends) once its members are back
  } else {
    fx = go_on();
  }
  fx.left.insert(fx.left.begin(), worker);
  fx.members_changed = true;
  fx.persist = true;
  return fx;
}

job_effects coordinator_core::go_on() {
  if (finished_ < done_.size()) return release_if_complete();
  job_effects fx;
  const bool any_result = std::any_of(results_.begin(), results_.end(), [](const auto& r) { return r.second.ok; });
  if (any_result) fx.finish = true;
  else fx.fail = "every worker went down before finishing";
  return fx;
}

bool coordinator_core::begin_end(std::vector<std::uint32_t>& parked) {
  if (ending()) return false;
  phase_ = job_phase::ending;
  parked.assign(barrier_.begin(), barrier_.end());
  barrier_.clear();
  return true;
}

// A stop cuts a checkpoint first only where there is a writer and a formed job; a
// failure ends the job at once.
stop_plan coordinator_core::begin_stop(bool failure, bool has_checkpointer) {
  if (phase_ == job_phase::stopping && !failure) return stop_plan::already_stopping;
  if (failure || !has_checkpointer || !formed()) return stop_plan::end_now;
  phase_ = job_phase::stopping;
  return stop_plan::checkpoint_first;
}

void coordinator_core::resume_from(const coordinator_record& r) {
  done_ = r.worker_done;
  next_worker_ = static_cast<std::uint32_t>(r.worker_done.size());
  // The map is the record's: no server of the job's start registers afresh (a server
  // that comes now joins), and every member of the start counts as registered.
  servers_in_ = std::max<std::uint32_t>(servers_, static_cast<std::uint32_t>(r.shards.size()));
  finished_ = 0;
  absent_.clear();
  for (std::uint32_t w = 0; w < done_.size(); ++w) {
    if (done_[w]) ++finished_;
    else absent_.insert(w);
  }
  results_ = r.results;
  generation_ = r.barrier_generation;
  phase_ = job_phase::resuming;
}

std::vector<std::uint32_t> coordinator_core::give_up_absent() {
  std::vector<std::uint32_t> gone(absent_.begin(), absent_.end());
  absent_.clear();
  return gone;
}

void coordinator_core::resumed() {
  if (phase_ == job_phase::resuming) phase_ = job_phase::running;
}

}  // namespace ps
