#include "actors/reconnect.hpp"

namespace ps {

namespace {

// Each (rejoin_atom) is one dial; between dials the dialer waits by a delayed message.
caf::behavior dialer(caf::event_based_actor* self, caf::actor member, reconnect_options opts,
                     caf::actor_clock::time_point deadline, caf::actor_addr gone) {
  self->send(self, rejoin_atom::value);
  return {
    [=](rejoin_atom) {
      auto coordinator = opts.dial();
      if (coordinator && coordinator->address() == gone)
        coordinator = make_ps_error("the middleman still hands out the coordinator that went down");
      if (coordinator) {
        self->send(member, rejoin_atom::value, caf::actor_cast<caf::actor>(*coordinator));
        return self->quit();
      }
      if (self->clock().now() >= deadline) {  // the actor system's clock: simulated time in `sim`
        self->send(member, rejoin_atom::value, "last attempt: " + describe(coordinator.error()));
        return self->quit();
      }
      self->delayed_send(self, opts.interval, rejoin_atom::value);
    },
  };
}

}  // namespace

void redial_coordinator(caf::local_actor* member, const reconnect_options& opts, const caf::actor_addr& gone) {
  auto deadline = member->clock().now() + opts.patience;
  auto& sys = member->home_system();
  auto me = caf::actor_cast<caf::actor>(member);
  auto d = opts.dial_blocks ? sys.spawn<caf::detached>(dialer, me, opts, deadline, gone)
                            : sys.spawn(dialer, me, opts, deadline, gone);
  member->attach_functor([d] { caf::anon_send_exit(d, caf::exit_reason::user_shutdown); });
}

std::string coordinator_gone_text(const reconnect_options& opts, const std::string& first_reason) {
  return "the coordinator at " + opts.address + " went down (" + first_reason + ") and did not come back within " +
         std::to_string(opts.patience.count()) + " ms";
}

}  // namespace ps
