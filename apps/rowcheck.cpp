// rowcheck: exact sums over the rows of a sparse table under asynchronous pushes (the
// sparse twin of kvcheck). Every worker pushes, all in flight at once, integer gradients
// to rows every worker shares and to rows of its own, some ids twice in one request (the
// client merges them); then each pulls every row and compares with the exact sum. A
// second table is only read: rows never touched come back as their first-touch values.
#include "apps/rowcheck.hpp"
#include "apps/apps.hpp"

#include "libps/rows/sparse_table.hpp"

namespace ps {

namespace {

constexpr std::uint32_t summed_table = 0;  // "rowsum": starts at 0, so sums of integers stay exact
constexpr std::uint32_t fresh_table = 1;   // "fresh": first-touch values, never pushed
constexpr std::uint32_t row_dim = 8;
constexpr int rounds = 10;

std::uint64_t own_row(std::uint32_t worker, std::uint64_t i) { return (std::uint64_t{worker} + 1) << 40 | i; }

// An integer gradient for (row, worker, round, element).
float row_grad(std::uint64_t id, std::uint32_t worker, int round, std::uint32_t d) {
  return static_cast<float>(id % 13 + 1 + worker * 3 + round + d);
}

// The ids of one push (the shared or own rows, then the first tenth of them again) and
// their gradients.
std::pair<std::vector<std::uint64_t>, std::vector<float>> push_of(const std::vector<std::uint64_t>& rows,
                                                                  std::uint32_t worker, int round) {
  std::vector<std::uint64_t> ids(rows);
  ids.insert(ids.end(), rows.begin(), rows.begin() + rows.size() / 10);
  std::vector<float> grads;
  grads.reserve(ids.size() * row_dim);
  for (auto id : ids)
    for (std::uint32_t d = 0; d < row_dim; ++d) grads.push_back(row_grad(id, worker, round, d));
  return {std::move(ids), std::move(grads)};
}

struct row_tally {
  std::uint64_t checked = 0, mismatches = 0;
  std::string first;
  void compare(std::uint64_t id, std::uint32_t d, float got, double expect) {
    ++checked;
    if (got != expect && mismatches++ == 0)
      first = "row " + std::to_string(id) + "[" + std::to_string(d) + "]: got " + std::to_string(got) +
              ", expected " + std::to_string(expect);
  }
};

// Pulls the rows and compares them with the sums of what `pushers` pushed: each row got
// its gradient twice per round when it was among the first tenth (pushed twice), in this
// run and in each earlier one whose rows were restored (--prior-runs).
void check_sums(worker_context& ctx, const std::vector<std::uint64_t>& rows, const std::vector<std::uint32_t>& pushers,
                row_tally& tally) {
  auto got = ctx.kv.pull_rows(summed_table, rows).get();
  const double runs = 1.0 + static_cast<double>(ctx.cfg.app_count("prior-runs"));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    double times = (i < rows.size() / 10 ? 2 : 1) * runs;
    for (std::uint32_t d = 0; d < row_dim; ++d) {
      double expect = 0;
      for (auto w : pushers)
        for (int round = 0; round < rounds; ++round) expect += times * row_grad(rows[i], w, round, d);
      tally.compare(rows[i], d, got[i * row_dim + d], expect);
    }
  }
}

void check_first_touch(worker_context& ctx, row_tally& tally) {
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 0; i < 1000; ++i) ids.push_back(i * 7919 + ctx.id);  // some asked by both workers
  auto got = ctx.kv.pull_rows(fresh_table, ids).get();
  std::vector<float> expect(row_dim);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    initial_row(ctx.cfg.seed, "fresh", ids[i], 0.01f, expect.data(), row_dim);
    for (std::uint32_t d = 0; d < row_dim; ++d) tally.compare(ids[i], d, got[i * row_dim + d], expect[d]);
  }
}

std::string rowcheck_app(worker_context& ctx) {
  const auto count = ctx.cfg.app_count("rows");
  std::vector<std::uint64_t> shared(count);
  for (std::uint64_t i = 0; i < count; ++i) shared[i] = i * 2654435761u;  // spread over the id space
  auto own = [&](std::uint32_t w) {
    std::vector<std::uint64_t> rows(count);
    for (std::uint64_t i = 0; i < count; ++i) rows[i] = own_row(w, i);
    return rows;
  };
  auto mine = own(ctx.id);
  std::vector<kv_future> inflight;
  for (int round = 0; round < rounds; ++round)
    for (const auto* rows : {&shared, &mine}) {
      auto [ids, grads] = push_of(*rows, ctx.id, round);
      inflight.push_back(ctx.kv.push_rows(summed_table, ids, grads));
    }
  for (auto& f : inflight) f.get();
  // The round ends: under BSP the pushes of clock 0 are applied once every worker's is in
  // (the reads below, at clock 1, wait for that); under SSP and ASP they already are.
  ctx.kv.advance_clock(1).get();
  ctx.barrier();
  row_tally tally;
  std::vector<std::uint32_t> all;
  for (std::uint32_t w = 0; w < ctx.num_workers; ++w) all.push_back(w);
  // With a disk tier, twice: the second pass reads back rows written to disk meanwhile.
  for (int pass = 0; pass < (ctx.cfg.shard_memory > 0 ? 2 : 1); ++pass) {
    check_sums(ctx, shared, all, tally);
    for (std::uint32_t w = 0; w < ctx.num_workers; ++w) check_sums(ctx, own(w), {w}, tally);
  }
  check_first_touch(ctx, tally);
  ctx.barrier();  // nobody leaves while others still pull
  nlohmann::json out{{"worker", ctx.id},       {"checked", tally.checked}, {"mismatches", tally.mismatches},
                     {"rows_per_push", count}, {"first_mismatch", tally.first}};
  if (ctx.id == 0) {  // what the shards' tiers did (rows read back from disk, with --shard-memory)
    out["shards"] = shard_figures(ctx.kv);
  }
  return out.dump();
}

std::vector<sparse_table_spec> rowcheck_tables(const node_config& cfg) {
  sparse_table_spec summed{"rowsum", row_dim, 0.0f, update_rule{}, cfg.seed};
  sparse_table_spec fresh{"fresh", row_dim, 0.01f, update_rule{}, cfg.seed};
  return {summed, fresh};
}

}  // namespace

app_definition rowcheck_definition() {
  app_definition app{"rowcheck", "exact sums over sparse-table rows under asynchronous pushes", rowcheck_app, "sum",
                     "asp", {}, {}};
  app.tables = rowcheck_tables;
  app.flags = {{"rows", app_flag_kind::count, "5000", "rowcheck: rows per push (shared and own, each)",
                [](const node_config& c) { return c.app_count("rows") >= 10 ? "" : "must be >= 10"; }},
               {"prior-runs", app_flag_kind::count, "0",
                "rowcheck: earlier runs whose sums the rows already hold (restored with --restore)", {}}};
  return app;
}

}  // namespace ps
