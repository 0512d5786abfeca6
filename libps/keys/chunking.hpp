#pragma once
// Splitting one push/pull into per-shard messages of bounded size, and putting the
// values back together. CAF slows sharply past ~16 MB per message (docs/wire-and-caf.md, "CAF 0.17 facts"), so
// no message carries much more than chunk_bytes (values, plus range headers).
#include <cstdint>
#include <vector>

#include "libps/keys/partitioner.hpp"

namespace ps {

constexpr std::uint64_t default_chunk_bytes = 4u << 20;
// Pushes go in smaller chunks: a shard sums each chunk as it arrives, so the sum of one
// overlaps the transfer of the next, and a chunk of 1 MiB fits the half of a 2 MiB
// shared-memory ring that a shard sums from in place (BENCHMARKS.md, "Pushes in 1 MiB chunks").
constexpr std::uint64_t default_push_chunk_bytes = 1u << 20;

// Bytes a range header takes on the wire (begin and end).
constexpr std::uint64_t range_wire_bytes = 16;

// The part of a request that goes to one shard in one message.
struct chunk {
  std::uint32_t shard = 0;
  std::vector<piece> pieces;  // keys and where their values sit in the caller's buffer
  std::uint64_t num_values = 0;

  std::vector<key_range> ranges() const;
  // True when the values are one contiguous run of the caller's buffer (no gather needed).
  bool contiguous() const;
  std::uint64_t first_offset() const { return pieces.empty() ? 0 : pieces.front().value_offset; }
  // The range headers that count against chunk_bytes beside the values: all but the first.
  std::uint64_t header_bytes() const { return pieces.empty() ? 0 : (pieces.size() - 1) * range_wire_bytes; }
};

// Groups pieces by shard (in shard order, keeping key order) and cuts them into chunks
// whose values plus the headers of their ranges after the first take at most chunk_bytes:
// a run of exactly chunk_bytes of values is one chunk, not one and a sliver (tensors come
// in powers of two, and a 1 MiB push record fits half a 2 MiB ring). A piece larger than
// a chunk is split. Throws bad_request if chunk_bytes cannot hold one range and one value.
std::vector<chunk> plan_chunks(const std::vector<piece>& pieces, std::uint64_t chunk_bytes);


// Copies a chunk's values out of the caller's buffer, back to back.
void gather(const float* src, const chunk& c, float* dst);
// Writes a chunk's values (back to back) into their places in the caller's buffer.
void scatter(const float* chunk_values, const chunk& c, float* dst);

}  // namespace ps
