#include "libps/net/done_signal.hpp"

#include <climits>
#include <ctime>
#include <memory>
#include <vector>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace ps {

namespace {

long futex(std::atomic<std::uint32_t>& word, int op, std::uint32_t value, const timespec* timeout) {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  return ::syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), op, value, timeout, nullptr, 0);
}

void wake(std::atomic<std::uint32_t>& word) { futex(word, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr); }

struct owed_wake {
  std::atomic<std::uint32_t>* word;
  std::shared_ptr<const void> keep_alive;
};

// This thread's batch: whether one is open, and the wakes it owes (kept between batches,
// so a burst allocates nothing once the first made room).
thread_local bool batch_open = false;
thread_local std::vector<owed_wake> owed;

}  // namespace

void done_signal::wake_sleepers(std::shared_ptr<const void> keep_alive) {
  if (batch_open && keep_alive)
    owed.push_back({&state_, std::move(keep_alive)});
  else
    wake(state_);
}

done_signal::wake_batch::wake_batch() : opened_(!batch_open) { batch_open = true; }

done_signal::wake_batch::~wake_batch() {
  if (!opened_) return;
  batch_open = false;
  for (auto& w : owed) wake(*w.word);
  owed.clear();
}

std::size_t done_signal::wake_batch::owed_now() { return owed.size(); }

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
