// A trace file read back line by line (libps/persist/trace_file.hpp).
#include "libps/persist/trace_file.hpp"

#include <fstream>

#include "libps/keys/keys.hpp"

namespace ps {

std::vector<trace_event> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw bad_request("cannot open trace file " + path);
  std::vector<trace_event> out;
  std::string line;
  for (std::size_t n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      out.push_back(parse_trace_line(line));
    } catch (const bad_request& e) {
      throw bad_request(path + ":" + std::to_string(n) + ": " + e.what());
    }
  }
  return out;
}

}  // namespace ps
