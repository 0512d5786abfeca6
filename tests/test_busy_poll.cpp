// Polling before sleeping (libps/net/busy_poll.hpp): it finds what comes within its budget,
// gives up when nothing comes, and gives way at once to another thread that wants the
// vCPU it polls on.
#include <doctest/doctest.h>

#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "libps/net/busy_poll.hpp"
#include "libps/net/done_signal.hpp"

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

TEST_CASE("cpu room: the runnable threads of a /proc/loadavg line; anything else is not one") {
  CHECK(runnable_in_loadavg("0.52 0.58 0.59 3/421 12345\n") == 3u);
  CHECK(runnable_in_loadavg("1.31 1.59 1.23 12/80 7432") == 12u);
  CHECK_FALSE(runnable_in_loadavg(""));
  CHECK_FALSE(runnable_in_loadavg("0.52 0.58 0.59"));
  CHECK_FALSE(runnable_in_loadavg("0.52 0.58 0.59 /421 1"));
  CHECK_FALSE(runnable_in_loadavg("0.52 0.58 0.59 x3/421 1"));
  CHECK_FALSE(runnable_in_loadavg("0.52 0.58 0.59 3 421 1"));
}

TEST_CASE("cpu room: a CPU is spare while the runnable threads fit the CPUs; samples are shared for `refresh`") {
  std::optional<unsigned> runnable = 2;
  int samples = 0;
  cpu_room room(2, 100us, [&] {
    ++samples;
    return runnable;
  });
  const auto t0 = cpu_room::clock::now();
  CHECK(room.spare(t0));  // 2 runnable (the asker among them) on 2 CPUs
  CHECK(samples == 1);
  runnable = 3;
  CHECK(room.spare(t0 + 50us));  // the sample of t0 still holds
  CHECK(samples == 1);
  CHECK_FALSE(room.spare(t0 + 100us));  // a thread waits for a CPU: no polling
  CHECK(samples == 2);
  runnable = std::nullopt;  // unreadable: as if nothing were known
  CHECK(room.spare(t0 + 250us));
  CHECK(samples == 3);
}

TEST_CASE("cpu room: this host's answers from /proc/loadavg, and the budget a poller gets by it") {
  // With every CPU of this host kept busy by spinners, the host has no room, and a poller
  // between small frames gets no budget.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<bool> spin{true};
  std::vector<std::thread> spinners;
  for (unsigned i = 0; i < cpus + 1; ++i)
    spinners.emplace_back([&] {
      while (spin) {
      }
    });
  const auto budget = std::make_shared<const std::atomic<std::int64_t>>(200);
  bool refused = false;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (!refused && std::chrono::steady_clock::now() < deadline) refused = budget_while_room(budget) == 0us;
  spin = false;
  for (auto& t : spinners) t.join();
  CHECK(refused);
  CHECK(budget_while_room(nullptr) == 0us);
}

TEST_CASE("done signal: a waiter wakes once it is set, sees what was written before, and a wait_for without it times out") {
  ps::done_signal signal;
  CHECK_FALSE(signal.is_set());
  CHECK_FALSE(signal.wait_for(std::chrono::milliseconds(20)));  // nobody sets it: false after the limit
  int written = 0;
  std::thread setter([&] {
    written = 42;
    signal.set();
  });
  signal.wait();
  CHECK(written == 42);
  CHECK(signal.is_set());
  CHECK(signal.wait_for(std::chrono::milliseconds(0)));
  setter.join();
  signal.set();  // twice: still set, no waiter to wake
  CHECK(signal.is_set());
}

TEST_CASE("done signal: many waiters, in wait and wait_for, all wake on one set") {
  ps::done_signal signal;
  std::atomic<int> woke{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < 4; ++i)
    waiters.emplace_back([&, i] {
      if (i % 2 == 0) {
        signal.wait();
        ++woke;
      } else if (signal.wait_for(std::chrono::seconds(30))) {
        ++woke;
      }
    });
  signal.set();
  for (auto& t : waiters) t.join();
  CHECK(woke == 4);
}

TEST_CASE("done signal: in a wake batch a sleeper's wake waits for the batch to close; its owner lives till then") {
  using batch = ps::done_signal::wake_batch;
  auto signal = std::make_shared<ps::done_signal>();
  // The waiter holds no reference: one "about to sleep" may see the set and return before
  // the batch closes, so its reference would come and go. `kept` outlives the waiter.
  auto kept = signal;
  std::thread waiter([raw = signal.get()] { raw->wait(); });
  while (!signal->has_sleeper()) std::this_thread::yield();  // the waiter is asleep (or about to be)
  {
    batch outer;
    {
      batch inner;  // nested: the outer one keeps the wakes
      signal->set([&] { return signal; });
    }
    CHECK(signal->is_set());
    CHECK(batch::owed_now() == 1);
    signal.reset();
    CHECK(kept.use_count() == 2);  // kept and the batch's
  }
  CHECK(batch::owed_now() == 0);
  CHECK(kept.use_count() == 1);  // the batch let go once it woke the sleeper
  waiter.join();  // woken when the batch closed
}

TEST_CASE("done signal: in a wake batch a signal set without its owner, or with nobody asleep, owes no wake (and asks "
          "no owner)") {
  using batch = ps::done_signal::wake_batch;
  ps::done_signal unowned;
  std::thread waiter([&] { unowned.wait(); });
  while (!unowned.has_sleeper()) std::this_thread::yield();
  batch open;
  unowned.set();  // nothing keeps it alive for later: woken at once
  waiter.join();  // while the batch is still open
  auto idle = std::make_shared<ps::done_signal>();
  bool owner_asked = false;
  idle->set([&] {
    owner_asked = true;
    return idle;
  });
  CHECK_FALSE(owner_asked);  // nobody sleeps on it: no reference taken
  CHECK(batch::owed_now() == 0);
}
