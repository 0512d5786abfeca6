// bench_kv: push and pull throughput and latency between psnode processes on loopback,
// per value size, window and servers x workers, plus the plain-TCP limit measured in
// the same run, and one thread's memcpy. One JSON object per line (gbps = 1e9 payload
// bytes per second; limit_fraction: of the limit of the row's transport).
#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>

#include "apps/apps.hpp"
#include "apps/bench_timing.hpp"
#include "apps/tcp_limit.hpp"

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  auto idx = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(idx, v.size() - 1)];
}

}  // namespace

int main(int argc, char** argv) {
  ps::register_builtin_apps();
  ps::node_config cfg;
  cfg.help = {"bench_kv", "push/pull throughput and latency between processes per size and window; JSON lines with the loopback TCP limit measured in the same run",
              {"job", "wire", "security"}, {"bench"}};
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  ps::apply_runtime_defaults(cfg);
  try {
    auto sizes = ps::bench_sizes(cfg), windows = ps::bench_windows(cfg);
    // The limit: plain sockets, push-shaped, at the largest size <= 16 MiB, window 8.
    std::int64_t limit_bytes = 0;
    for (auto s : sizes) if (s <= (16 << 20)) limit_bytes = std::max(limit_bytes, s);
    if (limit_bytes == 0) limit_bytes = *std::min_element(sizes.begin(), sizes.end());
    auto limit = ps::measure_tcp_loopback(static_cast<std::uint64_t>(limit_bytes), 8, std::max(1.0, cfg.app_number("cell-seconds") * 2));
    ps::bench::print_line({{"limit", "tcp_loopback"}, {"gbps", limit.gbps}, {"bytes", limit_bytes}, {"window", 8}});
    // What one thread copies: the limit of a transport through memory shared by processes.
    auto copy = ps::measure_memcpy(static_cast<std::uint64_t>(limit_bytes), std::max(0.5, cfg.app_number("cell-seconds")));
    ps::bench::print_line({{"limit", "memcpy"}, {"gbps", copy.gbps}, {"bytes", limit_bytes}});
    caf::actor_system sys{cfg};
    auto settings = ps::settings_for_app(cfg, "bench");
    // servers x workers: 1x1 and 2x2 unless --servers/--workers were given.
    std::vector<std::pair<std::size_t, std::size_t>> shapes = {{1, 1}, {2, 2}};
    for (const auto& a : cfg.args)
      if (a.rfind("--servers=", 0) == 0 || a.rfind("--workers=", 0) == 0) shapes = {{cfg.servers, cfg.workers}};
    int rc = 0;
    for (auto [servers, workers] : shapes) {
      // The job reads servers/workers from the config; children get --sizes/--windows
      // from the same command line, with the same defaults.
      cfg.servers = servers;
      cfg.workers = workers;
      // Cells from all workers, merged per (op, bytes, window).
      std::map<std::tuple<std::string, std::uint64_t, std::uint64_t>, std::vector<ps::bench_cell>> cells;
      auto res = ps::run_job(sys, cfg, ps::find_app("bench"), "bench", settings,
                             {[&](std::uint32_t, const std::string& text) {
                               auto c = ps::bench_cell::decode(text);
                               auto key = std::make_tuple(c.op, c.bytes, c.window);
                               auto& list = cells[key];
                               list.push_back(std::move(c));
                               if (list.size() < workers) return;
                               double gbps = 0;
                               std::vector<double> lat;
                               for (const auto& w : list) {
                                 gbps += static_cast<double>(w.ops * w.bytes) / w.seconds / 1e9;
                                 lat.insert(lat.end(), w.latencies_us.begin(), w.latencies_us.end());
                               }
                               ps::bench::print_line({{"op", std::get<0>(key)}, {"bytes", std::get<1>(key)},
                                                      {"window", std::get<2>(key)}, {"servers", servers},
                                                      {"workers", workers}, {"transport", "tcp"},
                                                      {"gbps", gbps}, {"limit_fraction", gbps / limit.gbps},
                                                      {"p50_us", percentile(lat, 0.5)},
                                                      {"p99_us", percentile(lat, 0.99)}});
                             }, {}});
      if (!res.ok) {
        for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
        rc = 1;
      }
    }
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
