// libFuzzer: a checkpoint file (libps/persist/checkpoint) and a shard's section of one must read
// back or be refused with bad_request naming what is wrong.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "libps/persist/checkpoint.hpp"
#include "libps/keys/keys.hpp"

namespace {

std::filesystem::path scratch_dir() {
  return std::filesystem::temp_directory_path() / ("actorps-fuzz-" + std::to_string(::getpid()));
}

// A file in a directory of this run's own, removed when the run ends (libFuzzer exits).
std::string scratch_file() {
  std::error_code ec;
  std::filesystem::create_directories(scratch_dir(), ec);
  if (ec) return "";
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(scratch_dir(), ignored);
  });
  return (scratch_dir() / "checkpoint-1.apsckpt").string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    ps::decode_shard(bytes);
  } catch (const ps::bad_request&) {
  }
  static const std::string path = scratch_file();
  if (path.empty()) return 0;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  try {
    ps::read_checkpoint(path);
  } catch (const ps::bad_request&) {
  }
  return 0;
}
