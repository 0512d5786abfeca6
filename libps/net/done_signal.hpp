#pragma once
// A one-shot "done" that a thread can sleep on, in one futex word: setting it costs no
// system call while nobody sleeps, and one wake when somebody does. A kv_future waited
// on a mutex and a condition variable before: the waiter woke holding the mutex in its
// contended state, so its unlock cost a futex wake too, a third of the futex calls of a
// 4 KiB window-8 cell (BENCHMARKS.md, "The caller runs its requests").
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

namespace ps {

class done_signal {
 public:
  // Done, once: a thread asleep in wait or wait_for wakes at once.
  void set() { set([] { return std::shared_ptr<const void>(); }); }
  // The same, but while a wake_batch is open on this thread the sleeper wakes when the
  // batch closes, keep_alive() (the signal's owner) holding the signal till then. It is
  // called only when somebody sleeps: setting costs no reference count otherwise.
  template <class KeepAlive>
  void set(KeepAlive&& keep_alive) {
    if (state_.exchange(done, std::memory_order_acq_rel) == sleeping) wake_sleepers(keep_alive());
  }
  // The wakes that set() owes on this thread while one is open wait until it closes: a
  // thread that completes a burst of ops wakes their waiter once, after the last, and the
  // waiter then finds them all done (one sleep and one wake-up for the burst, not one a
  // request). Only the outermost of nested batches counts.
  class wake_batch {
   public:
    wake_batch();
    ~wake_batch();
    wake_batch(const wake_batch&) = delete;
    wake_batch& operator=(const wake_batch&) = delete;
    // Wakes the batch open on this thread owes now (tests).
    static std::size_t owed_now();

   private:
    bool opened_;
  };
  bool is_set() const { return state_.load(std::memory_order_acquire) == done; }
  // Whether a thread sleeps on it, or is about to (tests).
  bool has_sleeper() const { return state_.load(std::memory_order_acquire) == sleeping; }
  // Until set (what the setter wrote before set is then visible).
  void wait() { wait_until(std::nullopt); }
  // Until set or d passed; whether it is set.
  bool wait_for(std::chrono::nanoseconds d) { return wait_until(std::chrono::steady_clock::now() + d); }

 private:
  static constexpr std::uint32_t pending = 0, sleeping = 1, done = 2;
  // Now, or when the wake_batch open on this thread closes (keep_alive holding the signal).
  void wake_sleepers(std::shared_ptr<const void> keep_alive);
  // Until set or `until` (none: no limit); whether it is set.
  bool wait_until(std::optional<std::chrono::steady_clock::time_point> until);
  std::atomic<std::uint32_t> state_{pending};
};

}  // namespace ps
