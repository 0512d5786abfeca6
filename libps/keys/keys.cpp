#include "libps/keys/keys.hpp"

namespace ps {

std::string to_string(const key_range& r) {
  std::string s = "[";  // built by appending: GCC 12 warns (-Wrestrict) on "[" + std::string
  s += std::to_string(r.begin);
  s += ", ";
  s += std::to_string(r.end);
  s += ")";
  return s;
}

std::uint64_t count_keys(const std::vector<key_range>& ranges) {
  std::uint64_t n = 0;
  for (std::size_t i = 0; i < ranges.size(); ++i) {
    const auto& r = ranges[i];
    if (r.empty())
      throw bad_request("key range " + to_string(r) + " is empty");
    if (i > 0 && r.begin < ranges[i - 1].end)
      throw bad_request("key ranges must be ascending and disjoint: " + to_string(r) +
                        " follows " + to_string(ranges[i - 1]));
    n += r.size();
  }
  return n;
}

key_set::key_set(std::vector<key_range> ranges)
    : ranges_(std::move(ranges)), num_keys_(count_keys(ranges_)) {}

key_set key_set::from_keys(const std::vector<key_type>& keys) {
  std::vector<key_range> ranges;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto k = keys[i];
    if (i > 0 && k <= keys[i - 1])
      throw bad_request("keys must be sorted ascending and unique: key " + std::to_string(k) +
                        " follows key " + std::to_string(keys[i - 1]));
    if (k == UINT64_MAX)
      throw bad_request("key 2^64-1 is reserved");
    if (!ranges.empty() && ranges.back().end == k)
      ranges.back().end = k + 1;
    else
      ranges.push_back({k, k + 1});
  }
  return key_set(std::move(ranges));
}

}  // namespace ps
