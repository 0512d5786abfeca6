// The built-in apps' registration, and what apps and benchmarks share: a worker's result
// line with its data-plane figures, shard figures, JSON lines, a command's output.
#include "apps/apps.hpp"
#include "apps/app_common.hpp"
#include "apps/ctr_app.hpp"
#include "actors/transport.hpp"
#include "apps/rowcheck.hpp"
#include "apps/elastic_load.hpp"
#include "apps/sparse_bench.hpp"
#include "apps/tcp_limit.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>
#include <random>
#include <sstream>

#include "actors/gpu_aggregator.hpp"
#include "libps/observe/log.hpp"
#include "libps/observe/progress.hpp"
#include "actors/training.hpp"
#include "apps/fmnist_data.hpp"
#include "runtime/job_contract.hpp"

namespace ps {

// A worker's result line, with "data_plane_sent", "data_plane_received" and
// "data_plane_shm_sent" when it has a data plane: the bytes of its blocks that went beside
// CAF (and of those sent, the ones through shared memory); "data_plane_requests" and
// "data_plane_answers": the requests it sent and the answers it got over data connections
// instead of through CAF (--ps.direct-requests).
std::string with_data_plane(json_line line, worker_context& ctx) {
  if (const auto& plane = ctx.kv.options().plane) {
    auto c = plane->counters();
    line["data_plane_sent"] = c.bytes_sent;
    line["data_plane_received"] = c.bytes_received;
    line["data_plane_shm_sent"] = c.shm_bytes_sent;
    line["data_plane_requests"] = c.messages_sent;
    line["data_plane_answers"] = c.messages_received;
    // Socket writes of plain frames, and the writes left to a connection's writer thread
    // (a wake-up each): a payload that did not fit its ring's room, a socket that was full.
    line["data_plane_socket_writes"] = c.socket_writes;
    line["data_plane_writer_thread_writes"] = c.writer_thread_writes;
    // Actors its reader threads ran themselves rather than waking a scheduler thread.
    line["data_plane_reader_runs"] = c.reader_runs;
    line["data_plane_polled_reads"] = c.polled_reads;
  }
  return line.dump();
}

nlohmann::json shard_figures(const kv_client& kv) {
  auto all = nlohmann::json::array();
  for (const auto& text : kv.shard_stats()) all.push_back(nlohmann::json::parse(text));
  return all;
}

double shard_totals::ram_hit_rate() const {
  auto lookups = ram_hits + ram_misses;
  return lookups ? static_cast<double>(ram_hits) / static_cast<double>(lookups) : 1.0;
}

shard_totals total_of(const nlohmann::json& shards) {
  shard_totals t;
  std::map<std::uint64_t, std::uint64_t> read_by_pid;
  auto count = [](const nlohmann::json& s, const char* field) { return s.value(field, std::uint64_t{0}); };
  for (const auto& s : shards) {
    t.rows += count(s, "rows");
    t.rows_expired += count(s, "rows_expired");
    t.row_pushes_refused += count(s, "row_pushes_refused");
    t.table_bytes += count(s, "table_bytes");
    t.ram_bytes += count(s, "ram_bytes");
    t.ram_budget += count(s, "ram_budget");
    t.ram_hits += count(s, "ram_hits");
    t.ram_misses += count(s, "ram_misses");
    t.peak_rss = std::max(t.peak_rss, count(s, "peak_rss"));
    read_by_pid[count(s, "pid")] = count(s, "disk_bytes_read");
  }
  for (const auto& [pid, bytes] : read_by_pid) t.disk_bytes_read += bytes;
  return t;
}

std::vector<nlohmann::json> json_lines_of(const std::string& out) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded()) lines.push_back(std::move(j));
  }
  return lines;
}

std::optional<std::string> output_of(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    std::fprintf(stderr, "cannot run %s: %s\n", cmd.c_str(), std::strerror(errno));
    return std::nullopt;
  }
  std::string out;
  char buf[4096];
  while (auto n = fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  int status = pclose(p);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::fprintf(stderr, "failed (status %d): %s\n%s\n", status, cmd.c_str(), out.c_str());
    return std::nullopt;
  }
  return out;
}

void register_builtin_apps() {
  static std::once_flag once;
  std::call_once(once, [] {
    register_app(fmnist_definition());
    register_app(kvcheck_definition());
    register_app(clocksum_definition());
    register_app(bench_definition());
    register_app(rowcheck_definition());
    register_app(elastic_load_definition());
    register_app(sparse_bench_definition());
    register_app(ctr_definition());
  });
}

}  // namespace ps
