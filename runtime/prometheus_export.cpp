#include "runtime/prometheus_export.hpp"

#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include <cstdio>

#include "libps/keys/keys.hpp"

namespace ps {

prometheus_export::prometheus_export(std::uint16_t port) : registry_(std::make_shared<prometheus::Registry>()) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>("0.0.0.0:" + std::to_string(port));
  } catch (const std::exception& e) {
    throw bad_request("--metrics-port=" + std::to_string(port) + ": cannot listen: " + e.what());
  }
  exposer_->RegisterCollectable(registry_);
}

prometheus_export::~prometheus_export() = default;

void prometheus_export::set(const std::string& name, const std::map<std::string, std::string>& labels, double value) {
  auto& family = families_[name];
  if (!family) family = &prometheus::BuildGauge().Name(name).Help("ActorPS: see docs/metrics.md").Register(*registry_);
  family->Add(labels).Set(value);
}

void prometheus_export::update(const nlohmann::ordered_json& line) {
  const std::string type = line.value("type", "");
  const std::string prefix = type == "epoch" ? "actorps_epoch_" : "actorps_";
  for (const auto& [key, value] : line.items())
    if (value.is_number()) set(prefix + key, {}, value.get<double>());
  for (const auto& shard : line.value("shards", nlohmann::json::array())) {
    if (!shard.contains("id")) continue;
    const std::map<std::string, std::string> labels{{"shard", std::to_string(shard["id"].get<std::uint64_t>())}};
    for (const auto& [key, value] : shard.items())
      if (value.is_number() && key != "id" && key != "pid") set("actorps_shard_" + key, labels, value.get<double>());
  }
  for (const auto& worker : line.value("workers", nlohmann::json::array()))
    if (worker.contains("id") && worker.contains("clock") && worker["clock"].is_number())
      set("actorps_worker_clock", {{"worker", std::to_string(worker["id"].get<std::uint64_t>())}},
          worker["clock"].get<double>());
}

job_listener metrics_listener(const node_config& cfg, std::unique_ptr<prometheus_export>& exporter) {
  job_listener listener;
  if (cfg.metrics_port == 0) return listener;
  exporter = std::make_unique<prometheus_export>(cfg.metrics_port);
  listener.metrics_line = [e = exporter.get()](const nlohmann::ordered_json& line) { e->update(line); };
  std::fprintf(stderr, "metrics: Prometheus' text format at http://0.0.0.0:%u/metrics\n", cfg.metrics_port);
  return listener;
}

}  // namespace ps
