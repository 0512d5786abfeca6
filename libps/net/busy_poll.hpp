#pragma once
// Polling for what another thread or process will do soon, instead of sleeping until it
// wakes us: on this machine kind a sleeping thread on an idle vCPU took about 50 us to
// wake (the hypervisor halts an idle vCPU; the guest does no halt-polling), more than a
// small request's whole work (BENCHMARKS.md, "Readers poll before they sleep"). Polling
// is worth it only while the vCPU would otherwise idle: once another thread wants it, the
// poller gives way and sleeps. And a process polls only while the processes it knows on
// its host (its peers there, and itself) fit the host's CPUs: with more, the vCPUs rarely
// idle, and polling cost them batching (2 servers x 2 workers on 2 vCPUs: 0.6-0.9x).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>

#include <sched.h>

#include "libps/net/cpu_room.hpp"
#include "libps/net/host_share.hpp"

namespace ps {

// A budget in microseconds that its owner changes while pollers read it (0: no polling).
using shared_poll_budget = std::shared_ptr<const std::atomic<std::int64_t>>;

inline std::chrono::microseconds budget_now(const shared_poll_budget& budget) {
  return std::chrono::microseconds(budget ? budget->load(std::memory_order_relaxed) : 0);
}

// What a poller polls with now: the budget, while the host has a CPU to spare
// (libps/net/cpu_room.hpp), else 0.
inline std::chrono::microseconds budget_while_room(const shared_poll_budget& budget) {
  const auto wanted = budget_now(budget);
  return wanted.count() > 0 && host_cpu_room().spare() ? wanted : std::chrono::microseconds(0);
}

// The budget a process polls with: `wanted` while it and its `peers_here` (peers on its
// host) fit in `cpus`, else 0.
inline std::chrono::microseconds poll_budget(std::chrono::microseconds wanted, std::size_t peers_here, unsigned cpus) {
  return host_crowded(peers_here, cpus) ? std::chrono::microseconds(0) : wanted;
}

// A yield that took longer than this ran another thread on this vCPU.
inline constexpr std::chrono::microseconds yield_ran_another{10};

// Asks ready() until it says true (then true), `budget` passed, or a yield between asks
// took longer than `give_way` (it ran another thread: then false, after one last ask): the
// caller then sleeps as it would without polling. A budget of 0 asks nothing.
template <class Ready>
bool poll_while_idle(std::chrono::microseconds budget, Ready&& ready,
                     std::chrono::microseconds give_way = yield_ran_another) {
  if (budget.count() <= 0) return false;
  using clock = std::chrono::steady_clock;
  const auto until = clock::now() + budget;
  for (;;) {
    if (ready()) return true;
    const auto before = clock::now();
    if (before >= until) return false;
    sched_yield();
    if (clock::now() - before > give_way) return ready();
  }
}

}  // namespace ps
