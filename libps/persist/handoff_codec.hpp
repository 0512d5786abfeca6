#pragma once
// A handoff on the wire (libps/core/handoff.hpp): its bytes, checked by a CRC-32 (zlib's).
#include <string>

#include "libps/core/handoff.hpp"

namespace ps {

// A handoff as bytes (cereal binary, then a CRC-32 of them), and back: decode throws
// bad_request naming what is wrong with bytes that are truncated, corrupt or not a handoff.
std::string encode_handoff(const shard_handoff& h);
shard_handoff decode_handoff(const std::string& bytes);

}  // namespace ps
