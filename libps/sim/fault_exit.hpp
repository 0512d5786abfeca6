#pragma once
// The fault injector's kill carried out: the one part of the fault plans that acts on
// the process.
#include <string>

namespace ps {

// Ends this process at once, as SIGKILL from outside would: no destructors, no flushing,
// no goodbye to peers. What a fault plan's kill does.
[[noreturn]] void die_abruptly(const std::string& why);

}  // namespace ps
