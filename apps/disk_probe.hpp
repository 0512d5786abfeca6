#pragma once
// What the disk under a directory serves: random 4 KiB reads with O_DIRECT (the page
// cache bypassed) from several threads at once, as the disk tier reads. bench_sparse
// measures it at the start of a run and its worker right before and right after each
// measured cell: on this VM the device's rate drifts (31,500 to 67,300 reads/s at the
// start of four runs in one morning; 48,300 at one run's start and 73,900 beside a cell
// minutes later, BENCHMARKS.md), so a figure minutes old says little about the cell.
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <string>

namespace ps {

// Calls step(thread, rng) from `threads` threads at once for `seconds`; step returns how
// many operations it did, or nullopt for a failure (the run stops then). The operations
// done and their rate, or nullopt when a step failed.
struct timed_ops {
  std::uint64_t done = 0;
  double per_s = 0;
};
std::optional<timed_ops> timed_rate(std::size_t threads, double seconds,
                                    const std::function<std::optional<std::uint64_t>(std::size_t, std::mt19937_64&)>& step);

// A file of `bytes` written once in `dir` (unlinked at once: gone when the probe is),
// read at random 4 KiB offsets on each call. Throws bad_request naming the file when it
// cannot be made, written or read.
class disk_probe {
 public:
  static constexpr std::uint64_t default_bytes = 1ull << 30;
  disk_probe(const std::string& dir, std::uint64_t bytes = default_bytes);
  ~disk_probe();
  disk_probe(const disk_probe&) = delete;
  disk_probe& operator=(const disk_probe&) = delete;
  // Reads per second from `threads` threads over `seconds`.
  double reads_per_s(double seconds, std::size_t threads) const;

 private:
  std::string path_;
  std::uint64_t bytes_;
  int fd_ = -1;
};

}  // namespace ps
