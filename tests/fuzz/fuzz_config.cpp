// libFuzzer: the settings ActorPS parses itself (CAF reads the INI file and flags; these
// are the texts inside them): --faults plans, --coordinator addresses, --compression specs.
// Each is taken or refused with bad_request naming it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "libps/core/codec.hpp"
#include "libps/net/endpoint.hpp"
#include "libps/sim/faults.hpp"
#include "libps/keys/keys.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto refused_or_taken = [](auto&& parse) {
    try {
      parse();
    } catch (const ps::bad_request&) {
    }
  };
  refused_or_taken([&] { ps::parse_faults(text); });
  refused_or_taken([&] { ps::parse_host_port(text); });
  refused_or_taken([&] { ps::parse_codec(text); });
  refused_or_taken([&] { ps::resolve_endpoint({text, 0, text, text}); });
  return 0;
}
