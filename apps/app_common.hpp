#pragma once
// What the built-in apps share (apps/*_app.cpp): timing, the data-plane figures of a
// worker's result line, and each app's definition for register_builtin_apps.
#include <chrono>
#include <string>

#include "libps/observe/progress.hpp"
#include "runtime/app_registry.hpp"
#include "runtime/node.hpp"

namespace ps {

using clock_type = std::chrono::steady_clock;

inline double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

// A worker's result line, with "data_plane_sent", "data_plane_received" and
// "data_plane_shm_sent" when it has a data plane: the bytes of its blocks that went beside
// CAF (and of those sent, the ones through shared memory); "data_plane_requests" and
// "data_plane_answers": the requests it sent and the answers it got over data connections
// instead of through CAF (--ps.direct-requests).
std::string with_data_plane(json_line line, worker_context& ctx);

app_definition fmnist_definition();
app_definition kvcheck_definition();
app_definition clocksum_definition();
app_definition bench_definition();

}  // namespace ps
