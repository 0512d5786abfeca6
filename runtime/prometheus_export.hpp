// --metrics-port=P: the figures of the --metrics lines as Prometheus gauges, served in
// Prometheus' text format at http://HOST:P/metrics (Debian's prometheus-cpp: its exposer
// is a small civetweb server on threads of its own), so an existing Prometheus and
// Grafana can watch a job.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/node.hpp"

namespace prometheus {
class Exposer;
class Registry;
class Gauge;
template <typename T>
class Family;
}  // namespace prometheus

namespace ps {

class prometheus_export {
 public:
  // Listens on every interface; throws bad_request naming the port when it cannot.
  explicit prometheus_export(std::uint16_t port);
  ~prometheus_export();
  // A --metrics line: progress figures become actorps_<name>, an epoch's actorps_epoch_<name>,
  // a shard's actorps_shard_<name>{shard="ID"}, a worker's clock actorps_worker_clock{worker="ID"}.
  void update(const nlohmann::ordered_json& line);

 private:
  void set(const std::string& name, const std::map<std::string, std::string>& labels, double value);
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::map<std::string, prometheus::Family<prometheus::Gauge>*> families_;
};

// A training program's listener: with --metrics-port its metrics lines go to an exporter,
// made here and kept in `exporter` (it serves while that lives). Throws bad_request.
job_listener metrics_listener(const node_config& cfg, std::unique_ptr<prometheus_export>& exporter);

}  // namespace ps
