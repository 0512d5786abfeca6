// bench_sparse: sparse rows pulled and pushed between processes (a worker and a server
// shard, psnode processes on loopback) over a table of --table-rows rows (10^7 by
// default) filled before measuring, for each Zipf exponent (--zipfs), dimension
// (--dims) and shard memory (--memory-percents of the table; the rest on disk), with the
// RAM tier's hit rate. Limits measured in the same run: the same load with everything in
// RAM (no disk tier) and the disk's random 4 KiB reads per second (an O_DIRECT probe in
// --shard-dir). One JSON object per line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <optional>
#include <random>
#include <memory>

#include "apps/apps.hpp"
#include "apps/bench_timing.hpp"
#include "apps/disk_probe.hpp"
#include "apps/sparse_bench.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/rows/row_tier.hpp"

#include <nlohmann/json.hpp>

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size() - 1) + 0.5))];
}

// Rows per second the disk tier's store itself reads (row_disk over RocksDB, no actors),
// from `threads` threads at once, each asking for 32 uniformly random rows at a time of a
// table of `rows` rows filled as bench_sparse's jobs fill theirs: the store's own ceiling
// on this machine, to set beside the device's (disk_reads_per_s); and the rows per second
// an expiry sweep scans (row_disk::expired over the whole table, on one thread).
struct store_limits {
  double reads = 0;
  double swept = 0;
  // Bytes read from the device per row read: a 4 KiB block each, more where the row's
  // index block was not in RocksDB's block cache.
  double device_bytes_per_row = 0;
};
store_limits store_rows_per_s(const ps::node_config& cfg, std::uint64_t rows, double seconds, std::size_t threads) {
  const auto spec = ps::sparse_bench_table(cfg);
  ps::row_disk disk(cfg.shard_dir, "store-probe", {spec.dim * (1 + spec.rule.state_slots())});
  disk.fill(0, rows, spec, [](std::uint64_t) { return true; });
  const auto bytes_before = ps::process_disk_read_bytes();
  auto rate = ps::timed_rate(threads, seconds, [&](std::size_t, std::mt19937_64& rng) -> std::optional<std::uint64_t> {
    std::vector<ps::row_key> keys(32);
    for (auto& k : keys) k = {0, rng() % rows};
    std::vector<std::uint8_t> found;
    std::vector<float> values;
    std::vector<std::uint64_t> pushed;
    try {
      disk.read(keys, found, values, pushed);
    } catch (const ps::bad_request&) {
      return std::nullopt;
    }
    return keys.size();
  });
  if (!rate) throw ps::bad_request("store probe: a read of " + disk.path() + " failed");
  store_limits out;
  out.reads = rate->per_s;
  const auto bytes_read = static_cast<double>(ps::process_disk_read_bytes() - bytes_before);
  out.device_bytes_per_row = bytes_read / static_cast<double>(std::max<std::uint64_t>(rate->done, 1));
  const auto sweep_start = std::chrono::steady_clock::now();
  std::uint64_t listed = 0;  // filled rows carry no push clock: every one is listed
  for (ps::disk_sweep sweep{0, 1, 0, 0};;) {
    auto page = disk.expired(sweep);
    listed += page.ids.size();
    if (!page.more) break;
    sweep.from = page.next;
  }
  out.swept = static_cast<double>(listed) /
              std::chrono::duration<double>(std::chrono::steady_clock::now() - sweep_start).count();
  return out;
}

// The flags a psnode child gets for one job: `name` set to `value`, earlier ones dropped.
void set_child_flag(ps::node_config& cfg, const std::string& name, const std::string& value) {
  auto prefix = "--" + name + "=";
  std::erase_if(cfg.args, [&](const std::string& a) { return a.rfind(prefix, 0) == 0; });
  cfg.args.push_back(prefix + value);
}

// What the job's processes held at most and read from disk.
void print_job_figures(const nlohmann::json& end, std::uint32_t dim, double fraction, std::uint64_t memory,
                       std::uint64_t rows) {
  auto t = ps::total_of(end["shards"]);
  ps::bench::print_line({{"job", "end"}, {"dim", dim}, {"memory_fraction", fraction}, {"table_rows", rows},
                         {"shard_memory", memory}, {"rows_created", t.rows}, {"ram_tier_bytes", t.ram_bytes},
                         {"shard_peak_rss", t.peak_rss}, {"worker_peak_rss", end.value("worker_peak_rss", 0ull)},
                         {"disk_bytes_read", t.disk_bytes_read}});
}

