#pragma once
// The worker apps psnode can run (--app=NAME), shared with the launchers.
#include <optional>
#include <string>

#include "runtime/node.hpp"
#include "runtime/app_registry.hpp"

namespace ps {

// Registers fmnist (sgd, BSP), kvcheck and bench (sum, ASP) and clocksum (sum, BSP) with
// runtime/app_registry.hpp; once per process, later calls do nothing.
void register_builtin_apps();

// Runs a shell command (the benches run whole jobs as processes): its stdout, or nullopt
// after printing the command, its exit status and its output on stderr.
std::optional<std::string> output_of(const std::string& cmd);
// bench's --sizes and --windows, or their defaults when empty.
std::vector<std::int64_t> bench_sizes(const node_config& cfg);
std::vector<std::int64_t> bench_windows(const node_config& cfg);
// The size bench_kv's limits are measured at: the largest of --sizes up to 16 MiB (the
// smallest if none is).
std::int64_t bench_limit_bytes(const node_config& cfg);
// Every shard's figures (its (stats) answer), parsed: a JSON array. Blocks; throws
// bad_request naming a shard that does not answer.
nlohmann::json shard_figures(const kv_client& kv);
// Such figures summed over shards: rows (created, expired) and bytes, pushed rows refused admission, the RAM tiers' hits and misses, disk
// reads once per process (shards may share one), the largest peak memory of a process.
struct shard_totals {
  std::uint64_t rows = 0, table_bytes = 0, ram_bytes = 0, ram_budget = 0, ram_hits = 0, ram_misses = 0;
  std::uint64_t disk_bytes_read = 0, peak_rss = 0;
  std::uint64_t rows_expired = 0, row_pushes_refused = 0;
  double ram_hit_rate() const;  // 1 when nothing was looked up
};
shard_totals total_of(const nlohmann::json& shards);

// Every line of a program's output that is a JSON object, parsed, in order.
std::vector<nlohmann::json> json_lines_of(const std::string& out);

// A worker's measured cell as the one line it reports, {"cell": {...}}, and back. Cell
// has nlohmann's to_json and from_json (NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE). decode_cell
// throws bad_request naming `what` and the line.
template <class Cell>
std::string encode_cell(const Cell& c) {
  return nlohmann::json{{"cell", c}}.dump();
}
template <class Cell>
Cell decode_cell(const std::string& text, const std::string& what) {
  try {
    return nlohmann::json::parse(text).at("cell").get<Cell>();
  } catch (const nlohmann::json::exception& e) {
    throw bad_request("not " + what + " (" + e.what() + "): " + text.substr(0, 80));
  }
}

// bench app: one measured cell, reported by each worker and merged by bench_kv.
struct bench_cell {
  std::string op;  // push | pull
  std::uint64_t bytes = 0;
  std::uint64_t window = 0;
  std::uint32_t worker = 0;
  std::uint64_t ops = 0;
  double seconds = 0;
  std::vector<double> latencies_us;
  std::uint64_t round = 0;  // of --rounds
  // Worker 0's cells carry the limits it measured just before the round's cells of this
  // size (0 in the other workers' cells).
  double tcp_limit_gbps = 0;
  double memcpy_gbps = 0;
  std::string encode() const;
  static bench_cell decode(const std::string& text);  // throws bad_request
};

}  // namespace ps
