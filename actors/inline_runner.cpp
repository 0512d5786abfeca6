#include "actors/inline_runner.hpp"

#include <caf/scheduler/abstract_coordinator.hpp>

namespace ps {

inline_runner::inline_runner(caf::actor_system& sys, std::size_t max_throughput)
    : caf::execution_unit(&sys), max_throughput_(max_throughput) {}

inline_runner::~inline_runner() { hand_over(); }

void inline_runner::exec_later(caf::resumable* job) {
  if (!running_.empty()) {  // woken by an actor running here: not ours to run
    system().scheduler().enqueue(job);
    return;
  }
  woken_.push_back(job);
}

void inline_runner::hand_over() {
  for (auto* job : woken_) system().scheduler().enqueue(job);
  woken_.clear();
}

// The scheduler's worker loop, for one turn of each actor (caf/scheduler/worker.hpp).
void inline_runner::run() {
  running_.swap(woken_);  // no allocation per burst: both keep their room
  for (auto* job : running_) {
    switch (job->resume(this, max_throughput_)) {
      case caf::resumable::resume_later:  // more to do: the reference goes with it
        system().scheduler().enqueue(job);
        break;
      case caf::resumable::done:
      case caf::resumable::awaiting_message:
      case caf::resumable::shutdown_execution_unit:
        caf::intrusive_ptr_release(job);
        break;
    }
  }
  running_.clear();
}

}  // namespace ps
