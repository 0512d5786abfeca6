#include "runtime/signals.hpp"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <thread>

namespace ps {

namespace {
std::atomic<int> caught{0};
std::atomic<std::int64_t> caught_at_ns{0};  // CLOCK_MONOTONIC of the first signal (0: none)
extern "C" void record_signal(int sig) {
  caught.store(sig);
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);  // async-signal-safe
  std::int64_t none = 0;
  caught_at_ns.compare_exchange_strong(none, std::int64_t{now.tv_sec} * 1000000000 + now.tv_nsec);
}
struct sigaction before_int {}, before_term {};
}  // namespace

void catch_stop_signals() {
  caught.store(0);  // a job of its own: a signal an earlier job caught does not stop it
  caught_at_ns.store(0);
  struct sigaction sa {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &before_int);
  sigaction(SIGTERM, &sa, &before_term);
}

void restore_stop_signals() {
  sigaction(SIGINT, &before_int, nullptr);
  sigaction(SIGTERM, &before_term, nullptr);
}

int stop_signal() { return caught.load(); }

bool stop_signal_older_than(std::chrono::milliseconds age) {
  auto at = caught_at_ns.load();
  if (at == 0) return false;
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return std::int64_t{now.tv_sec} * 1000000000 + now.tv_nsec - at >= age.count() * 1000000;
}

void bound_teardown(int status, int limit_seconds) {
  std::thread([status, limit_seconds] {
    std::this_thread::sleep_for(std::chrono::seconds(limit_seconds));  // a deadline, not a wait for an event
    std::fprintf(stderr, "shutting down took longer than %d s (a peer that cannot be reached?); exiting with status %d\n",
                 limit_seconds, status);
    std::fflush(stderr);
    std::_Exit(status);
  }).detach();
}

}  // namespace ps
