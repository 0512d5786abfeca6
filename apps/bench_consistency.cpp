// bench_consistency: time to accuracy under stragglers for BSP, SSP and ASP, with the
// training pipeline on and off. Each run is one train_fmnist job (coordinator, servers
// and workers as processes); flags not listed below go to every run unchanged.
//   transient stragglers (--straggle=0.25:4): BSP, SSP s=1 and s=3, ASP; pipeline on and off
//   one persistent straggler (--slow-worker=0:3): BSP, SSP s=1 and s=3, ASP; pipeline on
// One JSON line per run, then a summary line comparing SSP with BSP under transient
// stragglers (the goal: SSP reaches the target at least 1.5x sooner).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "apps/apps.hpp"
#include "apps/bench_timing.hpp"

namespace {

struct run_spec {
  std::string consistency;  // bsp | ssp | asp
  int staleness;            // ssp only
  bool pipelined;
  std::string straggler;    // transient | persistent
};

// Runs cmd; its last JSON line (train_fmnist's result), or nullopt (with the reason on stderr).
std::optional<nlohmann::json> result_of(const std::string& cmd) {
  auto got = ps::output_of(cmd);
  if (!got) return std::nullopt;
  auto lines = ps::json_lines_of(*got);
  if (lines.empty()) {
    std::fprintf(stderr, "no JSON result line from: %s\n", cmd.c_str());
    return std::nullopt;
  }
  return lines.back();
}

// The flags every run gets: the setting (the MLP with 4 workers as processes)
// where the caller did not choose, then the caller's own.
std::string common_flags(const std::vector<std::string>& passed) {
  auto has = [&](const std::string& prefix) {
    return std::any_of(passed.begin(), passed.end(), [&](const std::string& a) { return a.rfind(prefix, 0) == 0; });
  };
  std::string common;
  if (!has("--model=")) common += " --model=mlp";
  if (!has("--workers=")) common += " --workers=4";
  if (!has("--cluster=")) common += " --cluster=processes";
  for (const auto& a : passed) common += " '" + a + "'";
  return common;
}

// A run's JSON line: its setting and train_fmnist's figures.
nlohmann::ordered_json run_line(const run_spec& r, const nlohmann::json& res) {
  nlohmann::ordered_json line{{"consistency", r.consistency}};
  line["staleness"] = r.consistency == "ssp" ? nlohmann::ordered_json(r.staleness)
                      : r.consistency == "asp" ? nlohmann::ordered_json("inf") : nlohmann::ordered_json(0);
  line["pipelined"] = r.pipelined;
  line["straggler"] = r.straggler;
  line["seconds_to_target"] = res.value("seconds_to_target", nlohmann::json(nullptr));
  for (auto name : {"samples_per_s", "final_accuracy", "target_accuracy", "train_seconds", "model", "workers", "epochs", "lr"})
    line[name] = res.value(name, nlohmann::json(nullptr));
  return line;
}

constexpr const char* usage =
  "usage: bench_consistency [train_fmnist flags...]\n"
  "Time to accuracy under stragglers: 12 train_fmnist jobs (MLP, 4 workers, processes unless given):\n"
  "BSP, SSP s=1 and s=3, ASP; transient stragglers (--straggle=0.25:4) with the pipeline on and off,\n"
  "one persistent straggler (--slow-worker=0:3) with it on. It sets --consistency, --staleness,\n"
  "--pipeline, --straggle and --slow-worker itself; other flags go to every run. One JSON line per\n"
  "run, then a summary comparing SSP with BSP.\n";

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> passed;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", usage);
      return 0;
    }
    for (auto banned : {"--consistency=", "--staleness=", "--pipeline=", "--straggle=", "--slow-worker="})
      if (a.rfind(banned, 0) == 0) {
        std::fprintf(stderr, "error: bench_consistency sets %s itself for each run\n", banned);
        return 2;
      }
    passed.push_back(a);
  }
  const auto common = common_flags(passed);
  auto exe = (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "train_fmnist").string();

  std::vector<run_spec> runs;
  for (bool pipelined : {true, false})
    for (auto [c, s] : {std::pair{"bsp", 0}, {"ssp", 1}, {"ssp", 3}, {"asp", 0}})
      runs.push_back({c, s, pipelined, "transient"});
  for (auto [c, s] : {std::pair{"bsp", 0}, {"ssp", 1}, {"ssp", 3}, {"asp", 0}})
    runs.push_back({c, s, true, "persistent"});

  double bsp_transient = -1, best_ssp_transient = -1;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    std::string flags = " --consistency=" + r.consistency;
    if (r.consistency == "ssp") flags += " --staleness=" + std::to_string(r.staleness);
    flags += r.pipelined ? " --pipeline=on" : " --pipeline=off";
    flags += r.straggler == "transient" ? " --straggle=0.25:4" : " --slow-worker=0:3";
    std::fprintf(stderr, "bench_consistency: run %zu/%zu:%s%s\n", i + 1, runs.size(), flags.c_str(), common.c_str());
    auto result = result_of(exe + flags + common + " 2>/dev/null");
    if (!result) return 1;
    auto to_target = result->value("seconds_to_target", nlohmann::json(nullptr));
    ps::bench::print_line(run_line(r, *result));
    if (r.straggler == "transient" && to_target.is_number()) {
      double t = to_target.get<double>();
      if (r.consistency == "bsp" && r.pipelined) bsp_transient = t;
      if (r.consistency == "ssp" && r.pipelined && (best_ssp_transient < 0 || t < best_ssp_transient))
        best_ssp_transient = t;
    }
  }
  auto num = [](double v) { return v < 0 ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(v); };
  bool met = bsp_transient > 0 && best_ssp_transient > 0 && bsp_transient >= 1.5 * best_ssp_transient;
  ps::bench::print_line(
    {{"summary", "transient stragglers, pipelined: BSP vs best SSP"},
     {"bsp_seconds_to_target", num(bsp_transient)},
     {"ssp_seconds_to_target", num(best_ssp_transient)},
     {"speedup", num(bsp_transient > 0 && best_ssp_transient > 0 ? bsp_transient / best_ssp_transient : -1)},
     {"goal", 1.5},
     {"met", met}});
  return 0;
}
