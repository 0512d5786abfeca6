// The transports by name (--ps.transport): adding one is its file plus a line here.
#include <algorithm>

#include "actors/data_plane.hpp"
#include "actors/transport/memory.hpp"

namespace ps {

const std::vector<transport_kind>& transport_kinds() {
  static const std::vector<transport_kind> kinds{
    {"shm", true, "TCP between hosts; shared-memory rings between processes on one host (the default)",
     [](const transport_settings& s) { return data_plane::make(s, true); }},
    {"tcp", true, "TCP connections only", [](const transport_settings& s) { return data_plane::make(s, false); }},
    {"memory", false, "members of one process (the simulator, tests); deterministic", make_memory_transport},
  };
  return kinds;
}

const transport_kind& transport_kind_named(const std::string& name) {
  const auto& kinds = transport_kinds();
  auto it = std::find_if(kinds.begin(), kinds.end(), [&](const transport_kind& k) { return k.name == name; });
  if (it != kinds.end()) return *it;
  std::string known;
  for (const auto& k : kinds) known += (known.empty() ? "" : ", ") + k.name;
  throw bad_request("unknown transport '" + name + "' (known: " + known + ")");
}

}  // namespace ps
