// The fault injector's kill (libps/sim/fault_exit.hpp).
#include "libps/sim/fault_exit.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

namespace ps {

void die_abruptly(const std::string& why) {
  // One line so the test logs say why the process vanished; then SIGKILL to ourselves.
  auto line = "fault injector: " + why + ": killing process " + std::to_string(::getpid()) + "\n";
  [[maybe_unused]] auto n = ::write(2, line.data(), line.size());
  ::kill(::getpid(), SIGKILL);
  std::_Exit(137);  // not reached
}

}  // namespace ps
