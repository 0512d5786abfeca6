#include "runtime/signals.hpp"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

namespace ps {

namespace {
std::atomic<int> caught{0};
extern "C" void record_signal(int sig) { caught.store(sig); }
}  // namespace

void catch_stop_signals() {
  struct sigaction sa {};
  sa.sa_handler = record_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

int stop_signal() { return caught.load(); }

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
