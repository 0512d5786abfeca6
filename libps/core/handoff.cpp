#include "libps/core/handoff.hpp"

#include <algorithm>
#include <string>

#include "libps/keys/keys.hpp"

namespace ps {

namespace {

// Keys [begin, end) of segment s, as a segment of its own.
stored_segment slice(const stored_segment& s, key_type begin, key_type end, std::size_t slots) {
  const auto n = s.end - s.begin;
  stored_segment out{begin, end, {}, {}};
  out.values.assign(s.values.begin() + static_cast<std::ptrdiff_t>(begin - s.begin),
                    s.values.begin() + static_cast<std::ptrdiff_t>(end - s.begin));
  for (std::size_t k = 0; k < slots; ++k) {
    auto from = s.state.begin() + static_cast<std::ptrdiff_t>(k * n + (begin - s.begin));
    out.state.insert(out.state.end(), from, from + static_cast<std::ptrdiff_t>(end - begin));
  }
  return out;
}

// The runs of [begin, end) with one owner under `next` (split's pieces; none when empty).
template <class F>
void for_each_run(key_type begin, key_type end, const partitioner& next, F f) {
  if (begin >= end) return;
  for (const auto& p : next.split(key_set::single({begin, end}))) f(p.shard, p.keys.begin, p.keys.end);
}

}  // namespace


double moved_key_fraction(const partitioner& before, const partitioner& after, const std::vector<key_range>& keys) {
  if (before.bucket_bits() != after.bucket_bits())
    throw bad_request("maps with buckets of 2^" + std::to_string(before.bucket_bits()) + " and 2^" +
                      std::to_string(after.bucket_bits()) + " keys cannot be compared");
  const auto bits = before.bucket_bits();
  std::uint64_t total = 0, moved = 0;
  for (const auto& r : keys)
    for (key_type at = r.begin; at < r.end;) {
      auto next = std::min(r.end, ((at >> bits) + 1) << bits);
      total += next - at;
      if (before.owner(at) != after.owner(at)) moved += next - at;
      at = next;
    }
  return total == 0 ? 0.0 : static_cast<double>(moved) / static_cast<double>(total);
}


std::map<std::uint32_t, std::vector<stored_segment>> split_by_owner(const std::vector<stored_segment>& segments,
                                                                    const partitioner& next, std::size_t slots) {
  std::map<std::uint32_t, std::vector<stored_segment>> out;
  for (const auto& s : segments) {
    const auto n = s.end - s.begin;
    if (s.end < s.begin || s.values.size() != n || s.state.size() != n * slots)
      throw bad_request("a segment of keys [" + std::to_string(s.begin) + ", " + std::to_string(s.end) + ") holds " +
                        std::to_string(s.values.size()) + " values and " + std::to_string(s.state.size()) +
                        " state floats (expected " + std::to_string(n) + " and " + std::to_string(n * slots) + ")");
    for_each_run(s.begin, s.end, next,
                 [&](std::uint32_t owner, key_type b, key_type e) { out[owner].push_back(slice(s, b, e, slots)); });
  }
  return out;
}

std::map<std::uint32_t, deferred_update> split_by_owner(const deferred_update& d, const partitioner& next,
                                                        std::uint32_t row_dim) {
  std::map<std::uint32_t, deferred_update> out;
  auto part = [&](std::uint32_t owner) -> deferred_update& {
    auto [it, fresh] = out.try_emplace(owner, d);
    if (fresh) {
      it->second.ranges.clear();
      it->second.values.clear();
      it->second.ids.clear();
    }
    return it->second;
  };
  if (d.table) {
    for (std::size_t i = 0; i < d.ids.size(); ++i) {
      auto& p = part(next.row_owner(*d.table, d.ids[i]));
      p.ids.push_back(d.ids[i]);
      p.values.insert(p.values.end(), d.values.begin() + static_cast<std::ptrdiff_t>(i * row_dim),
                      d.values.begin() + static_cast<std::ptrdiff_t>((i + 1) * row_dim));
    }
    return out;
  }
  std::size_t offset = 0;
  for (const auto& r : d.ranges) {
    for_each_run(r.begin, r.end, next, [&](std::uint32_t owner, key_type b, key_type e) {
      auto& p = part(owner);
      p.ranges.push_back({b, e});
      p.values.insert(p.values.end(), d.values.begin() + static_cast<std::ptrdiff_t>(offset + (b - r.begin)),
                      d.values.begin() + static_cast<std::ptrdiff_t>(offset + (e - r.begin)));
    });
    offset += r.size();
  }
  return out;
}

}  // namespace ps
