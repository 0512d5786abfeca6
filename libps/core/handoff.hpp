#pragma once
// What a shard hands over when the map changes under it (a shard joins, or one leaves):
// the dense keys and sparse rows the new map gives to another shard, with everything
// needed to go on serving them exactly — their optimizer state, the pushes of them still
// deferred (BSP, mid-clock), the giver's clock vector and which (worker, seq) updates it
// had applied (so a resend after the move is not applied twice). Live elasticity
// (docs/elasticity.md): shard_core::hand_off and take_over decide; the shard actors carry
// them (encoded, below) from giver to taker.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "libps/persist/checkpoint.hpp"
#include "libps/core/duplicate_filter.hpp"
#include "libps/keys/partitioner.hpp"

namespace ps {

// A push a shard acknowledged but applies only when its clock completes (BSP).
struct deferred_update {
  std::uint64_t epoch = 0;
  std::uint32_t worker = 0;
  std::uint64_t clock = 0;
  std::uint64_t seq = 0;
  std::vector<key_range> ranges;           // dense keys (values back to back) ...
  std::vector<float> values;
  std::optional<std::uint32_t> table = {};  // ... or rows `ids` of this table
  std::vector<std::uint64_t> ids = {};
};

struct shard_handoff {
  std::uint32_t from = 0, to = 0;
  std::uint64_t epoch = 0;                  // of the map that moved them
  std::vector<stored_segment> segments;     // dense keys, with their optimizer state
  std::vector<table_rows> rows;             // sparse rows, by table
  std::vector<deferred_update> deferred;    // pushes of them not applied yet
  std::vector<std::uint64_t> clocks;        // the giver's clock vector
  duplicate_filter applied;                 // the (worker, seq) the giver had applied
  std::uint64_t highest_clock = 0;
  // Row admission's counts (row_tier::sightings; empty: no table admits after more than
  // one push): the taker adds them to its own, so an id the giver had seen is admitted on
  // the pushes it still lacked, never later.
  std::vector<std::uint16_t> sightings = {};
  // A page of rows a giver with a disk tier took off its disk: only `rows` count (the
  // taker holds them as rows it never had). Such pages come before the giver's last part,
  // which carries the rest (its deferred pushes apply to rows the pages brought).
  bool rows_only = false;
  // Rows-only pages of a giver that copied the moved rows ahead of the change
  // (shard_core::begin_precopy): at the cut it sends again only the rows that changed
  // since, marked `again` when the taker had them from the copy (not counted twice).
  bool again = false;
  // Everything a shard holds, seeding a new copy of it (shard_core::whole_copy; epoch is
  // then the shard's took_over_at): its clocks are taken as they are, and `merges` says
  // whether the copy merges later handoffs' clocks as its source would.
  bool whole = false;
  bool merges = false;
};

// The fraction of `keys` (a job's dense tensors) whose owner differs between two maps of
// the same bucket size: what a map change moves (0 for no keys). Throws bad_request when
// the bucket sizes differ.
double moved_key_fraction(const partitioner& before, const partitioner& after, const std::vector<key_range>& keys);

// Cuts segments at bucket boundaries by the owner `next` gives each bucket: per owner, its
// pieces, values and each of `slots` state slots sliced alike. Throws bad_request for a
// segment whose values or state do not fit its keys.
std::map<std::uint32_t, std::vector<stored_segment>> split_by_owner(const std::vector<stored_segment>& segments,
                                                                    const partitioner& next, std::size_t slots);

// A deferred dense push cut the same way (its ranges and values), by owner.
std::map<std::uint32_t, deferred_update> split_by_owner(const deferred_update& d, const partitioner& next,
                                                        std::uint32_t row_dim);

}  // namespace ps
