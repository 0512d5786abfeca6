#pragma once
// Splitting one push/pull into per-shard messages of bounded size, and putting the
// values back together. CAF slows sharply past ~16 MB per message (CAF-NOTES §3), so
// no message carries more than chunk_bytes of values plus range headers.
#include <cstdint>
#include <vector>

#include "libps/partitioner.hpp"

namespace ps {

constexpr std::uint64_t default_chunk_bytes = 4u << 20;

// The part of a request that goes to one shard in one message.
struct chunk {
  std::uint32_t shard = 0;
  std::vector<piece> pieces;  // keys and where their values sit in the caller's buffer
  std::uint64_t num_values = 0;

  std::vector<key_range> ranges() const;
  // True when the values are one contiguous run of the caller's buffer (no gather needed).
  bool contiguous() const;
  std::uint64_t first_offset() const { return pieces.empty() ? 0 : pieces.front().value_offset; }
};

// Groups pieces by shard (in shard order, keeping key order) and cuts them into chunks
// whose values plus range headers take at most chunk_bytes. A piece larger than a chunk
// is split. Throws bad_request if chunk_bytes cannot hold one range and one value.
std::vector<chunk> plan_chunks(const std::vector<piece>& pieces, std::uint64_t chunk_bytes);

// Bytes a range header takes on the wire (begin and end).
constexpr std::uint64_t range_wire_bytes = 16;

// Copies a chunk's values out of the caller's buffer, back to back.
void gather(const float* src, const chunk& c, float* dst);
// Writes a chunk's values (back to back) into their places in the caller's buffer.
void scatter(const float* chunk_values, const chunk& c, float* dst);

}  // namespace ps
