// How much a process says on stderr (--log-level): errors always; warnings (a peer refused,
// a connection closed by its checks); info (the job's news, per-epoch summaries, the
// default); debug (every connection made or accepted). stdout carries only JSON results and
// is not affected. CAF's own logger is compiled out of Debian's CAF, so this is the one.
#pragma once

#include <optional>
#include <string>

namespace ps {

enum class log_level { error = 0, warning = 1, info = 2, debug = 3 };

// "error" | "warning" | "info" | "debug"; nullopt for anything else.
std::optional<log_level> parse_log_level(const std::string& name);
void set_log_level(log_level level);
bool logs(log_level level);  // whether a line of this level is printed
// Prints one line (a newline is added) when `level` is on.
void log_line(log_level level, const std::string& line);

}  // namespace ps
