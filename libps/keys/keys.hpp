#pragma once
// Keys and key ranges. One key addresses one float; a tensor of n floats occupies a
// contiguous key range [begin, end), so messages carry ranges, never per-key lists.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace ps {

using key_type = std::uint64_t;

// Thrown by libps on bad input; the message names what was wrong.
struct bad_request : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct key_range {
  key_type begin = 0;
  key_type end = 0;  // exclusive
  std::uint64_t size() const { return end - begin; }
  bool empty() const { return begin >= end; }
  friend bool operator==(const key_range&, const key_range&) = default;
};

std::string to_string(const key_range& r);

// Throws bad_request unless the ranges are non-empty, ascending and disjoint; returns
// how many keys they hold.
std::uint64_t count_keys(const std::vector<key_range>& ranges);

// A sorted list of disjoint, non-empty key ranges: the keys of one push or pull.
// Values for a key_set are laid out in range order, back to back.
class key_set {
 public:
  key_set() = default;
  // Throws bad_request unless the ranges are non-empty, ascending and disjoint.
  explicit key_set(std::vector<key_range> ranges);
  // Sorted unique keys; adjacent keys are merged into ranges.
  static key_set from_keys(const std::vector<key_type>& keys);
  static key_set single(key_range r) { return key_set(std::vector<key_range>{r}); }

  const std::vector<key_range>& ranges() const { return ranges_; }
  std::uint64_t num_keys() const { return num_keys_; }

 private:
  std::vector<key_range> ranges_;
  std::uint64_t num_keys_ = 0;
};

}  // namespace ps
