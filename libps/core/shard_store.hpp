#pragma once
// The parameters (and optimizer state) one server shard owns: disjoint segments of
// consecutive keys, each a dense float array. Keys a push touches for the first time
// start at 0 (ps-lite semantics); a pull of keys never pushed or initialized is an error.
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "libps/keys/keys.hpp"
#include "libps/core/param_store.hpp"
#include "libps/core/update_rule.hpp"

namespace ps {

// The dense in-memory implementation of param_store.
class shard_store final : public param_store {
 public:
  explicit shard_store(update_rule rule);

  // Folds a gradient into each range (values back to back) with the update rule.
  // Throws bad_request when ranges are malformed or the value count does not match.
  void push(const std::vector<key_range>& ranges, const float* values, std::uint64_t num_values) override;
  // Sets ranges never seen before to the given values; ranges already present keep
  // theirs (so every worker may initialize, the first one wins). A range that is only
  // partly present is an error.
  void init(const std::vector<key_range>& ranges, const float* values, std::uint64_t num_values) override;
  // Copies the current values of each range back to back into out.
  void pull(const std::vector<key_range>& ranges, float* out, std::uint64_t num_values) const override;
  // Where the current values of the ranges lie, in order (valid until the next change),
  // so a pull can be written out without a copy. The same checks as pull.
  std::vector<std::span<const float>> view(const std::vector<key_range>& ranges, std::uint64_t num_values) const override;
  // The checks push makes on its arguments, without applying anything (for pushes that
  // are queued before they are applied). Throws bad_request.
  static void check_push(const std::vector<key_range>& ranges, std::uint64_t num_values);

  // Everything the shard holds, for a checkpoint; restore replaces the contents with it.
  // restore throws bad_request when segments overlap, are empty or have the wrong sizes.
  std::vector<stored_segment> snapshot() const override;
  void restore(const std::vector<stored_segment>& segments) override;

  std::uint64_t num_keys() const override;
  std::size_t num_segments() const { return segments_.size(); }
  const update_rule& rule() const { return rule_; }

 private:
  struct segment {
    key_type end;
    std::vector<float> values;
    std::vector<float> state;  // rule_.state_slots() slots, slot-major
  };
  using map_type = std::map<key_type, segment>;

  map_type::iterator ensure(key_range r);           // one segment holding all of r
  bool covered(key_range r) const;                   // every key of r present
  bool touches(key_range r) const;                   // some key of r present

  update_rule rule_;
  map_type segments_;
};

}  // namespace ps
