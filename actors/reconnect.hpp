#pragma once
// A member whose coordinator went down does not give up at once: the coordinator may be
// started again with --resume at the same address (docs/checkpoints-and-faults.md). A dialer, on a thread of
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
// A dial that hands back `gone` (the coordinator that went down: CAF's middleman keeps a
// connection's handle until its own down message comes) counts as no answer yet. The
// dialer ends with `member`.
void redial_coordinator(caf::local_actor* member, const reconnect_options& opts, const caf::actor_addr& gone);

// Tells a coordinator that answers at the old address who this member is (`me`), then
// rejoined() once it took the member back (the member monitors it; the resumed job's map
// comes once every member is back and a map change under way is done); refused(why) when
// it did not resume this job; a coordinator not reachable yet is dialled again.
template <class Self>
void rejoin_coordinator(Self* self, const coordinator_actor& coordinator, const node_info& me,
                        const reconnect_options& opts, std::function<void()> rejoined,
                        std::function<void(const std::string&)> refused) {
  self->request(coordinator, std::chrono::seconds(5), rejoin_atom::value, me)
    .then(
      [=](registration&) {
        self->monitor(coordinator);
        rejoined();
      },
      [=](caf::error& e) {
        if (code_of(e) != errc::refused) return redial_coordinator(self, opts, coordinator.address());
        refused("the coordinator at " + opts.address + " came back without this job: " + describe(e));
      });
}

// The error a member ends with when its coordinator did not come back: names the
// coordinator, its address and the patience.
std::string coordinator_gone_text(const reconnect_options& opts, const std::string& first_reason);

}  // namespace ps
