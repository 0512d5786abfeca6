// bench_kv: push and pull throughput and latency between psnode processes on loopback,
// per value size, window and servers x workers, plus the plain-TCP limit measured in
// the same run, one thread's memcpy, and for small sizes what bare sockets make of each
// window's requests (tcp_requests). One JSON object per line (gbps = 1e9 payload
// bytes per second; limit_fraction: of the limit of the row's transport, measured just
// before the row's cells). With --rounds=N every cell is measured N times and its line
// carries the medians.
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

struct shape {
  std::size_t servers, workers;
  std::string transport;  // tcp | shm
  std::string ring_arg;   // the job's --ps.shm-ring-bytes=N (0 for tcp)
};

const std::string ring_flag = "--ps.shm-ring-bytes=";
// Sizes up to this get the bare-socket request limit (a line per window).
constexpr std::int64_t small_request_bytes = 64 << 10;

// The JSON line of one cell, merged over the workers' measurements of it in each round:
// gbps is the median over rounds of the workers' sum, limit_fraction the median of each
// round's gbps over the limit worker 0 measured just before that round, the latencies are
// pooled.
ps::json_line cell_line(const std::map<std::uint64_t, std::vector<ps::bench_cell>>& by_round, const shape& s,
                        const std::string& transport) {
  std::vector<double> lat, per_round, fractions, tcp_limits, copy_limits;
  for (const auto& [round, list] : by_round) {
    double gbps = 0;
    for (const auto& w : list) {
      gbps += static_cast<double>(w.ops * w.bytes) / w.seconds / 1e9;
      lat.insert(lat.end(), w.latencies_us.begin(), w.latencies_us.end());
    }
    // Worker 0 measured them (a round is merged once every worker reported it).
    auto first = std::find_if(list.begin(), list.end(), [](const auto& w) { return w.worker == 0; });
    tcp_limits.push_back(first != list.end() ? first->tcp_limit_gbps : 0);
    copy_limits.push_back(first != list.end() ? first->memcpy_gbps : 0);
    // The row's transport: a shm job whose payloads all went over TCP is measured as TCP.
    const double limit = transport == "shm" ? copy_limits.back() : tcp_limits.back();
    per_round.push_back(gbps);
    if (limit > 0) fractions.push_back(gbps / limit);
  }
  const auto& c = by_round.begin()->second.front();
  return {{"op", c.op}, {"bytes", c.bytes}, {"window", c.window}, {"servers", s.servers}, {"workers", s.workers},
          {"transport", transport}, {"gbps", ps::bench::median(per_round)},
          {"limit_fraction", ps::bench::median(fractions)}, {"p50_us", percentile(lat, 0.5)},
          {"p99_us", percentile(lat, 0.99)}, {"rounds", per_round.size()}, {"gbps_by_round", per_round},
          {"tcp_limit_by_round", tcp_limits}, {"memcpy_by_round", copy_limits}};
}

