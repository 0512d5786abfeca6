#pragma once
// The consistency trace (--trace=FILE): one JSON object per line, written by the shards.
//   {"ev":"push","worker":W,"clock":C,"shard":K}                 a push applied
//   {"ev":"pull","worker":W,"clock":C,"shard":K,"min_clock":M,"staleness":S}
//                                                                 a pull answered; S is the
//                                                                 bound ("inf" for ASP)
//   {"ev":"leave","worker":W,"shard":K}                          W finished or died
// Each line also names the copy of shard K that wrote it ("copy": an id unique to that
// copy; absent in traces written before chain replication). Each copy appends its lines
// in the order it handled the events, so the lines of one copy are that copy's history;
// check_trace verifies the SSP guarantee from each history. (Copies apply a push at
// different moments: a head's late apply says nothing about what the tail had answered.)
#include <cstdint>
#include <string>
#include <vector>

namespace ps {

struct trace_event {
  enum kind_type { push, pull, leave } kind = push;
  std::uint32_t worker = 0;
  std::uint64_t clock = 0;
  std::uint32_t shard = 0;
  // pull only: the min clock when the pull passed the gate (left_clock when no worker is
  // live: "inf")
  std::uint64_t min_clock = 0;
  std::uint64_t staleness = 0;  // pull only; infinite_staleness for ASP
  std::uint64_t copy = 0;       // the copy of the shard that wrote it (0: not named)
  // push only: planned by an older map than the shard's (passed on by the shard that gave
  // the keys away, or handed over deferred). The trace names no keys, and such a push is
  // of keys that were elsewhere, so the per-copy order below does not bind it; reads of
  // moved keys are checked by whoever reads them (sim checks every value it reads).
  bool moved = false;
};

std::string to_json(const trace_event& e);
// Throws bad_request naming the line and what is wrong with it.
trace_event parse_trace_line(const std::string& line);

struct trace_report {
  std::uint64_t pushes = 0, pulls = 0;
  std::uint64_t max_lag = 0;  // largest (reader's clock - min clock) among pulls answered
  // Pulls answered by a copy after their reader left its clock vector: not checked (the
  // reader counts as +infinity there, so no bound holds for it).
  std::uint64_t reads_after_leave = 0;
  std::vector<std::string> violations;  // empty: the trace keeps the guarantee
};

// For every pull at clock c with bound s answered by a copy of shard k: min_clock >= c - s; no push
// with clock <= c - s - 1 reached that copy after the pull (from any worker); and none of
// the reader's own pushes with clock <= c - 1 did (read-my-writes); under BSP (s = 0), no
// push of clock >= c reached shard k before it (reads are exact). A pull a copy answered
// after its reader's leave line is not checked (trace_report::reads_after_leave).
trace_report check_trace(const std::vector<trace_event>& events);

}  // namespace ps
