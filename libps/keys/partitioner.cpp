#include "libps/keys/partitioner.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace ps {

partitioner::partitioner(std::uint64_t epoch, std::vector<std::uint32_t> shard_ids,
                         std::uint32_t vnodes, std::uint32_t bucket_bits, std::vector<key_range> balanced)
    : epoch_(epoch), shard_ids_(std::move(shard_ids)), vnodes_(vnodes), bucket_bits_(bucket_bits),
      balanced_(std::move(balanced)) {
  if (shard_ids_.empty())
    throw bad_request("partitioner: no shards");
  if (vnodes_ == 0 || vnodes_ > 65536)
    throw bad_request("partitioner: vnodes must be in [1, 65536], got " + std::to_string(vnodes_));
  if (bucket_bits_ > 40)
    throw bad_request("partitioner: bucket_bits must be <= 40, got " + std::to_string(bucket_bits_));
  std::sort(shard_ids_.begin(), shard_ids_.end());
  if (std::adjacent_find(shard_ids_.begin(), shard_ids_.end()) != shard_ids_.end())
    throw bad_request("partitioner: duplicate shard id");
  ring_.reserve(shard_ids_.size() * vnodes_);
  for (auto id : shard_ids_)
    for (std::uint32_t v = 0; v < vnodes_; ++v)
      ring_.emplace_back(mix64((std::uint64_t{id} << 32) ^ (v * 0x2545f4914f6cdd1dULL)), id);
  std::sort(ring_.begin(), ring_.end());
  count_keys(balanced_);  // ascending and disjoint, or bad_request
  place_balanced();
  index_runs();
}

namespace {

std::uint64_t bucket_hash(std::uint64_t bucket) { return mix64(bucket ^ 0x5851f42d4c957f2dULL); }

// Cuts r at bucket boundaries: f(bucket, begin, end) for each part, in key order.
template <class F>
void for_each_bucket(key_range r, std::uint32_t bits, F f) {
  for (key_type k = r.begin; k < r.end;) {
    auto bucket = k >> bits;
    key_type bucket_end = (bucket + 1) << bits;
    key_type stop = (bucket_end == 0 || bucket_end > r.end) ? r.end : bucket_end;  // 0: wrapped
    f(bucket, k, stop);
    k = stop;
  }
}

}  // namespace

std::uint32_t partitioner::owner_of_point(std::uint64_t point) const {
  auto it = std::lower_bound(ring_.begin(), ring_.end(), std::make_pair(point, std::uint32_t{0}));
  return it == ring_.end() ? ring_.front().second : it->second;
}

std::uint32_t partitioner::ring_owner(std::uint64_t bucket) const { return owner_of_point(bucket_hash(bucket)); }

std::uint32_t partitioner::row_owner(std::uint32_t table, std::uint64_t id) const {
  return owner_of_point(mix64(id ^ mix64(0x726f7773ULL + table)));  // "rows" + table: tables hash apart
}

void partitioner::index_runs() {
  runs_.clear();
  for (const auto& [bucket, shard] : placed_)
    if (!runs_.empty() && runs_.back().last + 1 == bucket && runs_.back().shard == shard)
      runs_.back().last = bucket;
    else
      runs_.push_back({bucket, bucket, shard});
}

const partitioner::placed_run* partitioner::run_of(std::uint64_t bucket) const {
  auto after = std::upper_bound(runs_.begin(), runs_.end(), bucket,
                                [](std::uint64_t b, const placed_run& r) { return b < r.first; });
  if (after == runs_.begin() || std::prev(after)->last < bucket) return nullptr;
  return &*std::prev(after);
}

std::uint32_t partitioner::owner_of_bucket(std::uint64_t bucket) const {
  const auto* run = run_of(bucket);
  return run ? run->shard : ring_owner(bucket);
}

partitioner::span partitioner::owner_span(key_type at, key_type end) const {
  const auto bucket = at >> bucket_bits_;
  const auto* run = run_of(bucket);
  const auto last = run ? run->last : bucket;
  const key_type last_key = (last << bucket_bits_) | ((key_type{1} << bucket_bits_) - 1);
  return {run ? run->shard : ring_owner(bucket), last_key >= end - 1 ? end : last_key + 1};
}

std::optional<partitioner::foreign_key> partitioner::first_not_owned(const std::vector<key_range>& ranges,
                                                                     std::uint32_t id) const {
  for (std::size_t i = 0; i < ranges.size(); ++i)
    for (key_type at = ranges[i].begin; at < ranges[i].end;) {
      auto [shard, stop] = owner_span(at, ranges[i].end);
      if (shard != id) return foreign_key{i, shard};
      at = stop;
    }
  return std::nullopt;
}

std::map<std::uint64_t, std::uint64_t> partitioner::balanced_weights() const {
  std::map<std::uint64_t, std::uint64_t> weight;
  for (const auto& r : balanced_)
    for_each_bucket(r, bucket_bits_, [&](std::uint64_t bucket, key_type begin, key_type end) { weight[bucket] += end - begin; });
  return weight;
}

partitioner::balance partitioner::balance_now() const {
  balance b;
  b.weight = balanced_weights();
  for (auto id : shard_ids_) b.load[id] = 0;
  for (const auto& [bucket, w] : b.weight) {
    b.load[placed_.at(bucket)] += w;
    b.total += w;
  }
  return b;
}