// One job of this shape over this transport (children get --ps.shm-ring-bytes accordingly and
// --sizes/--windows from the same command line). Its rows are printed once it ends,
// labelled by what the workers' planes did: a shm job whose payloads all went over TCP
// (no ring could be shared) is said to be tcp, with a warning.
int run_shape(caf::actor_system& sys, ps::node_config& cfg, const ps::job_settings& settings, const shape& s) {
  cfg.servers = s.servers;
  cfg.workers = s.workers;
  std::erase_if(cfg.args, [](const std::string& a) { return a.rfind(ring_flag, 0) == 0; });
  cfg.args.push_back(s.ring_arg);
  using cell_key = std::tuple<std::string, std::uint64_t, std::uint64_t>;
  std::map<cell_key, std::map<std::uint64_t, std::vector<ps::bench_cell>>> cells;  // by round
  std::vector<cell_key> order;  // as measured
  auto res = ps::run_job(sys, cfg, ps::find_app("bench"), "bench", settings,
                         {[&](std::uint32_t, const std::string& text) {
                            auto c = ps::bench_cell::decode(text);
                            auto key = std::make_tuple(c.op, c.bytes, c.window);
                            if (!cells.count(key)) order.push_back(key);
                            cells[key][c.round].push_back(std::move(c));
                          }, {}});
  std::uint64_t shm_sent = 0, writes = 0, writer_thread_writes = 0, polled_reads = 0;
  for (const auto& [id, result] : res.results) {
    auto r = nlohmann::json::parse(result, nullptr, false);
    if (!r.is_object()) continue;  // a worker that failed says so in res.failures
    shm_sent += r.value("data_plane_shm_sent", std::uint64_t{0});
    writes += r.value("data_plane_socket_writes", std::uint64_t{0});
    writer_thread_writes += r.value("data_plane_writer_thread_writes", std::uint64_t{0});
    polled_reads += r.value("data_plane_polled_reads", std::uint64_t{0});
  }
  // On stderr (stdout is the rows): how often a worker's sending thread could not write a
  // frame itself (a ring without room, a full socket) and woke its connection's writer,
  // and how many frames its readers found by polling (--ps.busy-poll-us).
  std::fprintf(stderr, "bench_kv: %zux%zu %s: the workers' planes made %llu socket writes of plain frames and left %llu "
                       "writes to their writer threads; their readers found %llu frames by polling\n",
               s.servers, s.workers, s.transport.c_str(), static_cast<unsigned long long>(writes),
               static_cast<unsigned long long>(writer_thread_writes), static_cast<unsigned long long>(polled_reads));
  auto transport = s.transport == "shm" && shm_sent == 0 ? "tcp" : s.transport;
  if (transport != s.transport)
    std::fprintf(stderr, "bench_kv: no payload went through shared memory (no ring could be shared); rows say tcp\n");
  for (const auto& key : order) {
    auto& by_round = cells[key];
    std::erase_if(by_round, [&](const auto& r) { return r.second.size() != s.workers; });  // a worker failed
    if (!by_round.empty()) ps::bench::print_line(cell_line(by_round, s, transport));
  }
  if (res.ok) return 0;
  for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
  return 1;
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
    const auto limit_bytes = ps::bench_limit_bytes(cfg);
    // Under the congestion control the job's data connections use, named in the line. The
    // rows carry the limits measured beside their own cells too (cell_line).
    const double tcp_gbps = ps::measure_tcp_loopback(static_cast<std::uint64_t>(limit_bytes), 8,
                                                     std::max(1.0, cfg.app_number("cell-seconds") * 2),
                                                     cfg.tcp_congestion).gbps;
    ps::bench::print_line({{"limit", "tcp_loopback"}, {"gbps", tcp_gbps}, {"bytes", limit_bytes}, {"window", 8},
                           {"tcp_congestion", cfg.tcp_congestion}});
    // What one thread copies: the limit of a transport through memory shared by processes.
    const double copy_gbps = ps::measure_memcpy(static_cast<std::uint64_t>(limit_bytes),
                                                std::max(0.5, cfg.app_number("cell-seconds"))).gbps;
    ps::bench::print_line({{"limit", "memcpy"}, {"gbps", copy_gbps}, {"bytes", limit_bytes}});
    // Small requests: what bare sockets make of each window (point 2 of the transfer
    // targets, docs/wire-and-caf.md, asks window 8 for 4x the requests of window 1 at 1.5x
    // the round trip).
    const auto smallest = *std::min_element(sizes.begin(), sizes.end());
    if (smallest <= small_request_bytes)
      for (auto window : windows) {
        auto bare = ps::measure_tcp_requests(static_cast<std::uint64_t>(smallest), static_cast<int>(window),
                                             std::max(0.5, cfg.app_number("cell-seconds")), cfg.tcp_congestion);
        ps::bench::print_line({{"limit", "tcp_requests"}, {"bytes", smallest}, {"window", window},
                               {"per_s", bare.per_s}, {"p50_us", bare.p50_us}, {"tcp_congestion", cfg.tcp_congestion}});
      }
    caf::actor_system sys{cfg};
    auto settings = ps::settings_for_app(cfg, "bench");
    // servers x workers: 1x1 and 2x2 unless --servers/--workers were given.
    std::vector<std::pair<std::size_t, std::size_t>> shapes = {{1, 1}, {2, 2}};
    for (const auto& a : cfg.args)
      if (a.rfind("--servers=", 0) == 0 || a.rfind("--workers=", 0) == 0) shapes = {{cfg.servers, cfg.workers}};
    auto asked = cfg.app_text("transport");
    std::vector<std::string> transports;
    for (std::string t : {"tcp", "shm"})
      if (asked == "both" || asked == t) transports.push_back(t);
    // Rings of the size asked (--ps.shm-ring-bytes, 8 MiB by default) for the shm jobs.
    auto ring_arg = ring_flag + std::to_string(cfg.shm_ring_bytes == 0 ? ps::default_shm_ring_bytes : cfg.shm_ring_bytes);
    int rc = 0;
    for (auto [servers, workers] : shapes)
      for (const auto& transport : transports)
        rc |= run_shape(sys, cfg, settings,
                        {servers, workers, transport, transport == "shm" ? ring_arg : ring_flag + "0"});
    return rc;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
