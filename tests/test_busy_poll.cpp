// Polling before sleeping (libps/busy_poll.hpp): it finds what comes within its budget,
// gives up when nothing comes, and gives way at once to another thread that wants the
// vCPU it polls on.
#include <doctest/doctest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "libps/busy_poll.hpp"

using namespace ps;
using namespace std::chrono_literals;

namespace {

// Keeps the calling thread on CPU 0 only (false where that cannot be had).
bool pin_to_cpu0() {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  return pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
}

}  // namespace

TEST_CASE("busy poll: what becomes ready within the budget is found, asked about until then") {
  // It never gives way here (other tests' threads may run on this vCPU meanwhile).
  int asks = 0;
  CHECK(poll_while_idle(10s, [&] { return ++asks == 50; }, std::chrono::hours(1)));
  CHECK(asks == 50);
}

TEST_CASE("busy poll: nothing ready: false, at the latest once the budget passed; a budget of 0 asks nothing") {
  int asks = 0;
  // (Earlier when some yield ran another thread: this machine's own threads may.)
  CHECK_FALSE(poll_while_idle(2ms, [&] { return ++asks < 0; }));
  CHECK(asks >= 1);
  asks = 0;
  CHECK_FALSE(poll_while_idle(0us, [&] { return ++asks > 0; }));
  CHECK(asks == 0);
}

TEST_CASE("busy poll: another thread that wants the same vCPU makes the poller give way long before its budget") {
  // Both on CPU 0: the spinner never sleeps, so some yield of the poller runs it for a
  // time slice, and the poller gives up (its budget, an hour, would otherwise hold it).
  std::atomic<bool> spin{true}, spinning{false};
  std::thread spinner([&] {
    pin_to_cpu0();
    spinning = true;
    while (spin) {
    }
  });
  while (!spinning) std::this_thread::yield();
  std::thread poller([&] {
    REQUIRE(pin_to_cpu0());
    CHECK_FALSE(poll_while_idle(std::chrono::hours(1), [] { return false; }));
  });
  poller.join();
  spin = false;
  spinner.join();
}

TEST_CASE("busy poll: a process polls while it and its peers on its host fit the host's CPUs, else not") {
  CHECK(poll_budget(200us, 0, 2) == 200us);
  CHECK(poll_budget(200us, 1, 2) == 200us);  // 1 server x 1 worker on 2 vCPUs
  CHECK(poll_budget(200us, 2, 2) == 0us);    // a worker of 2 servers on 2 vCPUs
  CHECK(poll_budget(200us, 7, 8) == 200us);
  CHECK(poll_budget(0us, 0, 8) == 0us);
  CHECK_FALSE(host_crowded(1, 2));
  CHECK(host_crowded(2, 2));
  CHECK(host_crowded(1, 1));
  CHECK(budget_now(nullptr) == 0us);
  CHECK(budget_now(std::make_shared<const std::atomic<std::int64_t>>(50)) == 50us);
}
