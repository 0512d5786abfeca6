#pragma once
// Deliberate bugs for the simulator's self-test (`sim --break=NAME`): each switch turns one
// safety mechanism off, in every binary, so that the simulator can show it finds the
// failures that mechanism prevents (a simulator that never fails proves nothing). Off
// unless the simulator turns one on; nothing else sets them.
//   dedupe    the shards' duplicate filter takes every push as new (resends count twice)
//   ssp-gate  the staleness gate lets every read through (pulls see too little)
#include <atomic>
#include <string>
#include <vector>

namespace ps::sabotage {

extern std::atomic<bool> dedupe_off;
extern std::atomic<bool> ssp_gate_off;

// The names --break takes, in that order.
const std::vector<std::string>& names();
// Turns one switch on; throws bad_request naming an unknown one and the known ones.
void turn_on(const std::string& name);
// Every switch off again.
void reset();

}  // namespace ps::sabotage
