#pragma once
// A member whose coordinator went down does not give up at once: the coordinator may be
// started again with --resume at the same address (issue 15). A dialer, on a thread of
// its own (connecting blocks), dials that address until a coordinator answers or the
// member's patience (--ps.failure-timeout-ms) runs out, and tells the member which.
#include <chrono>
#include <functional>
#include <string>

#include "actors/messages.hpp"

namespace ps {

struct reconnect_options {
  // Dials the coordinator's address (blocking). None: the member does not wait for a
  // restarted coordinator (embedded jobs: the coordinator's process is the member's).
  std::function<caf::expected<coordinator_actor>()> dial;
  std::string address;                        // HOST:PORT, for messages
  std::chrono::milliseconds patience{10000};  // how long a coordinator may stay away
  std::chrono::milliseconds interval{200};    // between dials
  bool dial_blocks = true;  // false: the dialer runs on the scheduler (a simulation's dial never blocks)
  bool enabled() const { return static_cast<bool>(dial); }
};

// Starts the dialer for `member`: it gets (rejoin_atom, caf::actor coordinator) once a
// coordinator answers, or (rejoin_atom, std::string why) when none did within patience.
// The dialer ends with `member`.
void redial_coordinator(caf::local_actor* member, const reconnect_options& opts);

// The error a member ends with when its coordinator did not come back: names the
// coordinator, its address and the patience.
std::string coordinator_gone_text(const reconnect_options& opts, const std::string& first_reason);

}  // namespace ps
