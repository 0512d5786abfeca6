// train_ctr: click prediction on Criteo-format logs (label, 13 integers, 26 hex ids per
// tab-separated line; plain or gzipped) with the embedding tables and the tower on ActorPS
// server shards. gen_ctr writes such files from a known truth. Per-epoch test AUC and log
// loss on stderr; the last stdout line is one JSON object whose "status" says how the job
// ended (docs/configuration.md, "Exit status").
#include <algorithm>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "runtime/prometheus_export.hpp"
#include "apps/apps.hpp"
#include "libps/observe/log.hpp"
#include "libps/core/consistency.hpp"
#include "runtime/job_contract.hpp"
#include "runtime/signals.hpp"

namespace {

// The job's figures from the workers' results: samples, time, bytes and backend from every
// worker, test metrics from worker 0 (the one that evaluates).
void add_worker_figures(const ps::job_result& res, ps::json_line& out) {
  const char* summed[] = {"samples", "embedding_bytes", "embedding_bytes_bound", "embedding_bytes_uncached",
                          "dense_bytes", "worker_cache_hits", "worker_cache_misses"};
  std::map<std::string, std::uint64_t> sums;
  double train_seconds = 0;
  auto backends = nlohmann::json::array();  // in worker order: where each one's tower ran
  for (const auto& [w, text] : res.results) {
    auto r = nlohmann::json::parse(text, nullptr, false);
    if (r.is_discarded()) throw ps::bad_request("worker " + std::to_string(w) + " sent a result that is not JSON");
    backends.push_back(r.value("backend", ""));
    for (const char* field : summed) sums[field] += r.value(field, std::uint64_t{0});
    train_seconds = std::max(train_seconds, r.value("train_seconds", 0.0));
    for (const char* field : {"test_auc", "test_logloss", "per_epoch"})
      if (r.contains(field)) out[field] = r[field];
  }
  out["backends"] = backends;
  out["samples"] = sums["samples"];
  out["train_seconds"] = train_seconds;
  out["samples_per_s"] = train_seconds > 0 ? sums["samples"] / train_seconds : 0;
  for (const char* field : summed)
    if (std::string(field) != "samples" && std::string(field).rfind("worker_cache", 0) != 0) out[field] = sums[field];
  auto lookups = sums["worker_cache_hits"] + sums["worker_cache_misses"];
  out["worker_cache_hit_rate"] = lookups > 0 ? static_cast<double>(sums["worker_cache_hits"]) / lookups : 0.0;
}

// The shards' figures (worker 0 asked every shard at the end): rows (created, live,
// expired), pushed rows refused admission and bytes summed,
// the RAM tier's hit rate over all shards, disk reads summed per process, peak memory
// the largest of any shard process.
void add_shard_figures(const ps::job_result& res, ps::json_line& out) {
  auto shards = nlohmann::json::array();
  for (const auto& [w, text] : res.results) {
    auto r = nlohmann::json::parse(text, nullptr, false);
    if (!r.is_discarded() && r.contains("shards")) shards = r["shards"];
  }
  auto t = ps::total_of(shards);
  out["rows"] = t.rows;
  out["rows_live"] = t.rows - t.rows_expired;
  out["rows_expired"] = t.rows_expired;
  out["row_pushes_refused"] = t.row_pushes_refused;
  out["table_bytes"] = t.table_bytes;
  out["cache_hit_rate"] = t.ram_hit_rate();
  out["disk_bytes_read"] = t.disk_bytes_read;
  out["shard_peak_rss"] = t.peak_rss;
}

}  // namespace

int main(int argc, char** argv) {
  ps::register_builtin_apps();
  ps::node_config cfg;
  cfg.help = {"train_ctr", "click prediction on Criteo-format TSV files (plain or .gz): embedding tables on the shards, an MLP tower; per-epoch AUC, the last stdout line is the JSON result",
              {"job", "consistency", "checkpoints", "tables", "faults", "security", "metrics"}, {"ctr"}};
  cfg.cluster = "processes";  // defaults of train_ctr: 2 servers, 2 workers, BSP, as processes
  cfg.servers = 2;
  cfg.workers = 2;
  cfg.lr = 0.001;  // the tower's Adam
  cfg.batch = 256;
  cfg.epochs = 1;  // click models overfit from the second pass on (measured: docs/click-prediction.md)
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  ps::apply_runtime_defaults(cfg);
  try {
    auto settings = ps::settings_for_app(cfg, "ctr");
    caf::actor_system sys{cfg};
    ps::catch_stop_signals();
    if (ps::logs(ps::log_level::info))
      std::fprintf(stderr, "train_ctr: train=%s test=%s cluster=%s servers=%zu workers=%zu epochs=%zu batch=%zu "
                         "consistency=%s staleness=%s\n",
                 cfg.app_text("train").c_str(), cfg.app_text("test").c_str(), cfg.cluster.c_str(), cfg.servers,
                 cfg.workers, cfg.epochs, cfg.batch, ps::consistency_name(settings.staleness),
                 ps::staleness_to_string(settings.staleness).c_str());
    std::unique_ptr<ps::prometheus_export> exporter;
    auto res = ps::run_job(sys, cfg, ps::find_app("ctr"), "ctr", settings, ps::metrics_listener(cfg, exporter));
    ps::json_line out{{"app", "ctr"},
                       {"cluster", cfg.cluster},
                       {"servers", cfg.servers},
                       {"workers", cfg.workers},
                       {"epochs", cfg.epochs},
                       {"batch", cfg.batch},
                       {"consistency", ps::consistency_name(settings.staleness)},
                       {"seconds", res.seconds}};
    return ps::print_job_end(out, res, [&](ps::json_line& line) {
      add_worker_figures(res, line);
      add_shard_figures(res, line);
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
