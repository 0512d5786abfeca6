// libFuzzer: a checkpoint file (libps/checkpoint) and a shard's section of one must read
// back or be refused with bad_request naming what is wrong.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "libps/checkpoint.hpp"
#include "libps/keys.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    ps::decode_shard(bytes);
  } catch (const ps::bad_request&) {
  }
  static const std::string path = "/tmp/actorps-fuzz-" + std::to_string(::getpid()) + "/checkpoint-1.apsckpt";
  static const bool made = std::system(("mkdir -p /tmp/actorps-fuzz-" + std::to_string(::getpid())).c_str()) == 0;
  if (!made) return 0;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  try {
    ps::read_checkpoint(path);
  } catch (const ps::bad_request&) {
  }
  return 0;
}
