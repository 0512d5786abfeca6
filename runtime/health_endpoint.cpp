#include "runtime/health_endpoint.hpp"

#include <memory>
#include <string>

#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "libps/keys/keys.hpp"

namespace ps {

namespace {

struct health_state {
  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Registry> alive = std::make_shared<prometheus::Registry>();
  std::shared_ptr<prometheus::Registry> ready = std::make_shared<prometheus::Registry>();
  bool ready_served = false;
};

health_state& state() {
  static health_state s;
  return s;
}

void one_gauge(prometheus::Registry& registry, const char* name, const char* help) {
  prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add({}).Set(1);
}

}  // namespace

void serve_health(std::uint16_t port) {
  if (port == 0) return;
  auto& s = state();
  try {
    s.exposer = std::make_unique<prometheus::Exposer>("0.0.0.0:" + std::to_string(port));
  } catch (const std::exception& e) {
    throw bad_request("--health-port=" + std::to_string(port) + ": cannot listen: " + e.what());
  }
  one_gauge(*s.alive, "actorps_alive", "1 while this process runs its role (/healthz)");
  one_gauge(*s.ready, "actorps_ready", "1 once this process's role is ready (/readyz)");
  s.exposer->RegisterCollectable(s.alive, "/healthz");
}

void health_ready() {
  auto& s = state();
  if (!s.exposer || s.ready_served) return;
  s.exposer->RegisterCollectable(s.ready, "/readyz");
  s.ready_served = true;
}

}  // namespace ps
