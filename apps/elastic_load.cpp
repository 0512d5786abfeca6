// elastic: sustained load for bench_elastic. Each worker pushes 1 to every key of a 1 MiB
// tensor and pulls it back, one request of each at a time, for --load-seconds; it records
// when each push and pull ended (steady clock, the same on every process of a host) and
// how long it took. Then all workers pull the sums: every key must hold the number of
// pushes of all workers, so a lost or doubled update shows. With --elastic-rows=N a
// sparse table of N rows (filled first, so a shard with --shard-memory holds most on its
// disk) takes part too: each round also pushes 1 to a batch of distinct rows drawn from a
// Zipf law (--elastic-zipf) and pulls it back, and the final sum of all rows must be what
// the workers pushed.
#include "apps/elastic_load.hpp"

#include <chrono>
#include <numeric>

#include "apps/apps.hpp"
#include "apps/sparse_bench.hpp"

namespace ps {

namespace {

constexpr std::uint64_t elastic_keys = 1u << 18;  // 1 MiB of floats
constexpr std::uint32_t elastic_table = 0;        // with --elastic-rows: "elasticrows"
constexpr std::uint32_t elastic_row_dim = 4;
constexpr std::size_t elastic_batch_rows = 1024;  // per row push and pull
constexpr std::size_t elastic_fill_rows = 16384;  // per push while filling

std::int64_t micros(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::vector<sparse_table_spec> elastic_tables(const node_config& cfg) {
  if (cfg.app_count("elastic-rows") == 0) return {};
  return {{"elasticrows", elastic_row_dim, 0.0f, update_rule{}, cfg.seed}};
}

// This worker's share of the table pushed once with zeros: every row exists (rows are
// created on first touch), most of them on disk under a small --shard-memory.
void fill_rows(worker_context& ctx, std::uint64_t rows) {
  const auto from = rows * ctx.id / ctx.num_workers, to = rows * (ctx.id + 1) / ctx.num_workers;
  for (auto begin = from; begin < to; begin += elastic_fill_rows) {
    std::vector<std::uint64_t> ids(std::min<std::uint64_t>(elastic_fill_rows, to - begin));
    std::iota(ids.begin(), ids.end(), begin);
    ctx.kv.push_rows(elastic_table, ids, std::vector<float>(ids.size() * elastic_row_dim, 0.0f)).get();
  }
}

// The sum of every row's values once all workers are done.
double sum_of_rows(worker_context& ctx, std::uint64_t rows) {
  double total = 0;
  for (std::uint64_t begin = 0; begin < rows; begin += elastic_fill_rows) {
    std::vector<std::uint64_t> ids(std::min<std::uint64_t>(elastic_fill_rows, rows - begin));
    std::iota(ids.begin(), ids.end(), begin);
    for (auto v : ctx.kv.pull_rows(elastic_table, ids).get()) total += v;
  }
  return total;
}

std::string elastic_app(worker_context& ctx) {
  using clock = std::chrono::steady_clock;
  auto keys = key_set::single({0, elastic_keys});
  auto ones = std::make_shared<std::vector<float>>(elastic_keys, 1.0f);
  std::vector<float> into(elastic_keys);
  std::vector<std::int64_t> ends_us, took_us;
  std::uint64_t pushes = 0;
  double row_values_pushed = 0;
  const auto rows = ctx.cfg.app_count("elastic-rows");
  std::optional<row_picker> pick;
  if (rows > 0) pick.emplace(rows, ctx.cfg.app_number("elastic-zipf"));
  std::mt19937_64 rng(ctx.cfg.seed * 7919 + ctx.id);
  auto timed = [&](auto request) {
    auto start = clock::now();
    request();
    auto end = clock::now();
    ends_us.push_back(micros(end));
    took_us.push_back(micros(end) - micros(start));
  };
  if (rows > 0) fill_rows(ctx, rows);
  ctx.report("load started");
  const auto deadline = clock::now() + std::chrono::duration_cast<clock::duration>(
                                         std::chrono::duration<double>(ctx.cfg.app_number("load-seconds")));
  while (clock::now() < deadline) {
    timed([&] { ctx.kv.push(keys, ones).get(); });
    ++pushes;
    timed([&] { into = ctx.kv.pull(keys, std::move(into)).get(); });
    if (!pick) continue;
    auto ids = pick->batch(rng, elastic_batch_rows);
    timed([&] { ctx.kv.push_rows(elastic_table, ids, std::vector<float>(ids.size() * elastic_row_dim, 1.0f)).get(); });
    row_values_pushed += static_cast<double>(ids.size() * elastic_row_dim);
    timed([&] { ctx.kv.pull_rows(elastic_table, ids).get(); });
  }
  ctx.kv.leave_clock_vector().get();
  ctx.barrier();  // every worker's pushes are in
  auto sums = ctx.kv.pull(keys).get();
  const double row_sum = rows > 0 ? sum_of_rows(ctx, rows) : 0.0;
  ctx.barrier();  // nobody leaves while others still pull
  double total = std::accumulate(sums.begin(), sums.end(), 0.0);
  return nlohmann::json{{"worker", ctx.id},       {"pushes", pushes},       {"keys", elastic_keys},
                        {"final_sum", total},     {"rows", rows},           {"row_values_pushed", row_values_pushed},
                        {"final_row_sum", row_sum}, {"ends_us", ends_us},   {"took_us", took_us}}
    .dump();
}

}  // namespace

app_definition elastic_load_definition() {
  app_definition app{"elastic", "sustained push/pull load with exact sums (bench_elastic)", elastic_app, "sum", "asp",
                     [](const node_config&) {
                       return std::vector<tensor_spec>{{"elastic", {0, elastic_keys}, {elastic_keys}}};
                     },
                     {}};
  app.tables = elastic_tables;
  app.flags = {{"load-seconds", app_flag_kind::number, "9", "elastic: seconds of load per worker",
                [](const node_config& c) { return c.app_number("load-seconds") > 0 ? "" : "must be > 0"; }},
               {"elastic-rows", app_flag_kind::count, "0",
                "elastic: rows of a sparse table filled first, then pushed and pulled in Zipf batches (0: none)", {}},
               {"elastic-zipf", app_flag_kind::number, "1.05", "elastic: the exponent of the rows' Zipf law",
                [](const node_config& c) { return c.app_number("elastic-zipf") > 0 ? "" : "must be > 0"; }}};
  return app;
}

}  // namespace ps