// What the target needs of a cell.
struct cell_figures {
  double rows_per_s = 0;
  double hit_rate = 1;
  double disk_reads_beside = 0;  // the disk probe's mean of right before and right after (0: not probed)
};
using job_cells = std::map<std::pair<double, std::string>, cell_figures>;  // by (zipf, op)

// The disk probe's rate beside a cell: the mean of the runs right before and right after
// it, 0 when either is missing.
double disk_reads_beside(const ps::sparse_cell& c) {
  return c.disk_reads_before > 0 && c.disk_reads_after > 0 ? (c.disk_reads_before + c.disk_reads_after) / 2 : 0;
}

// A shard's memory for the table at `fraction` of its RAM size (0: all in RAM, no tier).
std::uint64_t shard_memory_for(const ps::node_config& cfg, std::uint32_t dim, double fraction) {
  const auto table_bytes = cfg.app_count("table-rows") * ps::sparse_bench_row_bytes(dim);
  return fraction > 0 ? static_cast<std::uint64_t>(fraction * static_cast<double>(table_bytes)) : 0;
}

// Every job's memory, before any job runs (a job refused by its shard would end the run
// after the jobs before it): percents in [1, 100], and at least the 1 MiB a disk tier needs.
void check_memories(const ps::node_config& cfg, const std::vector<std::int64_t>& dims,
                    const std::vector<std::int64_t>& percents) {
  for (auto pct : percents) {
    if (pct < 1 || pct > 100) throw ps::bad_request("--memory-percents: " + std::to_string(pct) + " is not in [1, 100]");
    for (auto dim : dims) {
      const auto memory = shard_memory_for(cfg, static_cast<std::uint32_t>(dim), static_cast<double>(pct) / 100.0);
      if (memory < ps::min_tier_budget)
        throw ps::bad_request("--memory-percents: " + std::to_string(pct) + "% of " +
                              std::to_string(cfg.app_count("table-rows")) + " rows of dimension " + std::to_string(dim) +
                              " is " + std::to_string(memory) +
                              " bytes, under the 1 MiB a shard's disk tier needs (raise --table-rows or the percent)");
    }
  }
}

// One job: the table at one dimension with one shard memory (0: all in RAM, the limit).
job_cells run_cells(caf::actor_system& sys, ps::node_config& cfg, std::uint32_t dim, double fraction) {
  const auto rows = cfg.app_count("table-rows");
  const std::uint64_t memory = shard_memory_for(cfg, dim, fraction);
  cfg.shard_memory = memory;
  cfg.set_app_flag("bench-dim", std::to_string(dim));
  set_child_flag(cfg, "shard-memory", std::to_string(memory));
  set_child_flag(cfg, "bench-dim", std::to_string(dim));
  job_cells out;
  auto on_report = [&](std::uint32_t, const std::string& text) {
    if (text.find("\"filled\"") != std::string::npos) {
      std::fprintf(stderr, "bench_sparse: dim %u, memory %.2f: %s\n", dim, fraction, text.c_str());
      return;
    }
    if (text.find("\"job_end\"") != std::string::npos) {
      print_job_figures(nlohmann::json::parse(text), dim, fraction, memory, rows);
      return;
    }
    auto c = ps::sparse_cell::decode(text);
    double rate = static_cast<double>(c.rows) / c.seconds;
    auto lookups = c.ram_hits + c.ram_misses;
    double hit = lookups ? static_cast<double>(c.ram_hits) / static_cast<double>(lookups) : 1.0;
    out[{c.zipf, c.op}] = {rate, hit, disk_reads_beside(c)};
    if (fraction == 0)
      ps::bench::print_line({{"limit", "ram_rows_per_s"}, {"zipf", c.zipf}, {"dim", dim}, {"op", c.op},
                             {"table_rows", rows}, {"value", rate}, {"p50_us", percentile(c.latencies_us, 0.5)},
                             {"p99_us", percentile(c.latencies_us, 0.99)}});
    else
      ps::bench::print_line({{"zipf", c.zipf}, {"dim", dim}, {"memory_fraction", fraction}, {"table_rows", rows},
                             {"op", c.op}, {"rows_per_s", rate}, {"hit_rate", hit}, {"shard_memory", memory},
                             {"p50_us", percentile(c.latencies_us, 0.5)}, {"p99_us", percentile(c.latencies_us, 0.99)},
                             {"disk_reads_before", c.disk_reads_before}, {"disk_reads_after", c.disk_reads_after},
                             {"shard_disk_bytes_per_s", static_cast<double>(c.disk_bytes_read) / c.seconds}});
  };
  auto res = ps::run_job(sys, cfg, ps::find_app("sparse_bench"), "sparse_bench",
                         ps::settings_for_app(cfg, "sparse_bench"), {on_report, {}});
  if (!res.ok) {
    for (const auto& f : res.failures) std::fprintf(stderr, "error: %s\n", f.c_str());
    throw ps::bad_request("the job at dim " + std::to_string(dim) + ", memory " + std::to_string(fraction) +
                          " failed: " + res.reason);
  }
  return out;
}

