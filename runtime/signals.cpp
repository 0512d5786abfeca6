#include "runtime/signals.hpp"

#include <signal.h>

#include <atomic>

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

}  // namespace ps
