// inline_runner with CAF's real scheduler: an actor woken through it runs on the thread
// that calls run(), for at most its throughput, and what it wakes runs elsewhere; one
// handed over (or left when the runner ends) runs in the scheduler.
#include <doctest/doctest.h>

#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include <caf/all.hpp>

#include "actors/inline_runner.hpp"

using namespace ps;
using namespace std::chrono_literals;

namespace {

// The threads an actor handled its messages on, in order; `all` is set once it has
// handled `expected` of them.
struct thread_log {
  std::mutex mtx;
  std::vector<std::thread::id> threads;
  std::size_t expected = 0;
  std::promise<void> all;

  void add() {
    std::lock_guard<std::mutex> guard(mtx);
    threads.push_back(std::this_thread::get_id());
    if (threads.size() == expected) all.set_value();
  }
  std::vector<std::thread::id> wait() {
    REQUIRE(all.get_future().wait_for(10s) == std::future_status::ready);
    std::lock_guard<std::mutex> guard(mtx);
    return threads;
  }
  std::size_t seen() {
    std::lock_guard<std::mutex> guard(mtx);
    return threads.size();
  }
};

// Logs each message; message 0 is also passed on to `next` (if any).
caf::behavior logger(caf::event_based_actor* self, thread_log* log, caf::actor next) {
  return {[=](int i) {
    log->add();
    if (i == 0 && next) self->send(next, 1);
  }};
}

// Spawned idle (not scheduled), so that the first enqueue wakes it.
caf::actor spawn_idle(caf::actor_system& sys, thread_log& log, caf::actor next = {}) {
  return sys.spawn<caf::lazy_init>(logger, &log, std::move(next));
}

void send_through(const caf::actor& to, int i, caf::execution_unit& runner) {
  caf::actor_cast<caf::abstract_actor*>(to)->enqueue(
    caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, i), &runner);
}

}  // namespace

TEST_CASE("inline runner: a woken actor runs on the thread that calls run(), for at most its throughput; the "
          "actors it wakes run in the scheduler") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  thread_log woken_log, next_log;
  woken_log.expected = 5;
  next_log.expected = 1;
  auto next = spawn_idle(sys, next_log);
  auto woken = spawn_idle(sys, woken_log, next);
  {
    inline_runner runner(sys, 3);
    for (int i = 0; i < 5; ++i) send_through(woken, i, runner);
    CHECK(woken_log.seen() == 0);  // it waits for run()
    CHECK(runner.waiting() == 1);  // woken once; the other four found it scheduled
    runner.run();
    CHECK(runner.waiting() == 0);
  }
  auto threads = woken_log.wait();  // the two beyond its throughput went on in the scheduler
  const auto here = std::this_thread::get_id();
  CHECK(threads[0] == here);
  CHECK(std::count(threads.begin(), threads.end(), here) == 3);
  CHECK(threads[4] != here);
  CHECK(next_log.wait()[0] != here);
  caf::anon_send_exit(woken, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(next, caf::exit_reason::user_shutdown);
}

TEST_CASE("inline runner: an actor handed over, or still waiting when the runner ends, runs in the scheduler") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  thread_log handed_log, left_log;
  handed_log.expected = left_log.expected = 1;
  auto handed = spawn_idle(sys, handed_log);
  auto left = spawn_idle(sys, left_log);
  {
    inline_runner runner(sys);
    send_through(handed, 1, runner);
    runner.hand_over();
    CHECK(runner.waiting() == 0);
    CHECK(handed_log.wait()[0] != std::this_thread::get_id());
    send_through(left, 1, runner);
    CHECK(runner.waiting() == 1);
  }
  CHECK(left_log.wait()[0] != std::this_thread::get_id());
  caf::anon_send_exit(handed, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(left, caf::exit_reason::user_shutdown);
}
