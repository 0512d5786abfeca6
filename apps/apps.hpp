#pragma once
// The worker apps psnode can run (--app=NAME), shared with the launchers.
#include <optional>
#include <string>

#include "actors/node.hpp"

namespace ps {

// The app of that name; throws bad_request naming the known apps if there is none.
app_fn find_app(const std::string& name);
// The update rule and consistency model an app is written for (used when --ps.rule,
// --consistency and --staleness are not given): fmnist trains with sgd under BSP; the
// key-value apps sum and never tick clocks (ASP).
job_settings settings_for_app(const node_config& cfg, const std::string& name);

// Runs a shell command (the benches run whole jobs as processes): its stdout, or nullopt
// after printing the command, its exit status and its output on stderr.
std::optional<std::string> output_of(const std::string& cmd);

// bench app: one measured cell, reported by each worker and merged by bench_kv.
struct bench_cell {
  std::string op;  // push | pull
  std::uint64_t bytes = 0;
  std::uint64_t window = 0;
  std::uint32_t worker = 0;
  std::uint64_t ops = 0;
  double seconds = 0;
  std::vector<double> latencies_us;
  std::string encode() const;
  static bench_cell decode(const std::string& text);  // throws bad_request
};

}  // namespace ps
