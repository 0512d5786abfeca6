#include "libps/done_signal.hpp"

#include <climits>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ps {

namespace {

long futex(std::atomic<std::uint32_t>& word, int op, std::uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

}  // namespace

void done_signal::set() {
  if (state_.exchange(done, std::memory_order_acq_rel) == sleeping)
    futex(state_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr);
}

bool done_signal::wait_until(std::optional<std::chrono::steady_clock::time_point> until) {
  for (;;) {
    auto s = state_.load(std::memory_order_acquire);
    if (s == done) return true;
    timespec limit{};
    if (until) {
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(*until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      const auto secs = std::chrono::duration_cast<std::chrono::seconds>(left);
      limit = {static_cast<time_t>(secs.count()), static_cast<long>((left - secs).count())};
    }
    if (s == pending && !state_.compare_exchange_weak(s, sleeping, std::memory_order_acq_rel)) continue;
    // Woken, timed out, or the word was no longer `sleeping`: the loop looks again.
    futex(state_, FUTEX_WAIT_PRIVATE, sleeping, until ? &limit : nullptr);
  }
}

}  // namespace ps
