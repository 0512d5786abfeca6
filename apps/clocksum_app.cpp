// The clocksum app: exact integer sums per clock, the fault tests' app (holds, rows).
#include "apps/apps.hpp"
#include "apps/app_common.hpp"
#include "apps/ctr_app.hpp"
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

namespace {

// ---- clocksum: exact integer sums over clocks, the fault tests' app ------------------

constexpr key_type clocksum_keys = key_type{1} << 16;
constexpr std::uint32_t clocksum_table = 0;  // with --clock-rows: "clockrows"
constexpr std::uint32_t clocksum_row_dim = 4;

std::vector<sparse_table_spec> clocksum_tables(const node_config& cfg) {
  if (cfg.app_count("clock-rows") == 0) return {};
  return {{"clockrows", clocksum_row_dim, 0.0f, update_rule{}, cfg.seed}};
}

// Per shard (by `owner_of` each index), the one value all its entries hold (NaN if they differ).
template <class Owner>
json_line values_by_owner(const std::vector<float>& values, std::size_t per_entry, Owner owner_of) {
  std::map<std::uint32_t, double> per_shard;
  for (std::size_t i = 0; i < values.size(); ++i) {
    auto [it, fresh] = per_shard.emplace(owner_of(i / per_entry), values[i]);
    if (!fresh && it->second != values[i]) it->second = NAN;
  }
  json_line out = json_line::object();
  for (auto [id, v] : per_shard)
    out[std::to_string(id)] = std::isnan(v) ? json_line(nullptr) : json_line(static_cast<long long>(v));
  return out;
}

// One clock of clocksum: a pull (counted stale unless every value is `expected`), a push
// of the worker's w + 1, then the tick. With --clock-rows, the rows alike.
struct clocksum_step {
  worker_context& ctx;
  key_set keys;
  std::shared_ptr<std::vector<float>> mine;
  std::vector<std::uint64_t> row_ids;  // empty: no rows
  std::vector<float> row_grads;
  bool run(std::uint64_t c, double expected) {
    bool stale = false;
    auto rows = row_ids.empty() ? kv_future{} : ctx.kv.pull_rows(clocksum_table, row_ids);
    for (auto v : ctx.kv.pull(keys).get()) stale |= v != expected;
    if (!row_ids.empty())
      for (auto v : rows.get()) stale |= v != expected;
    auto pushed_rows = row_ids.empty() ? kv_future{} : ctx.kv.push_rows(clocksum_table, row_ids, row_grads);
    ctx.kv.push(keys, mine).get();
    if (!row_ids.empty()) pushed_rows.get();
    ctx.kv.advance_clock(c + 1).get();
    return stale;
  }
};

// --hold-at-clock: at that clock the worker says it holds (a line a test or an operator
// can wait for, then start a joiner or psctl), then waits, at most --ps.barrier-timeout-ms,
// until --hold-for-workers workers are live and the map holds exactly --hold-for-shards.
// So a job whose length gives a join or a leave its time can be held for it instead.
void hold_at_clock(worker_context& ctx, std::uint64_t c) {
  const auto workers = ctx.cfg.app_count("hold-for-workers");
  auto shards = ctx.cfg.app_counts("hold-for-shards");
  std::sort(shards.begin(), shards.end());
  const auto bound = std::chrono::milliseconds(ctx.cfg.barrier_timeout_ms);
  ctx.report("holding at clock " + std::to_string(c) + " until " + std::to_string(workers) + " workers are live" +
             (shards.empty() ? "" : " and the map holds shards " + json_line(shards).dump()));
  auto fail = [&](const std::string& what) {
    throw bad_request("clocksum held at clock " + std::to_string(c) + " for --ps.barrier-timeout-ms=" +
                      std::to_string(ctx.cfg.barrier_timeout_ms) + ", and " + what);
  };
  if (!ctx.kv.await_live_workers(workers, bound))
    fail("only " + std::to_string(ctx.kv.live_workers().size()) + " workers were live (--hold-for-workers=" +
         std::to_string(workers) + ")");
  auto exactly = [&](const partitioner& map) {
    return std::equal(map.shard_ids().begin(), map.shard_ids().end(), shards.begin(), shards.end(),
                      [](std::uint32_t id, std::int64_t want) { return id == want; });
  };
  if (!shards.empty() && !ctx.kv.await_map(exactly, bound))
    fail("the map holds shards " + json_line(ctx.kv.map().shard_ids()).dump() + ", not " + json_line(shards).dump() +
         " (--hold-for-shards)");
}

// Each clock every worker pulls the keys, pushes w + 1 to each and ticks. Under BSP the
// pull at clock c sees exactly c * sum(w + 1) everywhere; at the end every key of a shard
// holds (clocks minus clocks lost) * sum(w + 1), so a failover's effect is exact. With
// --clock-rows=N, rows 0..N-1 of a sparse table go the same way (row_values).
std::string clocksum_app(worker_context& ctx) {
  constexpr key_type num_keys = clocksum_keys;
  const auto clocks = ctx.cfg.app_count("clocks");
  double per_clock = 0;  // sum over workers of w + 1
  for (std::uint32_t w = 0; w < ctx.num_workers; ++w) per_clock += w + 1;
  clocksum_step step{ctx, key_set::single({0, num_keys}),
                     std::make_shared<std::vector<float>>(num_keys, static_cast<float>(ctx.id + 1)), {}, {}};
  for (std::uint64_t id = 0; id < ctx.cfg.app_count("clock-rows"); ++id) step.row_ids.push_back(id);
  step.row_grads.assign(step.row_ids.size() * clocksum_row_dim, static_cast<float>(ctx.id + 1));
  ctx.kv.init(step.keys, std::vector<float>(num_keys, 0.0f)).get();
  // From the first clock on, blocks and requests take the data connections (if any), not
  // however many came up while the job started. Best effort: connections still not up by
  // the request timeout leave their blocks to CAF, as before they come up.
  try {
    ctx.kv.await_data_connections(std::chrono::milliseconds(ctx.cfg.timeout_ms));
  } catch (const kv_error& e) {
    log_line(log_level::warning, "worker " + std::to_string(ctx.id) + ": " + e.what() + "; blocks go through CAF meanwhile");
  }
  std::uint64_t stale_reads = 0;  // clocks whose pulls did not see exactly c * per_clock
  auto start = clock_type::now();
  const auto loop_start = start;
  std::uint64_t pushes = 0;
  const auto hold_at = ctx.cfg.app_count("hold-at-clock");
  const bool holds = ctx.cfg.app_count("hold-for-workers") > 0 || !ctx.cfg.app_counts("hold-for-shards").empty();
  for (std::uint64_t c = ctx.start_clock; c < clocks; ++c) {
    if (holds && c == hold_at) hold_at_clock(ctx, c);
    if (auto ms = ctx.cfg.app_count("clock-ms"); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));  // "compute"
    stale_reads += step.run(c, c * per_clock);
    ++pushes;
    if (seconds_since(start) > 0.5) {
      ctx.report("clock " + std::to_string(c + 1) + "/" + std::to_string(clocks));
      start = clock_type::now();
    }
  }
  const auto train_seconds = seconds_since(loop_start);
  ctx.kv.leave_clock_vector().get();
  ctx.barrier();
  auto final_values = ctx.kv.pull(step.keys).get();
  auto final_rows = step.row_ids.empty() ? std::vector<float>{} : ctx.kv.pull_rows(clocksum_table, step.row_ids).get();
  ctx.barrier();  // nobody leaves while others still pull
  const auto& map = ctx.kv.map();
  auto result = json_line{{"worker", ctx.id},
                          {"clocks", clocks},
                          {"start_clock", ctx.start_clock},
                          {"pushes", pushes},
                          {"train_seconds", train_seconds},
                          {"per_clock", per_clock},
                          {"stale_reads", stale_reads},
                          {"shard_values", values_by_owner(final_values, 1, [&](std::size_t k) { return map.owner(k); })},
                          {"recovery_ms", ctx.kv.recovery_times_ms()}};
  if (!step.row_ids.empty())
    result["row_values"] = values_by_owner(final_rows, clocksum_row_dim,
                                           [&](std::size_t i) { return map.row_owner(clocksum_table, step.row_ids[i]); });
  return with_data_plane(std::move(result), ctx);
}

