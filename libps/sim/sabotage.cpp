#include "libps/sim/sabotage.hpp"

#include "libps/keys/keys.hpp"

namespace ps::sabotage {

std::atomic<bool> dedupe_off{false};
std::atomic<bool> ssp_gate_off{false};

const std::vector<std::string>& names() {
  static const std::vector<std::string> known{"dedupe", "ssp-gate"};
  return known;
}

void turn_on(const std::string& name) {
  if (name == "dedupe")
    dedupe_off = true;
  else if (name == "ssp-gate")
    ssp_gate_off = true;
  else
    throw bad_request("unknown --break \"" + name + "\" (known: dedupe, ssp-gate)");
}

void reset() {
  dedupe_off = false;
  ssp_gate_off = false;
}

}  // namespace ps::sabotage
