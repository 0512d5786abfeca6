#pragma once
// A trace file (--trace) read back: the one part of the trace that does I/O.
#include <string>
#include <vector>

#include "libps/core/trace.hpp"

namespace ps {

// Reads a whole trace file; throws bad_request naming the file and line.
std::vector<trace_event> read_trace(const std::string& path);

}  // namespace ps
