#include "libps/keys/chunking.hpp"

#include <algorithm>
#include <cstring>
#include <map>

namespace ps {

std::vector<key_range> chunk::ranges() const {
  std::vector<key_range> out;
  out.reserve(pieces.size());
  for (const auto& p : pieces)
    out.push_back(p.keys);
  return out;
}

bool chunk::contiguous() const {
  for (std::size_t i = 1; i < pieces.size(); ++i)
    if (pieces[i].value_offset != pieces[i - 1].value_offset + pieces[i - 1].keys.size())
      return false;
  return true;
}

std::vector<chunk> plan_chunks(const std::vector<piece>& pieces, std::uint64_t chunk_bytes) {
  if (chunk_bytes < range_wire_bytes + sizeof(float))
    throw bad_request("chunk size " + std::to_string(chunk_bytes) + " bytes is too small (minimum " +
                      std::to_string(range_wire_bytes + sizeof(float)) + ")");
  std::map<std::uint32_t, std::vector<piece>> by_shard;
  for (const auto& p : pieces)
    by_shard[p.shard].push_back(p);
  std::vector<chunk> out;
  for (auto& [shard, list] : by_shard) {
    chunk cur{shard, {}, 0};
    std::uint64_t used = 0;
    for (auto p : list) {
      while (!p.keys.empty()) {
        auto header = cur.pieces.empty() ? 0 : range_wire_bytes;
        if (used + header + sizeof(float) > chunk_bytes) {
          out.push_back(std::move(cur));
          cur = chunk{shard, {}, 0};
          used = 0;
          continue;
        }
        auto room = (chunk_bytes - used - header) / sizeof(float);
        auto take = std::min<std::uint64_t>(room, p.keys.size());
        cur.pieces.push_back({{p.keys.begin, p.keys.begin + take}, p.value_offset, shard});
        cur.num_values += take;
        used += header + take * sizeof(float);
        p.keys.begin += take;
        p.value_offset += take;
      }
    }
    if (!cur.pieces.empty())
      out.push_back(std::move(cur));
  }
  return out;
}

void gather(const float* src, const chunk& c, float* dst) {
  for (const auto& p : c.pieces) {
    std::memcpy(dst, src + p.value_offset, p.keys.size() * sizeof(float));
    dst += p.keys.size();
  }
}

void scatter(const float* chunk_values, const chunk& c, float* dst) {
  for (const auto& p : c.pieces) {
    std::memcpy(dst + p.value_offset, chunk_values, p.keys.size() * sizeof(float));
    chunk_values += p.keys.size();
  }
}

}  // namespace ps
