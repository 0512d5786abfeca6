// Request latencies as a worker sees them (request sent to answer complete), summed into
// a histogram of log-spaced buckets (4 per octave, so a percentile is within 19% of the
// true value) and taken as p50/p99 once per progress report. Thread-safe: the client's
// actor records, the app's thread takes.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>

namespace ps {

struct latency_summary {
  std::uint64_t count = 0;
  double p50_ms = 0, p99_ms = 0;  // 0 when count is 0
};

class latency_recorder {
 public:
  void record(double microseconds);
  // What was recorded since the last take, and a fresh start.
  latency_summary take();

 private:
  static constexpr std::size_t buckets = 128;  // up to 2^32 µs
  std::mutex mtx_;
  std::array<std::uint64_t, buckets> counts_{};
  std::uint64_t total_ = 0;
};

}  // namespace ps
