#include "libps/rows/count_min.hpp"

#include <algorithm>
#include <limits>

#include "libps/keys/hash.hpp"
#include "libps/keys/keys.hpp"

namespace ps {

count_min_sketch::count_min_sketch(unsigned width_bits, unsigned depth) : width_bits_(width_bits), depth_(depth) {
  if (width_bits < 4 || width_bits > 30 || depth < 1 || depth > 8)
    throw bad_request("count-min sketch: width 2^" + std::to_string(width_bits) + " x depth " + std::to_string(depth) +
                      " is not within 2^4..2^30 x 1..8");
  counters_.assign(static_cast<std::size_t>(depth) << width_bits, 0);
}

std::size_t count_min_sketch::cell(unsigned row, std::uint64_t key) const {
  // One independent hash per row: the key mixed with the row's own constant.
  auto h = mix64(key ^ mix64(0x5bd1e995u + row));
  return (static_cast<std::size_t>(row) << width_bits_) + (h >> (64 - width_bits_));
}

std::uint32_t count_min_sketch::estimate(std::uint64_t key) const {
  std::uint32_t least = std::numeric_limits<std::uint16_t>::max();
  for (unsigned r = 0; r < depth_; ++r) least = std::min<std::uint32_t>(least, counters_[cell(r, key)]);
  return least;
}

std::uint32_t count_min_sketch::add(std::uint64_t key) {
  // Conservative update: only counters at the current minimum grow, so keys sharing a
  // counter with a frequent one are overcounted far less than by incrementing all.
  auto next = estimate(key);
  if (next < std::numeric_limits<std::uint16_t>::max()) ++next;
  for (unsigned r = 0; r < depth_; ++r) {
    auto& c = counters_[cell(r, key)];
    if (c < next) c = static_cast<std::uint16_t>(next);
  }
  return next;
}

void count_min_sketch::merge(const std::vector<std::uint16_t>& counters) { add_counts(counters_, counters); }

void add_counts(std::vector<std::uint16_t>& into, const std::vector<std::uint16_t>& from) {
  if (from.size() != into.size())
    throw bad_request("count-min sketch: " + std::to_string(from.size()) + " saved counters, this sketch has " +
                      std::to_string(into.size()));
  for (std::size_t i = 0; i < from.size(); ++i)
    into[i] = static_cast<std::uint16_t>(
      std::min<std::uint32_t>(std::numeric_limits<std::uint16_t>::max(), std::uint32_t{into[i]} + from[i]));
}

}  // namespace ps