void partitioner::place_balanced() {
  const auto weight = balanced_weights();
  std::uint64_t total = 0;
  for (const auto& [bucket, w] : weight) total += w;
  if (weight.empty()) return;
  // Contiguous runs: the buckets in key order are cut into n runs of equal weight, run j
  // for the j-th smallest shard id; a bucket goes to the run its middle key falls in.
  const auto& ids = shard_ids_;  // sorted
  const auto n = ids.size();
  std::uint64_t before = 0;  // weight of the buckets before this one
  for (const auto& [bucket, w] : weight) {
    auto middle = static_cast<unsigned __int128>(before) * 2 + w;  // twice the middle key's rank
    auto run = static_cast<std::size_t>(middle * n / (static_cast<unsigned __int128>(total) * 2));
    placed_[bucket] = ids[std::min(run, n - 1)];
    before += w;
  }
}

std::uint32_t partitioner::bucket_bits_for(std::uint64_t keys, std::size_t shards) {
  std::uint32_t bits = 0;
  while (bits < 20 && (keys >> (bits + 1)) >= 128 * std::max<std::size_t>(1, shards)) ++bits;
  return bits;
}

std::vector<piece> partitioner::split(const key_set& keys) const {
  std::vector<piece> out;
  std::uint64_t offset = 0;
  for (const auto& r : keys.ranges())
    for (key_type k = r.begin; k < r.end;) {
      auto [shard, stop] = owner_span(k, r.end);
      if (!out.empty() && out.back().shard == shard && out.back().keys.end == k &&
          out.back().value_offset + out.back().keys.size() == offset)
        out.back().keys.end = stop;
      else
        out.push_back({{k, stop}, offset, shard});
      offset += stop - k;
      k = stop;
    }
  return out;
}

partitioner partitioner::with_shard(std::uint32_t id) const {
  if (std::binary_search(shard_ids_.begin(), shard_ids_.end(), id))
    throw bad_request("partitioner: shard " + std::to_string(id) + " is in the map already");
  auto ids = shard_ids_;
  ids.push_back(id);
  partitioner grown(epoch_ + 1, std::move(ids), vnodes_, bucket_bits_, balanced_);
  auto [weight, load, total] = balance_now();
  if (weight.empty()) return grown;
  grown.placed_ = placed_;
  const double mean = static_cast<double>(total) / static_cast<double>(shard_ids_.size() + 1);
  // Each shard gives the newcomer buckets from the end of its keys while it stays above
  // the new mean by at least half of the bucket it gives.
  for (auto it = weight.rbegin(); it != weight.rend(); ++it) {
    auto& owner = grown.placed_[it->first];
    auto& keys = load[owner];
    if (owner == id || static_cast<double>(keys) - mean < static_cast<double>(it->second) / 2) continue;
    keys -= it->second;
    owner = id;
  }
  grown.index_runs();
  return grown;
}

partitioner partitioner::without_shard(std::uint32_t id) const {
  auto ids = shard_ids_;
  auto it = std::find(ids.begin(), ids.end(), id);
  if (it == ids.end())
    throw bad_request("partitioner: no shard " + std::to_string(id) + " to remove");
  ids.erase(it);
  partitioner shrunk(epoch_ + 1, std::move(ids), vnodes_, bucket_bits_, balanced_);
  auto [weight, load, total] = balance_now();
  if (weight.empty()) return shrunk;
  shrunk.placed_ = placed_;
  load.erase(id);
  const double mean = static_cast<double>(total) / static_cast<double>(shrunk.shard_ids_.size());
  // The leaver's buckets in key order, each to the first shard (by id) still below the new
  // mean by half the bucket, so consecutive buckets stay together; else the lightest.
  for (const auto& [bucket, w] : weight) {
    auto& owner = shrunk.placed_[bucket];
    if (owner != id) continue;
    auto to = std::find_if(load.begin(), load.end(), [&, w = w](const auto& l) {
      return static_cast<double>(l.second) + static_cast<double>(w) / 2 <= mean;
    });
    if (to == load.end())
      to = std::min_element(load.begin(), load.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    owner = to->first;
    to->second += w;
  }
  shrunk.index_runs();
  return shrunk;
}

partitioner::placement_list partitioner::placement() const {
  return {placed_.begin(), placed_.end()};
}

partitioner partitioner::with_placement(const placement_list& placement) const {
  partitioner out = *this;
  std::map<std::uint64_t, std::uint32_t> placed;
  const auto weight = balanced_weights();
  if (placement.size() != weight.size())
    throw bad_request("partitioner: a placement of " + std::to_string(placement.size()) + " buckets for " +
                      std::to_string(weight.size()) + " balanced buckets");
  for (const auto& [bucket, shard] : placement) {
    if (!weight.count(bucket))
      throw bad_request("partitioner: placement names bucket " + std::to_string(bucket) + ", which is not balanced");
    if (!std::binary_search(shard_ids_.begin(), shard_ids_.end(), shard))
      throw bad_request("partitioner: placement puts bucket " + std::to_string(bucket) + " on shard " +
                        std::to_string(shard) + ", which is not in the map");
    if (!placed.emplace(bucket, shard).second)
      throw bad_request("partitioner: placement names bucket " + std::to_string(bucket) + " twice");
  }
  out.placed_ = std::move(placed);
  out.index_runs();
  return out;
}

}  // namespace ps
