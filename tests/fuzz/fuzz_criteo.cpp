// libFuzzer: a line of Criteo's TSV format (apps/ctr/criteo) parses or is refused with
// bad_request naming the line.
#include <cstddef>
#include <cstdint>
#include <string>

#include "apps/ctr/criteo.hpp"
#include "libps/keys/keys.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    ps::parse_criteo_line(std::string(reinterpret_cast<const char*>(data), size), "fuzz:1");
  } catch (const ps::bad_request&) {
  }
  return 0;
}
