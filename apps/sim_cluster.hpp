#pragma once
// The whole-cluster simulation of one seed: the real coordinator, 2 or 3 server shards
// (with their chain copies) and kv_clients, in one process on CAF's deterministic test
// scheduler, which stands in for the network: the seed picks which actor takes its next
// message (every mailbox stays FIFO, as a connection is), when timers fire, and the plan's
// faults (libps/sim/sim_plan.hpp): kills, a partition (the cut-off server's actors are not
// scheduled until it heals), message drops, duplicates and delays. Per clock each worker pushes +1 to every one of 64 keys
// and to every one of 24 rows of a sparse table (sum rule, rows created at 0 on first
// touch), ticks, and pulls both.
//
// Invariants, checked as it runs and at its end:
//   - every read keeps the staleness bound: at clock c a worker sees all its own pushes and
//     at least min(pushes, c - s) of every other worker's, never more than were pushed,
//     and under BSP exactly the pushes of clocks below c (of a killed worker, its
//     acknowledged pushes at least and those it sent at most);
//   - every acknowledged push is counted exactly once: the final sums are exact (with a
//     killed worker: at least its acknowledged pushes, at most those it sent);
//   - every request of a live worker is answered (or fails with an error naming the peer:
//     a failure here, as no plan loses both copies of a shard);
//   - nobody is stuck: the run ends within its step budget;
//   - the shards' consistency trace passes check_trace.
#include <cstdint>
#include <string>

#include "libps/sim/sim_plan.hpp"

namespace ps {

struct sim_outcome {
  std::string failure;           // empty: every invariant held
  std::uint64_t trace_hash = 0;  // of every message delivered (receiver, kind), in order
  std::uint64_t messages = 0;    // messages delivered
  std::uint64_t plane_bytes = 0;  // payload bytes that went over the in-memory transport
};

// Runs the plan's seed; `trace_dir` holds the run's consistency trace while it runs.
sim_outcome run_simulation(const sim_plan& plan, const std::string& trace_dir = "/tmp");

}  // namespace ps
