#pragma once
// Consistent hashing with virtual nodes over key buckets. The key space is cut into
// buckets of 2^bucket_bits consecutive keys (a bucket never straddles shards, so a
// tensor stays in few contiguous pieces); each bucket belongs to the first virtual node
// clockwise of its hash. Adding or removing one of n shards moves about 1/n of the buckets.
//
// A job's dense tensors (the `balanced` ranges) hold few buckets, too few for hashing
// alone to spread them evenly (the softmax model's 2 buckets of 4096 keys both hashed to
// one of 2 shards), and a tensor whose buckets are scattered over the shards travels as
// many small ranges (a 7,850-key pull as ~128 ranges per shard). So their buckets are
// placed in contiguous runs: in key order, cut into one run of equal weight per shard (at
// bucket boundaries, so within one bucket of the mean), run j on the j-th smallest shard
// id. A tensor then lies in at most one piece per shard, as ps-lite's range partitioning
// has it. A fresh map's placement depends only on the shards and the ranges, so every
// member computes the same one. A join or a departure (with_shard, without_shard) moves
// as little as it can instead: the newcomer takes each shard's excess over the new mean
// from the end of its run (about 1/(n+1) of the keys, in n pieces); a leaver's buckets go,
// in key order, to the shards below the new mean. Such a placement is history, not a
// function of the shard ids: maps that follow a join carry it (placement()).
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "libps/keys/hash.hpp"
#include "libps/keys/keys.hpp"

namespace ps {

// A run of keys owned by one shard; its values start at value_offset in the caller's buffer.
struct piece {
  key_range keys;
  std::uint64_t value_offset = 0;
  std::uint32_t shard = 0;
  friend bool operator==(const piece&, const piece&) = default;
};

class partitioner {
 public:
  static constexpr std::uint32_t default_vnodes = 128;
  static constexpr std::uint32_t default_bucket_bits = 12;

  // Throws bad_request on an empty or duplicate shard list, out-of-range parameters or
  // balanced ranges that are not ascending and disjoint.
  partitioner(std::uint64_t epoch, std::vector<std::uint32_t> shard_ids,
              std::uint32_t vnodes = default_vnodes,
              std::uint32_t bucket_bits = default_bucket_bits,
              std::vector<key_range> balanced = {});

  std::uint32_t owner_of_bucket(std::uint64_t bucket) const;
  std::uint32_t owner(key_type key) const { return owner_of_bucket(key >> bucket_bits_); }

  // The owner of key `at` and where the keys from `at` known to share it end (at most
  // `end`, which must be above `at`): the end of a run of placed buckets, found in one
  // lookup, or else the end of at's bucket. Walking a tensor costs a lookup per run, not
  // per bucket (a 4 KiB request in bench_kv crossed 16 to 256 buckets, each a hash lookup
  // on both sides).
  struct span {
    std::uint32_t shard;
    key_type end;
  };
  span owner_span(key_type at, key_type end) const;

  // The first of `ranges` with a key `id` does not own, and that key's owner.
  struct foreign_key {
    std::size_t range;
    std::uint32_t owner;
  };
  std::optional<foreign_key> first_not_owned(const std::vector<key_range>& ranges, std::uint32_t id) const;

  // The owner of row `id` of sparse table `table`: the ring's owner of the row's own hash
  // (rows are not in buckets: a hot row lands wherever it hashes, and a shard joining or
  // leaving moves about 1/n of every table's rows).
  std::uint32_t row_owner(std::uint32_t table, std::uint64_t id) const;

  // Cuts a key set at bucket boundaries and tags each piece with its owner; adjacent
  // pieces with the same owner are merged.
  std::vector<piece> split(const key_set& keys) const;

  // A new map (epoch + 1) with one shard more or less: the ring's buckets and rows move
  // only to the newcomer (or only from the leaver), the balanced buckets as above.
  // Throws bad_request for an id already there, or not there.
  partitioner with_shard(std::uint32_t id) const;
  partitioner without_shard(std::uint32_t id) const;

  // The balanced buckets' owners, in bucket order.
  using placement_list = std::vector<std::pair<std::uint64_t, std::uint32_t>>;
  placement_list placement() const;
  // This map with the balanced buckets placed so (a placement() of a map with the same
  // shards and ranges). Throws bad_request naming a bucket that is not balanced, missing or
  // placed on a shard that is not in the map.
  partitioner with_placement(const placement_list& placement) const;

  std::uint64_t epoch() const { return epoch_; }
  const std::vector<std::uint32_t>& shard_ids() const { return shard_ids_; }
  std::uint32_t vnodes() const { return vnodes_; }
  std::uint32_t bucket_bits() const { return bucket_bits_; }
  const std::vector<key_range>& balanced() const { return balanced_; }

  // The largest bucket size (as bits) that cuts `keys` keys into at least 128 buckets per
  // shard (so one bucket is under 1% of a shard's share), at most 20 bits.
  static std::uint32_t bucket_bits_for(std::uint64_t keys, std::size_t shards);

 private:
  // Consecutive placed buckets on one shard.
  struct placed_run {
    std::uint64_t first, last;  // buckets, inclusive (the last bucket's end key may not fit in 64 bits)
    std::uint32_t shard;
  };
  std::uint32_t ring_owner(std::uint64_t bucket) const;
  std::uint32_t owner_of_point(std::uint64_t point) const;  // the first virtual node clockwise
  const placed_run* run_of(std::uint64_t bucket) const;    // nullptr: bucket is on the ring
  void place_balanced();
  void index_runs();  // runs_ from placed_
  // Each balanced bucket's weight (its keys in the balanced ranges), in key order.
  std::map<std::uint64_t, std::uint64_t> balanced_weights() const;
  // The balanced buckets' weights, the keys of them each shard holds, and their total.
  struct balance {
    std::map<std::uint64_t, std::uint64_t> weight;
    std::map<std::uint32_t, std::uint64_t> load;
    std::uint64_t total = 0;
  };
  balance balance_now() const;

  std::uint64_t epoch_;
  std::vector<std::uint32_t> shard_ids_;
  std::uint32_t vnodes_;
  std::uint32_t bucket_bits_;
  std::vector<key_range> balanced_;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> ring_;  // (position, shard id), sorted
  std::map<std::uint64_t, std::uint32_t> placed_;  // bucket -> shard, for balanced buckets
  std::vector<placed_run> runs_;  // placed_ as runs, what lookups read
};

}  // namespace ps
