#include "libps/core/shard_store.hpp"

#include <algorithm>
#include <cstring>

namespace ps {

namespace {

void check_sizes(const std::vector<key_range>& ranges, std::uint64_t num_values, const char* op) {
  auto keys = count_keys(ranges);  // throws on malformed ranges
  if (keys != num_values)
    throw bad_request(std::string(op) + " carries " + std::to_string(num_values) + " values for " +
                      std::to_string(keys) + " keys");
}

}  // namespace

std::vector<stored_segment> shard_store::snapshot() const {
  std::vector<stored_segment> out;
  for (const auto& [begin, seg] : segments_) out.push_back({begin, seg.end, seg.values, seg.state});
  return out;
}

void shard_store::restore(const std::vector<stored_segment>& segments) {
  map_type fresh;
  key_type last_end = 0;
  for (std::size_t i = 0; i < segments.size(); ++i) {
    const auto& s = segments[i];
    auto where = "segment " + std::to_string(i) + " [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ")";
    if (s.begin >= s.end) throw bad_request(where + " is empty");
    if (i > 0 && s.begin < last_end) throw bad_request(where + " overlaps the one before");
    if (s.values.size() != s.end - s.begin)
      throw bad_request(where + " has " + std::to_string(s.values.size()) + " values");
    if (s.state.size() != rule_.state_slots() * (s.end - s.begin))
      throw bad_request(where + " has " + std::to_string(s.state.size()) + " optimizer state values, the rule needs " +
                        std::to_string(rule_.state_slots() * (s.end - s.begin)));
    last_end = s.end;
    fresh.emplace(s.begin, segment{s.end, s.values, s.state});
  }
  segments_ = std::move(fresh);
}

void shard_store::check_push(const std::vector<key_range>& ranges, std::uint64_t num_values) {
  check_sizes(ranges, num_values, "push");
}

shard_store::shard_store(update_rule rule) : rule_(rule) {
  rule_.validate();
}

shard_store::map_type::iterator shard_store::ensure(key_range r) {
  auto it = segments_.upper_bound(r.begin);
  if (it != segments_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > r.begin)
      it = prev;
  }
  if (it != segments_.end() && it->first <= r.begin && it->second.end >= r.end)
    return it;  // the common case: the range lies inside one segment
  // Merge r with every segment it overlaps into one new segment.
  key_type lo = r.begin, hi = r.end;
  auto first = it;
  for (; it != segments_.end() && it->first < r.end; ++it) {
    lo = std::min(lo, it->first);
    hi = std::max(hi, it->second.end);
  }
  auto len = hi - lo;
  auto slots = rule_.state_slots();
  segment merged{hi, std::vector<float>(len, 0.0f), std::vector<float>(slots * len, 0.0f)};
  for (auto cur = first; cur != it; ++cur) {
    auto off = cur->first - lo;
    auto n = cur->second.end - cur->first;
    std::memcpy(merged.values.data() + off, cur->second.values.data(), n * sizeof(float));
    for (std::size_t s = 0; s < slots; ++s)
      std::memcpy(merged.state.data() + s * len + off, cur->second.state.data() + s * n,
                  n * sizeof(float));
  }
  segments_.erase(first, it);
  return segments_.emplace(lo, std::move(merged)).first;
}

void shard_store::push(const std::vector<key_range>& ranges, const float* values,
                       std::uint64_t num_values) {
  check_sizes(ranges, num_values, "push");
  auto slots = rule_.state_slots();
  float* state[3] = {nullptr, nullptr, nullptr};
  for (const auto& r : ranges) {
    auto it = ensure(r);
    auto& seg = it->second;
    auto off = r.begin - it->first;
    auto len = seg.end - it->first;
    for (std::size_t s = 0; s < slots; ++s)
      state[s] = seg.state.data() + s * len + off;
    rule_.apply(seg.values.data() + off, state, values, r.size());
    values += r.size();
  }
}

bool shard_store::covered(key_range r) const {
  for (key_type k = r.begin; k < r.end;) {
    auto it = segments_.upper_bound(k);
    if (it == segments_.begin()) return false;
    --it;
    if (it->second.end <= k) return false;
    k = it->second.end;
  }
  return true;
}

bool shard_store::touches(key_range r) const {
  auto it = segments_.lower_bound(r.end);
  if (it == segments_.begin()) return false;
  --it;  // last segment starting before r.end
  return it->second.end > r.begin;
}

void shard_store::init(const std::vector<key_range>& ranges, const float* values,
                       std::uint64_t num_values) {
  check_sizes(ranges, num_values, "init");
  for (const auto& r : ranges) {
    if (!touches(r)) {
      auto it = ensure(r);
      std::memcpy(it->second.values.data(), values, r.size() * sizeof(float));
    } else if (!covered(r)) {
      throw bad_request("init of keys " + to_string(r) + " overlaps keys initialized before only in part");
    }
    values += r.size();
  }
}

std::vector<std::span<const float>> shard_store::view(const std::vector<key_range>& ranges,
                                                      std::uint64_t num_values) const {
  check_sizes(ranges, num_values, "pull");
  std::vector<std::span<const float>> spans;
  for (const auto& r : ranges) {
    for (key_type k = r.begin; k < r.end;) {
      auto it = segments_.upper_bound(k);
      if (it == segments_.begin() || std::prev(it)->second.end <= k)
        throw bad_request("keys " + to_string({k, r.end}) + " were never pushed or initialized");
      --it;
      auto stop = std::min(it->second.end, r.end);
      spans.emplace_back(it->second.values.data() + (k - it->first), stop - k);
      k = stop;
    }
  }
  return spans;
}

void shard_store::pull(const std::vector<key_range>& ranges, float* out,
                       std::uint64_t num_values) const {
  for (auto s : view(ranges, num_values)) {
    std::memcpy(out, s.data(), s.size_bytes());
    out += s.size();
  }
}

std::uint64_t shard_store::num_keys() const {
  std::uint64_t n = 0;
  for (const auto& [begin, seg] : segments_)
    n += seg.end - begin;
  return n;
}

}  // namespace ps
