// bench_recovery: how long a training job stalls when a server process is killed
// (SIGKILL by the fault injector at clock 20 of 60). Each run is one clocksum job
// (psnode --role=local: coordinator, 2 servers, 2 workers as processes, BSP):
//   --replication=2          the chain closes over the dead copy, nothing lost
//   --replication=1 + checkpoints every 8 clocks: a replacement restored from the last one
// recovery_ms (per worker): from its client learning of the failure (CAF's down message,
// about 1 ms after the SIGKILL, docs/wire-and-caf.md) to the first pull answered after failover.
// The limit measured in the same run: the fault-free time per clock of the same job
// (worker 0's training loop over its clocks).
// One JSON line per run, then one summary line per setting. Extra flags go to every run.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "apps/apps.hpp"
#include "apps/bench_timing.hpp"

namespace {

using ps::bench::median;
using ps::output_of;

// The "recovery_ms" lists of every worker's result line, joined.
std::vector<double> recoveries(const std::vector<nlohmann::json>& lines) {
  std::vector<double> ms;
  for (const auto& j : lines)
    if (j.contains("recovery_ms"))
      for (const auto& v : j["recovery_ms"]) ms.push_back(v.get<double>());
  return ms;
}

// A field of the first line that has it (-1: none has).
double number_in(const std::vector<nlohmann::json>& lines, const std::string& name) {
  for (const auto& j : lines)
    if (j.contains(name)) return j[name].get<double>();
  return -1;
}

constexpr const char* usage =
  "usage: bench_recovery [--repeats=5] [psnode flags...]\n"
  "How long a clocksum job (2 servers, 2 workers, processes, BSP, 60 clocks) stalls when a server is\n"
  "killed at clock 20: with --replication=2, and with a replacement from checkpoints every 8 clocks.\n"
  "It sets --replication, --faults, --checkpoint-*, --app and --clocks itself; other flags go to every\n"
  "run. One JSON line per run, then one summary line per setting.\n";

// The flags: --repeats, and the rest for psnode (in `extra`). An exit status when the
// program ends here (--help, a bad flag).
std::optional<int> parse_args(int argc, char** argv, std::string& extra, int& repeats) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    if (a.rfind("--repeats=", 0) == 0) {
      repeats = std::atoi(a.c_str() + 10);
      if (repeats < 1) {
        std::fprintf(stderr, "error: --repeats must be >= 1\n");
        return 2;
      }
      continue;
    }
    for (auto banned : {"--replication=", "--faults=", "--checkpoint-", "--app=", "--clocks="})
      if (a.rfind(banned, 0) == 0) {
        std::fprintf(stderr, "error: bench_recovery sets %s itself for each run\n", banned);
        return 2;
      }
    extra += " '" + a + "'";
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  std::string extra;
  int repeats = 5;
  if (auto rc = parse_args(argc, argv, extra, repeats)) return *rc;
  auto psnode = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "psnode").string();
  const int clocks = 60;
  auto base = psnode + " --role=local --app=clocksum --servers=2 --workers=2 --clocks=" + std::to_string(clocks) +
              extra + " 2>/dev/null";
  // The limit: the same job without a fault, per clock.
  auto clean = output_of(base);
  if (!clean) return 1;
  double clock_ms = number_in(ps::json_lines_of(*clean), "train_seconds") * 1000.0 / clocks;
  auto dir = std::filesystem::temp_directory_path() / ("bench_recovery_" + std::to_string(getpid()));
  int failures = 0;
  for (int replication : {2, 1}) {
    std::vector<double> all;
    for (int r = 0; r < repeats; ++r) {
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
      auto cmd = base + " --faults='kill server=1 at=20' --replication=" + std::to_string(replication) +
                 (replication == 1 ? " --checkpoint-dir=" + dir.string() + " --checkpoint-every=8" : "");
      auto out = output_of(cmd);
      if (!out) {
        ++failures;
        continue;
      }
      auto lines = ps::json_lines_of(*out);
      auto ms = recoveries(lines);
      all.insert(all.end(), ms.begin(), ms.end());
      ps::bench::print_line({{"bench", "recovery"}, {"replication", replication}, {"run", r}, {"recovery_ms", ms},
                  {"job_seconds", lines.empty() ? -1.0 : lines.back().value("seconds", -1.0)}});
    }
    ps::bench::print_line({{"bench", "recovery"},
                {"replication", replication},
                {"how", replication == 2 ? "chain closes over the dead copy" : "replacement from checkpoint"},
                {"runs", repeats},
                {"recovery_ms_median", median(all)},
                {"recovery_ms_max", all.empty() ? -1.0 : *std::max_element(all.begin(), all.end())},
                {"fault_free_clock_ms", clock_ms}});
  }
  std::filesystem::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
