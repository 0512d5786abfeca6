#include "libps/partitioner.hpp"

#include <algorithm>

namespace ps {

std::uint64_t mix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

partitioner::partitioner(std::uint64_t epoch, std::vector<std::uint32_t> shard_ids,
                         std::uint32_t vnodes, std::uint32_t bucket_bits)
    : epoch_(epoch), shard_ids_(std::move(shard_ids)), vnodes_(vnodes), bucket_bits_(bucket_bits) {
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
}

std::uint32_t partitioner::owner_of_bucket(std::uint64_t bucket) const {
  auto h = mix64(bucket ^ 0x5851f42d4c957f2dULL);
  auto it = std::lower_bound(ring_.begin(), ring_.end(), std::make_pair(h, std::uint32_t{0}));
  return it == ring_.end() ? ring_.front().second : it->second;
}

std::vector<piece> partitioner::split(const key_set& keys) const {
  std::vector<piece> out;
  std::uint64_t offset = 0;
  for (const auto& r : keys.ranges()) {
    for (key_type k = r.begin; k < r.end;) {
      auto bucket = k >> bucket_bits_;
      key_type bucket_end = (bucket + 1) << bucket_bits_;
      key_type stop = (bucket_end == 0 || bucket_end > r.end) ? r.end : bucket_end;  // 0: wrapped
      auto shard = owner_of_bucket(bucket);
      if (!out.empty() && out.back().shard == shard && out.back().keys.end == k &&
          out.back().value_offset + out.back().keys.size() == offset)
        out.back().keys.end = stop;
      else
        out.push_back({{k, stop}, offset, shard});
      offset += stop - k;
      k = stop;
    }
  }
  return out;
}

partitioner partitioner::with_shard(std::uint32_t id) const {
  auto ids = shard_ids_;
  ids.push_back(id);
  return partitioner(epoch_ + 1, std::move(ids), vnodes_, bucket_bits_);
}

partitioner partitioner::without_shard(std::uint32_t id) const {
  auto ids = shard_ids_;
  auto it = std::find(ids.begin(), ids.end(), id);
  if (it == ids.end())
    throw bad_request("partitioner: no shard " + std::to_string(id) + " to remove");
  ids.erase(it);
  return partitioner(epoch_ + 1, std::move(ids), vnodes_, bucket_bits_);
}

}  // namespace ps
