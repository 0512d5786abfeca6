#include "libps/net/endpoint.hpp"

#include <cctype>

#include "libps/keys/keys.hpp"
#include "libps/observe/text.hpp"

namespace ps {

namespace {

// "PORT" -> 1..65535 (0 allowed where any free port is meant); throws naming `what`.
std::uint16_t port_of(const std::string& text, const std::string& what, bool zero_ok) {
  auto port = parse_count(text);
  if (!port || *port > 65535 || (*port == 0 && !zero_ok))
    throw bad_request(what + ": port \"" + text + "\" is not in [" + (zero_ok ? "0" : "1") + ", 65535]");
  return static_cast<std::uint16_t>(*port);
}

bool plausible_host(const std::string& h) {
  if (h.empty() || h.size() > 253) return false;
  for (char c : h)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == '_')) return false;
  return true;
}

}  // namespace

std::pair<std::string, std::uint16_t> parse_host_port(const std::string& s) {
  auto colon = s.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    throw bad_request("address \"" + s + "\" is not HOST:PORT");
  return {s.substr(0, colon), port_of(s.substr(colon + 1), "address \"" + s + "\"", false)};
}

endpoint resolve_endpoint(const endpoint_flags& flags) {
  endpoint e;
  if (!flags.host.empty()) {
    if (!plausible_host(flags.host)) throw bad_request("--host=" + flags.host + " is not a host name or address");
    e.bind_host = e.advertise_host = flags.host;
  }
  e.bind_port = flags.port;
  if (!flags.listen.empty()) {
    auto colon = flags.listen.rfind(':');
    if (colon == std::string::npos)
      throw bad_request("--listen=" + flags.listen + " is not ADDR:PORT (\":PORT\" listens on every interface)");
    auto addr = flags.listen.substr(0, colon);
    if (addr.empty() || addr == "*") addr = "0.0.0.0";
    if (!plausible_host(addr)) throw bad_request("--listen=" + flags.listen + ": \"" + addr + "\" is not an address");
    e.bind_host = addr;
    e.bind_port = port_of(flags.listen.substr(colon + 1), "--listen=" + flags.listen, true);
    // A specific address is also what others dial, unless --advertise says otherwise.
    if (!e.every_interface()) e.advertise_host = addr;
  }
  if (!flags.advertise.empty()) {
    auto colon = flags.advertise.rfind(':');
    auto host = flags.advertise.substr(0, colon);
    if (!plausible_host(host) || host == "0.0.0.0")
      throw bad_request("--advertise=" + flags.advertise + ": \"" + host + "\" is not an address others can dial");
    e.advertise_host = host;
    if (colon != std::string::npos) e.advertise_port = port_of(flags.advertise.substr(colon + 1), "--advertise=" + flags.advertise, false);
  }
  return e;
}

}  // namespace ps
