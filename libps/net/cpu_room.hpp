#pragma once
// Whether the host has a CPU to spare for a poller right now. A poller on one vCPU cannot
// see the other's queue: a thread woken meanwhile goes to the vCPU that is not polling and
// waits there behind whatever runs (sched_yield only ever offers the poller's own vCPU).
// At window 8, 1 server x 1 worker on 2 vCPUs, readers polling between small frames took
// 11-24% of the 4 KiB request rate (BENCHMARKS.md, "Polling only while a CPU is free").
// The kernel's count of runnable threads (/proc/loadavg, the poller itself included)
// tells: more than the CPUs, and a poll takes a CPU that some thread is waiting for.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string_view>

namespace ps {

// The runnable threads of a /proc/loadavg line ("0.52 0.58 0.59 3/421 12345": 3), or
// nullopt when the line is not one.
std::optional<unsigned> runnable_in_loadavg(std::string_view line);

// Answers "is there a CPU to spare" from samples of the host's runnable threads, taken at
// most once per `refresh` (a sample is a system call: on this machine kind several
// microseconds) and shared by every thread that asks. No sample (unreadable): yes, as if
// nothing were known, which is how polling behaved before.
class cpu_room {
 public:
  using sampler = std::function<std::optional<unsigned>()>;
  using clock = std::chrono::steady_clock;
  cpu_room(unsigned cpus, std::chrono::microseconds refresh, sampler sample);

  // Whether the last sample, taken at most `refresh` before `now`, counted at most `cpus`
  // runnable threads.
  bool spare(clock::time_point now = clock::now());

 private:
  unsigned cpus_;
  std::chrono::microseconds refresh_;
  sampler sample_;
  std::atomic<std::int64_t> sampled_at_{std::numeric_limits<std::int64_t>::min()};  // ns since the clock's epoch
  std::atomic<bool> spare_{true};
};

// The CPUs this host offers its processes (at least 1): what the room rule here and the
// crowded-host rule (libps/net/host_share.hpp) compare against.
unsigned host_cpus();

// The host's, sampled from /proc/loadavg every 100 us, for this process's pollers.
cpu_room& host_cpu_room();

}  // namespace ps
