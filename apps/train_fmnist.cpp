// train_fmnist: data-parallel training on Fashion-MNIST with the parameters on ActorPS
// server shards. Shows progress on stderr; the last stdout line is one JSON object whose
// "status" says how the job ended (docs/configuration.md, "Exit status").
#include <algorithm>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "runtime/prometheus_export.hpp"
#include "apps/apps.hpp"
#include "libps/observe/log.hpp"
#include "libps/core/consistency.hpp"
#include "runtime/job_contract.hpp"
#include "runtime/signals.hpp"

namespace {

// The job's figures from the workers' results: samples and training time from every
// worker, accuracy and time to target from worker 0 (the one that evaluates).
void add_worker_figures(const ps::job_result& res, ps::json_line& out) {
  double accuracy = -1, train_seconds = 0;
  nlohmann::json to_target = nullptr;
  std::uint64_t samples = 0;
  for (const auto& [w, text] : res.results) {
    auto r = nlohmann::json::parse(text, nullptr, false);
    if (r.is_discarded()) throw ps::bad_request("worker " + std::to_string(w) + " sent a result that is not JSON");
    samples += r.value("samples", std::uint64_t{0});
    train_seconds = std::max(train_seconds, r.value("train_seconds", 0.0));
    if (r.contains("test_accuracy")) accuracy = r["test_accuracy"].get<double>();
    if (r.contains("seconds_to_target")) to_target = r["seconds_to_target"];
  }
  out["test_accuracy"] = accuracy;
  out["final_accuracy"] = accuracy;
  out["seconds_to_target"] = to_target;
  out["train_seconds"] = train_seconds;
  out["samples_per_s"] = train_seconds > 0 ? samples / train_seconds : 0;
}

}  // namespace

int main(int argc, char** argv) {
  ps::register_builtin_apps();
  ps::node_config cfg;
  cfg.help = {"train_fmnist", "trains softmax regression or an MLP on Fashion-MNIST with a parameter server on this machine; the last stdout line is the JSON result",
              {"job", "fmnist", "consistency", "wire", "checkpoints", "faults", "security", "metrics"}, {"fmnist"}};
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  ps::apply_runtime_defaults(cfg);
  try {
    auto settings = ps::settings_for_app(cfg, "fmnist");
    auto& rule = settings.rule;
    caf::actor_system sys{cfg};
    ps::catch_stop_signals();
    if (ps::logs(ps::log_level::info))
      std::fprintf(stderr,
                 "train_fmnist: model=%s cluster=%s servers=%zu workers=%zu epochs=%zu lr=%g rule=%s "
                 "consistency=%s staleness=%s pipeline=%s\n",
                 cfg.model.c_str(), cfg.cluster.c_str(), cfg.servers, cfg.workers, cfg.epochs, cfg.lr,
                 rule.kind.name().c_str(), ps::consistency_name(settings.staleness),
                 ps::staleness_to_string(settings.staleness).c_str(), cfg.pipeline.c_str());
    std::unique_ptr<ps::prometheus_export> exporter;
    auto res = ps::run_job(sys, cfg, ps::find_app("fmnist"), "fmnist", settings, ps::metrics_listener(cfg, exporter));
    auto staleness = settings.staleness;
    ps::json_line out{{"model", cfg.model},
                       {"cluster", cfg.cluster},
                       {"servers", cfg.servers},
                       {"workers", cfg.workers},
                       {"epochs", cfg.epochs},
                       {"lr", cfg.lr},
                       {"consistency", ps::consistency_name(staleness)},
                       {"pipelined", cfg.pipeline == "on"},
                       {"target_accuracy", cfg.target_accuracy},
                       {"seconds", res.seconds},
                       {"shard_keys", ps::final_shard_keys(cfg, settings, res)}};
    if (staleness == ps::infinite_staleness)
      out["staleness"] = "inf";
    else
      out["staleness"] = staleness;
    return ps::print_job_end(out, res, [&](ps::json_line& line) { add_worker_figures(res, line); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