std::vector<app_flag> clocksum_flags() {
  return {{"clocks", app_flag_kind::count, "40", "clocksum: iterations (clock ticks) per worker",
           [](const node_config& c) { return c.app_count("clocks") >= 1 ? "" : "must be >= 1"; }},
          {"clock-ms", app_flag_kind::count, "0", "clocksum: simulated compute per clock, in ms", {}},
          {"clock-rows", app_flag_kind::count, "0",
           "clocksum: rows 0..N-1 of a sparse table (dim 4) pulled, pushed and checked each clock too", {}},
          // A job held for a joiner or a map change at a known clock (hold_at_clock).
          {"hold-at-clock", app_flag_kind::count, "0",
           "clocksum: with --hold-for-workers or --hold-for-shards, the clock the workers wait at",
           [](const node_config& c) {
             const bool holds = c.app_count("hold-for-workers") > 0 || !c.app_counts("hold-for-shards").empty();
             return !holds || c.app_count("hold-at-clock") < c.app_count("clocks") ? "" : "must be below --clocks";
           }},
          {"hold-for-workers", app_flag_kind::count, "0",
           "clocksum: at --hold-at-clock, wait (at most --ps.barrier-timeout-ms) until this many workers are live", {}},
          {"hold-for-shards", app_flag_kind::counts, "[]",
           "clocksum: at --hold-at-clock, wait (at most --ps.barrier-timeout-ms) until the map holds exactly these "
           "shards, e.g. [1,2] after a join and a leave",
           [](const node_config& c) -> std::string {
             std::set<std::int64_t> seen;
             for (auto id : c.app_counts("hold-for-shards")) {
               if (id < 0 || id > UINT32_MAX) return std::to_string(id) + " is not a shard id";
               if (!seen.insert(id).second) return "shard " + std::to_string(id) + " is named twice";
             }
             return "";
           }}};
}

}  // namespace

app_definition clocksum_definition() {
  return {"clocksum", "exact integer sums per clock, the fault tests' app", clocksum_app, "sum", "bsp",
          [](const node_config&) { return std::vector<tensor_spec>{{"clocksum", {0, clocksum_keys}, {clocksum_keys}}}; },
          clocksum_flags(), clocksum_tables, true};
}

}  // namespace ps
