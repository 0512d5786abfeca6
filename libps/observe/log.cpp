#include "libps/observe/log.hpp"

#include <atomic>
#include <cstdio>

namespace ps {

namespace {
std::atomic<int> current{static_cast<int>(log_level::info)};
}

std::optional<log_level> parse_log_level(const std::string& name) {
  if (name == "error") return log_level::error;
  if (name == "warning") return log_level::warning;
  if (name == "info") return log_level::info;
  if (name == "debug") return log_level::debug;
  return std::nullopt;
}

void set_log_level(log_level level) { current = static_cast<int>(level); }

bool logs(log_level level) { return static_cast<int>(level) <= current.load(std::memory_order_relaxed); }

void log_line(log_level level, const std::string& line) {
  if (logs(level)) std::fprintf(stderr, "%s\n", line.c_str());  // one call: lines of threads do not interleave
}

}  // namespace ps
