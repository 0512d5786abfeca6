#pragma once
// Where a shard keeps its parameters and optimizer state, behind one interface so the
// shard's logic (libps/core/shard_core.hpp) does not depend on how they are stored: the dense
// in-memory store (libps/core/shard_store.hpp) is the implementation. Sparse rows are kept
// apart: a RAM tier (libps/rows/row_tier.hpp) over a row_store (libps/rows/row_store.hpp).
#include <cstdint>
#include <span>
#include <vector>

#include "libps/keys/keys.hpp"

namespace ps {

// One segment of a shard's parameters as it goes into a checkpoint.
struct stored_segment {
  key_type begin = 0, end = 0;
  std::vector<float> values;
  std::vector<float> state;  // state_slots() slots of (end - begin) floats, slot-major
};

class param_store {
 public:
  virtual ~param_store() = default;
  // Folds a gradient into each range (values back to back) with the update rule.
  // Throws bad_request when ranges are malformed or the value count does not match.
  virtual void push(const std::vector<key_range>& ranges, const float* values, std::uint64_t num_values) = 0;
  // Sets ranges never seen before; ranges already present keep theirs (first wins).
  virtual void init(const std::vector<key_range>& ranges, const float* values, std::uint64_t num_values) = 0;
  // Copies the current values of each range back to back into out.
  virtual void pull(const std::vector<key_range>& ranges, float* out, std::uint64_t num_values) const = 0;
  // Where the current values lie, in order (valid until the next change).
  virtual std::vector<std::span<const float>> view(const std::vector<key_range>& ranges,
                                                   std::uint64_t num_values) const = 0;
  // Everything held, for a checkpoint; restore replaces the contents with it.
  virtual std::vector<stored_segment> snapshot() const = 0;
  virtual void restore(const std::vector<stored_segment>& segments) = 0;
  virtual std::uint64_t num_keys() const = 0;
};

}  // namespace ps