// The target: at 25% memory, at least half the lower of the all-in-RAM rate and what the
// disk can serve at the measured miss rate. The disk's rate is the probe's beside the cell
// where it ran, else the run's first (`disk`); `store`: the store's own read rate.
void print_targets(std::int64_t dim, const job_cells& ram, const job_cells& tiered, double disk, double store) {
  for (const auto& [key, cell] : tiered) {
    const double rate = cell.rows_per_s, miss = 1.0 - cell.hit_rate, ram_rate = ram.at(key).rows_per_s;
    auto bound_at = [&](double reads_per_s) { return std::min(ram_rate, miss > 0 ? reads_per_s / miss : ram_rate); };
    const double disk_now = cell.disk_reads_beside > 0 ? cell.disk_reads_beside : disk;
    const double bound = bound_at(disk_now);
    // Beside it, the same bound with the run's first probe, and with the store's own
    // read rate in place of the device's.
    const double first_bound = bound_at(disk), store_bound = bound_at(store);
    ps::bench::print_line({{"target", "half_of_bound_at_25pct"}, {"zipf", key.first}, {"dim", dim},
                           {"op", key.second}, {"rows_per_s", rate}, {"bound_rows_per_s", bound},
                           {"ratio", rate / bound}, {"met", rate >= 0.5 * bound}, {"disk_reads_per_s", disk_now},
                           {"first_probe_ratio", rate / first_bound},
                           {"store_bound_rows_per_s", store_bound}, {"store_ratio", rate / store_bound}});
  }
}

}  // namespace

int main(int argc, char** argv) {
  ps::register_builtin_apps();
  ps::node_config cfg;
  cfg.help = {"bench_sparse", "sparse rows pulled and pushed under a Zipf law, in RAM and over a disk tier; JSON lines with the RAM and disk limits measured in the same run",
              {"job", "tables"}, {"sparse_bench"}};
  cfg.servers = 1;
  cfg.workers = 1;
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  ps::apply_runtime_defaults(cfg);
  try {
    auto dims = cfg.app_counts("dims"), percents = cfg.app_counts("memory-percents");
    if (dims.empty()) dims = {16, 64};
    if (percents.empty()) percents = {100, 25, 5};
    check_memories(cfg, dims, percents);
    const auto threads = cfg.disk_readers;
    double disk = 0;
    {
      ps::disk_probe probe(cfg.shard_dir, ps::sparse_bench_probe_bytes(cfg));
      disk = probe.reads_per_s(3.0, threads);
      ps::bench::print_line({{"limit", "disk_reads_per_s"}, {"value", disk}, {"threads", threads},
                             {"one_at_a_time", probe.reads_per_s(2.0, 1)}, {"dir", cfg.shard_dir}});
    }
    caf::actor_system sys{cfg};
    for (auto dim : dims) {
      job_cells ram;
      if (cfg.app_count("ram-limit") != 0) ram = run_cells(sys, cfg, static_cast<std::uint32_t>(dim), 0);
      double store = 0;
      if (!percents.empty()) {
        cfg.set_app_flag("bench-dim", std::to_string(dim));
        auto limits = store_rows_per_s(cfg, cfg.app_count("table-rows"), 3.0, threads);
        store = limits.reads;
        ps::bench::print_line({{"limit", "store_rows_per_s"}, {"dim", dim}, {"value", store}, {"threads", threads},
                               {"table_rows", cfg.app_count("table-rows")}, {"sweep_rows_per_s", limits.swept},
                               {"device_bytes_per_row", limits.device_bytes_per_row}});
      }
      for (auto pct : percents) {
        auto fraction = static_cast<double>(pct) / 100.0;
        auto tiered = run_cells(sys, cfg, static_cast<std::uint32_t>(dim), fraction);
        if (pct == 25 && !ram.empty()) print_targets(dim, ram, tiered, disk, store);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
