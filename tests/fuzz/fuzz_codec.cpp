// libFuzzer: a compressed tensor chunk from the wire (libps/core/codec) must decode or be
// refused with bad_request, never crash or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "libps/core/codec.hpp"
#include "libps/keys/keys.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    auto info = ps::inspect(bytes);
    if (info.n > (1u << 20)) return 0;  // a real chunk's count; larger would only cost memory
    std::vector<float> out(info.n, 1.0f);
    ps::decode(bytes, out.data(), out.size());
    ps::decode_add(bytes, out.data(), out.size());
  } catch (const ps::bad_request&) {
  }
  return 0;
}
