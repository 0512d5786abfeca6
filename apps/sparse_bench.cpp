#include "apps/sparse_bench.hpp"
#include "apps/apps.hpp"
#include "apps/disk_probe.hpp"

#include <chrono>
#include <numeric>
#include <deque>
#include <random>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "apps/ctr/ctr_data.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/rows/sparse_table.hpp"

namespace ps {

namespace {

using bench_clock = std::chrono::steady_clock;
double since(bench_clock::time_point t) { return std::chrono::duration<double>(bench_clock::now() - t).count(); }

}  // namespace

row_picker::row_picker(std::uint64_t rows, double exponent) : zipf(rows, exponent), n(rows), step(2654435761u % rows) {
  while (std::gcd(step, n) != 1) ++step;
}

std::vector<std::uint64_t> row_picker::batch(std::mt19937_64& rng, std::size_t size) const {
  std::unordered_set<std::uint64_t> seen;
  std::vector<std::uint64_t> ids;
  while (ids.size() < std::min<std::uint64_t>(size, n)) {
    auto id = static_cast<std::uint64_t>((static_cast<unsigned __int128>(zipf(rng) - 1) * step) % n);
    if (seen.insert(id).second) ids.push_back(id);
  }
  return ids;
}

sparse_table_spec sparse_bench_table(const node_config& cfg) {
  update_rule rule;
  rule.kind = "adagrad";
  rule.lr = 0.05f;
  return {"bench", static_cast<std::uint32_t>(cfg.app_count("bench-dim")), 0.01f, rule, cfg.seed};
}

namespace {

shard_totals ram_counts(worker_context& ctx) { return total_of(shard_figures(ctx.kv)); }

// Requests of `op` (window in flight) for `seconds`; the cell's rows and latencies.
sparse_cell run_cell(worker_context& ctx, const row_picker& pick, std::mt19937_64& rng, const std::string& op,
                     double seconds) {
  const auto batch = ctx.cfg.app_count("batch-rows");
  const auto window = ctx.cfg.app_count("sparse-window");
  const auto dim = ctx.kv.table_dim(0);
  std::vector<float> grads(batch * dim, 1e-3f);
  sparse_cell cell;
  cell.op = op;
  std::deque<std::pair<kv_future, bench_clock::time_point>> inflight;
  auto start = bench_clock::now();
  while (since(start) < seconds || cell.latencies_us.size() < 4) {
    while (inflight.size() < window) {
      auto ids = pick.batch(rng, batch);
      inflight.emplace_back(op == "pull" ? ctx.kv.pull_rows(0, ids) : ctx.kv.push_rows(0, ids, grads),
                            bench_clock::now());
    }
    auto [f, t0] = std::move(inflight.front());
    inflight.pop_front();
    f.get();
    cell.latencies_us.push_back(since(t0) * 1e6);
    cell.rows += batch;
  }
  cell.seconds = since(start);
  for (auto& [f, t0] : inflight) f.get();  // drained, not counted
  return cell;
}

// The same load, one second at a time, until the RAM tiers are full or their hit rate
// stops rising (at most --sparse-warmup seconds): cells measure the steady state, not a
// table coming in from disk. "Stops rising" compares the last 5 seconds with the 5
// before: a tier filling from disk gains a few thousandths a second, less than one
// second's noise, and a second-by-second test stopped with the tier a quarter full.
void warm_up(worker_context& ctx, const row_picker& pick, std::mt19937_64& rng, const std::string& op) {
  constexpr std::size_t span = 5;  // seconds compared
  auto start = bench_clock::now();
  std::deque<shard_totals> seconds{ram_counts(ctx)};  // the counts at each second's end
  auto hit_rate = [](const shard_totals& from, const shard_totals& to) {
    shard_totals slice;
    slice.ram_hits = to.ram_hits - from.ram_hits;
    slice.ram_misses = to.ram_misses - from.ram_misses;
    return slice.ram_hit_rate();
  };
  while (since(start) < ctx.cfg.app_number("sparse-warmup")) {
    run_cell(ctx, pick, rng, op, 1.0);
    seconds.push_back(ram_counts(ctx));
    const auto& now = seconds.back();
    if (now.ram_budget > 0 && now.ram_bytes * 20 >= now.ram_budget * 19) return;  // full
    if (seconds.size() > 2 * span + 1) seconds.pop_front();
    if (seconds.size() == 2 * span + 1 && hit_rate(seconds[span], now) - hit_rate(seconds.front(), seconds[span]) < 0.002)
      return;
  }
}

// The disk under the shard's tier, probed right before and right after each cell (see
// apps/disk_probe.hpp): none without a disk tier, with --disk-probe-seconds=0, or with
// more than one worker (their probes would meet each other and the other's load).
std::optional<disk_probe> cell_probe(const worker_context& ctx) {
  if (ctx.cfg.shard_memory == 0 || ctx.cfg.app_number("disk-probe-seconds") <= 0 || ctx.cfg.workers != 1)
    return std::nullopt;
  return std::optional<disk_probe>(std::in_place, ctx.cfg.shard_dir, sparse_bench_probe_bytes(ctx.cfg));
}

double probe_now(const std::optional<disk_probe>& probe, const worker_context& ctx) {
  return probe ? probe->reads_per_s(ctx.cfg.app_number("disk-probe-seconds"), ctx.cfg.disk_readers) : 0;
}

std::string sparse_bench_app(worker_context& ctx) {
  const auto rows = ctx.cfg.app_count("table-rows");
  if (ctx.id == 0) {
    auto start = bench_clock::now();
    auto made = ctx.kv.fill_rows(0, rows);
    ctx.report(nlohmann::json{{"filled", made}, {"seconds", since(start)}}.dump());
  }
  ctx.barrier();
  const auto probe = cell_probe(ctx);
  std::mt19937_64 rng(ctx.cfg.seed * 7919 + ctx.id);
  for (double z : sparse_bench_zipfs(ctx.cfg)) {
    row_picker pick(rows, z);
    for (std::string op : {"pull", "push"}) {
      warm_up(ctx, pick, rng, op);
      const double disk_before = probe_now(probe, ctx);
      auto before = ram_counts(ctx);
      auto cell = run_cell(ctx, pick, rng, op, ctx.cfg.app_number("sparse-seconds"));
      auto after = ram_counts(ctx);
      cell.disk_reads_before = disk_before;
      cell.disk_reads_after = probe_now(probe, ctx);
      cell.zipf = z;
      cell.ram_hits = after.ram_hits - before.ram_hits;
      cell.ram_misses = after.ram_misses - before.ram_misses;
      cell.disk_bytes_read = after.disk_bytes_read - before.disk_bytes_read;
      ctx.report(cell.encode());
    }
  }
  if (ctx.id == 0) {  // the job's memory and disk figures
    nlohmann::json end{{"job_end", true}, {"worker_peak_rss", process_peak_rss()}, {"shards", nlohmann::json::array()}};
    end["shards"] = shard_figures(ctx.kv);
    ctx.report(end.dump());
  }
  return nlohmann::json{{"worker", ctx.id}}.dump();
}

std::string positive(const node_config& c, const char* name) { return c.app_number(name) > 0 ? "" : "must be > 0"; }

}  // namespace

std::vector<double> sparse_bench_zipfs(const node_config& cfg) {
  std::vector<double> out;
  std::istringstream in(cfg.app_text("zipfs"));
  std::string part;
  while (std::getline(in, part, ',')) {
    std::size_t used = 0;
    double z = 0;
    try {
      z = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != part.size() || !(z > 0)) throw bad_request("--zipfs: '" + part + "' is not an exponent > 0");
    out.push_back(z);
  }
  if (out.empty()) throw bad_request("--zipfs: no exponent given");
  return out;
}

std::uint64_t sparse_bench_probe_bytes(const node_config& cfg) { return cfg.app_count("disk-probe-bytes"); }

std::uint64_t sparse_bench_row_bytes(std::uint32_t dim) {
  return 2 * dim * sizeof(float) + sparse_table::row_overhead;  // value and Adagrad accumulator
}

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(sparse_cell, op, zipf, rows, seconds, ram_hits, ram_misses, disk_bytes_read,
                                   disk_reads_before, disk_reads_after, latencies_us)

std::string sparse_cell::encode() const { return encode_cell(*this); }
sparse_cell sparse_cell::decode(const std::string& text) { return decode_cell<sparse_cell>(text, "a sparse bench cell"); }

app_definition sparse_bench_definition() {
  app_definition app{"sparse_bench", "sparse rows pulled and pushed under a Zipf law (bench_sparse)",
                     sparse_bench_app, "adagrad", "asp", {}, {}};
  app.tables = [](const node_config& cfg) { return std::vector<sparse_table_spec>{sparse_bench_table(cfg)}; };
  app.flags = {
    {"table-rows", app_flag_kind::count, "10000000", "bench_sparse: rows in the table",
     [](const node_config& c) { return c.app_count("table-rows") >= 1000 ? "" : "must be >= 1000"; }},
    {"bench-dim", app_flag_kind::count, "16", "bench_sparse: the table's dimension (set per job by bench_sparse)",
     [](const node_config& c) { return c.app_count("bench-dim") >= 1 && c.app_count("bench-dim") <= 4096 ? "" : "must be in [1, 4096]"; }},
    {"zipfs", app_flag_kind::text, "1.05,1.2", "bench_sparse: Zipf exponents, comma-separated",
     [](const node_config& c) {
       try {
         sparse_bench_zipfs(c);
       } catch (const bad_request& e) {
         return std::string(e.what());
       }
       return std::string{};
     }},
    {"batch-rows", app_flag_kind::count, "1024", "bench_sparse: distinct rows per request",
     [](const node_config& c) { return c.app_count("batch-rows") >= 1 ? "" : "must be >= 1"; }},
    {"sparse-window", app_flag_kind::count, "4", "bench_sparse: requests in flight",
     [](const node_config& c) { return c.app_count("sparse-window") >= 1 ? "" : "must be >= 1"; }},
    {"sparse-seconds", app_flag_kind::number, "3", "bench_sparse: seconds per measured cell",
     [](const node_config& c) { return positive(c, "sparse-seconds"); }},
    {"sparse-warmup", app_flag_kind::number, "60",
     "bench_sparse: at most this many seconds of the same load before each cell (until the RAM tier is full or "
     "its hit rate stops rising)",
     [](const node_config& c) { return positive(c, "sparse-warmup"); }},
    {"disk-probe-seconds", app_flag_kind::number, "2",
     "bench_sparse: seconds of the disk probe run right before and right after each cell with a disk tier (0: none)",
     [](const node_config& c) { return c.app_number("disk-probe-seconds") >= 0 ? "" : "must be >= 0"; }},
    {"disk-probe-bytes", app_flag_kind::count, std::to_string(disk_probe::default_bytes),
     "bench_sparse: bytes of the file the disk probe reads (whole 4 KiB pages)",
     [](const node_config& c) {
       auto b = c.app_count("disk-probe-bytes");
       return b >= 4096 && b % 4096 == 0 ? "" : "must be a multiple of 4096, at least 4096";
     }},
    {"ram-limit", app_flag_kind::count, "1",
     "bench_sparse: 1: measure the all-in-RAM limit (a job with the whole table in RAM); 0: skip it", {}},
    {"dims", app_flag_kind::counts, "[]", "bench_sparse: table dimensions, one job each (default [16,64])", {}},
    {"memory-percents", app_flag_kind::counts, "[]",
     "bench_sparse: shard memory as percents of the table, one job each (default [100,25,5])", {}}};
  return app;
}

}  // namespace ps
