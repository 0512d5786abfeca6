#pragma once
// Runs an actor on the thread whose message woke it, instead of waking a scheduler
// thread for it. A data connection's reader thread that delivers a burst of small
// requests to a shard (or of answers to a client) then runs that actor itself once the
// burst is read: on 2 cores, handing each burst to another thread cost a wake-up and two
// context switches, more than the messages' own work (BENCHMARKS.md, "Readers run the
// actors they wake").
//
// Pass it as the execution unit of enqueue: an actor that was idle and is woken by that
// enqueue waits here until run() (or hand_over()); an actor already running or scheduled
// is not affected. Only actors woken this way run here: what they send on wakes its
// receivers through the scheduler, so no other actor runs on the thread.
#include <cstddef>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/execution_unit.hpp>
#include <caf/resumable.hpp>

namespace ps {

class inline_runner final : public caf::execution_unit {
 public:
  // An actor runs here for at most max_throughput messages, then goes on in the scheduler.
  explicit inline_runner(caf::actor_system& sys, std::size_t max_throughput = 64);
  ~inline_runner() override;  // hands the actors still waiting to the scheduler
  inline_runner(const inline_runner&) = delete;
  inline_runner& operator=(const inline_runner&) = delete;

  void exec_later(caf::resumable* job) override;
  // Runs the actors woken so far, on this thread.
  void run();
  // Gives them to the scheduler instead (this thread has long work to do first).
  void hand_over();
  // Actors woken and waiting for run() or hand_over().
  std::size_t waiting() const { return woken_.size(); }

 private:
  std::size_t max_throughput_;
  std::vector<caf::resumable*> woken_;  // each holds the reference enqueue added for it
  std::vector<caf::resumable*> running_;  // run()'s turn (empty outside it); kept for its room
};

}  // namespace ps
