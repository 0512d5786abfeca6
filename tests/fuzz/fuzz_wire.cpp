// libFuzzer: the wire forms of our message types (actors/messages), decoded from a peer's
// bytes by CAF's binary_deserializer as BASP does, then handed to what receives them: a
// tensor block must decode (an encoded one to its values) or be refused, never crash or allocate what
// the bytes cannot hold. The first byte picks the type; pick 8 is the typed body of a message
// frame on a data connection (actors/message_frames).
#include <cstddef>
#include <cstdint>
#include <vector>

#include <caf/binary_deserializer.hpp>

#include "actors/message_frames.hpp"
#include "actors/messages.hpp"
#include "libps/keys/keys.hpp"

namespace {

template <class T>
bool decode(const std::uint8_t* data, std::size_t size, T& out) {
  caf::binary_deserializer source(nullptr, reinterpret_cast<const char*>(data), size);
  return !source(out);
}

void float_block_at_receiver(const std::uint8_t* data, std::size_t size) {
  ps::float_block block;
  if (!decode(data, size, block)) return;
  if (!block.encoded) return;  // values inline are bounded by the decoder; a ticket names a payload
  try {
    auto values = ps::decoded_values(block);  // what claim_values does with an encoded block
    if (values.size != block.size || (values.size > 0 && values.data() == nullptr)) __builtin_trap();
  } catch (const ps::bad_request&) {
  }
}

void encoded_block_at_receiver(const std::uint8_t* data, std::size_t size) {
  ps::encoded_block block;
  if (!decode(data, size, block)) return;
  try {
    ps::snapshot_of(block);  // a shard's state on the wire: decodes or is refused
  } catch (const ps::bad_request&) {
  }
}

void typed_message_at_receiver(const std::uint8_t* data, std::size_t size) {
  caf::message content;
  try {
    ps::decode_typed_message({reinterpret_cast<const char*>(data), size}, content);
  } catch (const ps::bad_request&) {
  }
}

template <class T>
void decodes(const std::uint8_t* data, std::size_t size) {
  T value;
  decode(data, size, value);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::uint8_t pick = data[0] % 9;
  ++data;
  --size;
  switch (pick) {
    case 0: float_block_at_receiver(data, size); break;
    case 1: encoded_block_at_receiver(data, size); break;
    case 2: decodes<ps::range_list>(data, size); break;
    case 3: decodes<ps::row_ids>(data, size); break;
    case 4: decodes<ps::request_header>(data, size); break;
    case 5: decodes<ps::table_msg>(data, size); break;
    case 6: decodes<ps::job_spec_msg>(data, size); break;
    case 7: decodes<ps::worker_result>(data, size); break;
    default: typed_message_at_receiver(data, size); break;
  }
  return 0;
}
