// Where a process listens and what it tells others to dial: --listen=ADDR:PORT and
// --advertise=HOST[:PORT], and the older --host (both at once) and --port (the port of
// --listen). Plain decisions; the route probe that fills a missing advertised host is the
// caller's (runtime: the local address of the way to the coordinator).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

namespace ps {

struct endpoint_flags {
  std::string host;        // --host ("": not given)
  std::uint16_t port = 0;  // --port (0: any free port)
  std::string listen;      // --listen=ADDR:PORT ("": not given; ":PORT" or "*:PORT": every interface)
  std::string advertise;   // --advertise=HOST[:PORT] ("": not given)
};

struct endpoint {
  std::string bind_host = "0.0.0.0";  // every interface unless told
  std::uint16_t bind_port = 0;        // 0: any free port
  std::string advertise_host;         // "": not known from the flags (ask the route to the coordinator)
  std::uint16_t advertise_port = 0;   // 0: the port actually bound
  bool every_interface() const { return bind_host == "0.0.0.0"; }
};

// Throws bad_request naming the flag when a value is not an address. Where both forms are
// given, --listen and --advertise win over --host and --port.
endpoint resolve_endpoint(const endpoint_flags& flags);

// "host:port" -> pair; throws bad_request (port 1..65535).
std::pair<std::string, std::uint16_t> parse_host_port(const std::string& s);

}  // namespace ps
