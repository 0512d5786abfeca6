// bench_recovery: how long a training job stalls when a server process is killed
// (SIGKILL by the fault injector at clock 20 of 60). Each run is one clocksum job
// (psnode --role=local: coordinator, 2 servers, 2 workers as processes, BSP):
//   --replication=2          the chain closes over the dead copy, nothing lost
//   --replication=1 + checkpoints every 8 clocks: a replacement restored from the last one
// recovery_ms (per worker): from its client learning of the failure (CAF's down message,
// about 1 ms after the SIGKILL, CAF-NOTES 4) to the first pull answered after failover.
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

// The numbers in the "recovery_ms":[...] lists of every worker line.
std::vector<double> recoveries(const std::string& out) {
  std::vector<double> ms;
  for (std::size_t at = 0; (at = out.find("\"recovery_ms\":[", at)) != std::string::npos;) {
    at += 15;
    auto end = out.find(']', at);
    std::istringstream in(out.substr(at, end - at));
    std::string v;
    while (std::getline(in, v, ','))
      if (!v.empty()) ms.push_back(std::stod(v));
  }
  return ms;
}

double seconds_of(const std::string& out) {
  auto at = out.rfind("\"seconds\":");
  return at == std::string::npos ? -1 : std::stod(out.substr(at + 10));
}

}  // namespace

int main(int argc, char** argv) {
  std::string extra;
  int repeats = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
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
  auto psnode = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "psnode").string();
  const int clocks = 60;
  auto base = psnode + " --role=local --app=clocksum --servers=2 --workers=2 --clocks=" + std::to_string(clocks) +
              extra + " 2>/dev/null";
  // The limit: the same job without a fault, per clock.
  auto clean = output_of(base);
  if (!clean) return 1;
  auto loop = clean->find("\"train_seconds\":");
  double clock_ms = loop == std::string::npos ? -1 : std::stod(clean->substr(loop + 16)) * 1000.0 / clocks;
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
      auto ms = recoveries(*out);
      all.insert(all.end(), ms.begin(), ms.end());
      std::printf("{\"bench\":\"recovery\",\"replication\":%d,\"run\":%d,\"recovery_ms\":[", replication, r);
      for (std::size_t i = 0; i < ms.size(); ++i) std::printf("%s%.2f", i ? "," : "", ms[i]);
      std::printf("],\"job_seconds\":%.3f}\n", seconds_of(*out));
      std::fflush(stdout);
    }
    std::printf("{\"bench\":\"recovery\",\"replication\":%d,\"how\":\"%s\",\"runs\":%d,\"recovery_ms_median\":%.2f,"
                "\"recovery_ms_max\":%.2f,\"fault_free_clock_ms\":%.2f}\n",
                replication, replication == 2 ? "chain closes over the dead copy" : "replacement from checkpoint",
                repeats, median(all), all.empty() ? -1.0 : *std::max_element(all.begin(), all.end()), clock_ms);
    std::fflush(stdout);
  }
  std::filesystem::remove_all(dir);
  return failures == 0 ? 0 : 1;
}
