// psctl: an operator's commands to a running job's coordinator.
//   psctl stop HOST:PORT [REASON]   end the job: every member ends with "status":"stopped"
//                                   and the coordinator exits 0
// Prints one JSON line; exit 0 when the coordinator took the command, 1 when it could not
// be reached or refused, 2 for a bad command line.
#include <cstdio>
#include <string>

#include <caf/io/all.hpp>

#include "runtime/node.hpp"

namespace {

int usage(const char* why) {
  std::fprintf(stderr, "psctl: %s\nusage: psctl stop HOST:PORT [REASON]\n", why);
  return 2;
}

int stop(caf::actor_system& sys, const std::string& address, const std::string& reason) {
  ps::json_line line{{"command", "stop"}, {"coordinator", address}};
  auto [host, port] = ps::parse_host_port(address);
  auto coord = sys.middleman().remote_actor<ps::coordinator_actor>(host, port);
  if (!coord) return ps::print_status(line, false, ps::errc::failed, "cannot reach the coordinator at " + address +
                                                                         ": " + ps::describe(coord.error()));
  std::string err;
  caf::scoped_actor self{sys};
  self->request(*coord, std::chrono::seconds(10), ps::stop_atom::value, static_cast<std::uint8_t>(ps::errc::stopped),
                reason)
    .receive([](caf::ok_atom) {}, [&](caf::error& e) { err = ps::describe(e); });
  if (!err.empty()) return ps::print_status(line, false, ps::errc::failed, "the coordinator at " + address + ": " + err);
  return ps::print_status(line, true, ps::errc::stopped, "");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "--help" || args[0] == "-h") return usage("a command is needed");
  if (args[0] != "stop") return usage(("unknown command \"" + args[0] + "\"").c_str());
  if (args.size() < 2 || args.size() > 3) return usage("stop takes HOST:PORT and an optional reason");
  try {
    ps::parse_host_port(args[1]);
    ps::node_config cfg;  // registers the message types and loads the network layer
    caf::actor_system sys{cfg};
    return stop(sys, args[1], args.size() == 3 ? args[2] : "stopped by the operator (psctl stop)");
  } catch (const ps::bad_request& e) {
    return usage(e.what());
  }
}
