#pragma once
// Liveness and readiness over HTTP for a scheduler's probes (Kubernetes' httpGet):
// --health-port=P serves GET /healthz (200 while the process runs its role) and GET /readyz
// (200 once the role is ready: the coordinator listens, a server's shard has started, a
// worker has registered; 404 before). Through Debian's prometheus-cpp exposer (civetweb),
// which the coordinator's /metrics already uses: a path answers once a registry is
// registered on it, so becoming ready is registering /readyz. One per process: a process
// runs one role.
#include <cstdint>

namespace ps {

// Starts serving on every interface; throws bad_request naming the port when it cannot
// listen. Port 0: nothing.
void serve_health(std::uint16_t port);
// The role is ready: /readyz answers 200 from now on (nothing without serve_health).
void health_ready();

}  // namespace ps
