#pragma once
// A count-min sketch (Cormode and Muthukrishnan, 2005) with conservative update: how
// often each 64-bit key was seen, in fixed memory, never under the true count and rarely
// far above it. A table's row admission uses it (libps/rows/sparse_table.hpp): a row is
// created only once its id was pushed `admit_after` times, without holding anything per
// id before then (ids are unbounded; most of a click log's ids are seen once).
#include <cstdint>
#include <vector>

namespace ps {

class count_min_sketch {
 public:
  // depth rows of 2^width_bits saturating 16-bit counters (depth * 2^(width_bits+1) bytes).
  explicit count_min_sketch(unsigned width_bits = 20, unsigned depth = 4);
  // Counts one more sighting of key; returns its estimate after it.
  std::uint32_t add(std::uint64_t key);
  std::uint32_t estimate(std::uint64_t key) const;
  // The counters, to save, and saved counters added in (saturating): a sum of sketches
  // of the same shape never counts under the truth of the keys they saw together.
  // merge throws bad_request for counters of another shape.
  const std::vector<std::uint16_t>& counters() const { return counters_; }
  void merge(const std::vector<std::uint16_t>& counters);

 private:
  std::size_t cell(unsigned row, std::uint64_t key) const;
  unsigned width_bits_;
  unsigned depth_;
  std::vector<std::uint16_t> counters_;  // row-major, depth_ rows
};

// Adds saved counters into others of the same shape, saturating at 2^16 - 1; throws
// bad_request for another shape.
void add_counts(std::vector<std::uint16_t>& into, const std::vector<std::uint16_t>& from);

}  // namespace ps
