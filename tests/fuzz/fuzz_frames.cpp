// libFuzzer: what a stranger's bytes meet first. A data-plane frame header (libps/net/bulk),
// the checks on CAF's stream (libps/net/basp_guard) from both sides, and the answer to a
// shared-secret challenge (libps/net/secret): refused with a reason or passed, never a crash.
#include <cstddef>
#include <cstdint>
#include <span>

#include "libps/net/basp_guard.hpp"
#include "libps/net/bulk.hpp"
#include "libps/keys/keys.hpp"
#include "libps/net/secret.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size >= ps::bulk_header_bytes) {
    try {
      ps::decode_bulk_header(std::span<const std::byte, ps::bulk_header_bytes>(
          reinterpret_cast<const std::byte*>(data), ps::bulk_header_bytes));
    } catch (const ps::bad_request&) {
    }
  }
  for (bool accepted : {true, false}) {
    ps::basp_frame_guard guard(accepted, 1u << 20);
    // In pieces whose sizes come from the input, as reads would deliver them.
    for (std::size_t at = 0; at < size;) {
      std::size_t piece = 1 + data[at] % 61;
      piece = piece < size - at ? piece : size - at;
      if (guard.feed(data + at, piece)) break;
      at += piece;
    }
  }
  static const ps::shared_secret secret{"0123456789abcdef-fuzz", "fuzz"};
  ps::secret_challenge challenge(secret);
  for (std::size_t at = 0; at < size && challenge.missing() > 0; ++at)
    if (challenge.feed(data + at, 1) != ps::secret_challenge::state::waiting) break;
  return 0;
}
