// The shard's decisions for sparse tables (libps/core/shard_core.hpp): rows pushed and pulled
// by id, with the same dedupe, SSP gate and deferral as dense keys.
#include <doctest/doctest.h>

#include <vector>

#include "libps/rows/count_min.hpp"
#include "libps/keys/keys.hpp"
#include "libps/core/shard_core.hpp"

using namespace ps;

namespace {

using time_point = shard_core::time_point;
const time_point t0{};

sparse_table_spec table_spec(std::string name, std::uint32_t dim) {
  sparse_table_spec t;
  t.name = std::move(name);
  t.dim = dim;
  t.rule = update_rule{};  // sum: values are first-touch values plus the gradients
  t.seed = 7;
  return t;
}

// One shard of one, 2 workers, one table of dim 2.
shard_config rows_shard(std::uint64_t staleness) {
  shard_config c;
  c.id = 0;
  c.shard_ids = {0};
  c.num_workers = 2;
  c.staleness = staleness;
  c.tables = {table_spec("emb", 2)};
  return c;
}

std::vector<float> first_touch(std::uint64_t id, std::uint32_t dim = 2) {
  std::vector<float> v(dim);
  initial_row(7, "emb", id, 0.01f, v.data(), dim);
  return v;
}

std::vector<float> read(shard_core& core, std::uint64_t token) {
  auto out = core.take_row_values(token);
  core.forget_pull(token);
  return out;
}

}  // namespace

TEST_CASE("shard_core rows: a pulled row is its first-touch value; a push adds once; a resend is only acknowledged") {
  shard_core core(rows_shard(infinite_staleness));
  auto pull = core.pull_rows({1, 0, 0, 0}, 0, {5, 9}, 1, t0);
  REQUIRE(pull.ok());
  REQUIRE(pull.answer == std::vector<std::uint64_t>{1});
  auto before = read(core, 1);
  auto five = first_touch(5), nine = first_touch(9);
  CHECK(before == std::vector<float>{five[0], five[1], nine[0], nine[1]});
  std::vector<float> grads{1, 2, 3, 4};
  auto push = core.push_rows({1, 0, 0, 11}, 0, {9, 5}, grads.data(), grads.size());
  CHECK(push.ok());
  REQUIRE(push.traces.size() == 1);
  CHECK(push.traces[0].kind == trace_event::push);
  CHECK(core.push_rows({1, 0, 0, 11}, 0, {9, 5}, grads.data(), grads.size()).traces.empty());  // resent
  core.pull_rows({1, 0, 0, 0}, 0, {5, 9}, 2, t0);
  CHECK(read(core, 2) == std::vector<float>{five[0] + 3, five[1] + 4, nine[0] + 1, nine[1] + 2});
  CHECK(core.rows().table(0).rows() == 2);
  CHECK(core.rows().rows_created() == 2);
}

TEST_CASE("shard_core rows: an unknown table, a wrong gradient count or another shard's row is refused by name") {
  auto cfg = rows_shard(infinite_staleness);
  std::vector<float> grads{1, 2};
  shard_core core(cfg);
  CHECK(core.push_rows({1, 0, 0, 1}, 3, {1}, grads.data(), 2).error ==
        "shard 0: no sparse table 3 (the job has 1)");
  CHECK(core.push_rows({1, 0, 0, 2}, 0, {1, 2}, grads.data(), 2).error ==
        "shard 0: push of 2 rows of table 'emb' (dim 2) carries 2 values, not 4");
  CHECK(core.pull_rows({1, 0, 0, 0}, 7, {1}, 1, t0).error == "shard 0: no sparse table 7 (the job has 1)");
  cfg.shard_ids = {0, 1};
  shard_core half(cfg);
  partitioner map(1, {0, 1});
  std::uint64_t foreign = 0;
  while (map.row_owner(0, foreign) == 0) ++foreign;
  auto refused = half.pull_rows({1, 0, 0, 0}, 0, {foreign}, 1, t0);
  CHECK(refused.error == "shard 0: row " + std::to_string(foreign) + " of table 'emb' belongs to shard 1 (epoch 1)");
}

TEST_CASE("shard_core rows: under BSP a row read waits for every worker's clock and a row push for its clock's end") {
  shard_core core(rows_shard(0));
  CHECK(core.tick({1, 0, 1, 0}).ok());
  auto parked = core.pull_rows({1, 0, 1, 0}, 0, {4}, 21, t0);
  CHECK(parked.answer.empty());
  std::vector<float> grads{1, 1};
  auto push = core.push_rows({1, 1, 0, 5}, 0, {4}, grads.data(), 2);  // worker 1, clock 0: deferred
  CHECK(push.ok());
  CHECK(push.traces.empty());
  auto fx = core.tick({1, 1, 1, 0});
  REQUIRE(fx.answer == std::vector<std::uint64_t>{21});
  REQUIRE(fx.traces.size() == 2);
  CHECK(fx.traces[0].kind == trace_event::push);  // applied before the read is answered
  CHECK(fx.traces[1].kind == trace_event::pull);
  auto four = first_touch(4);
  CHECK(read(core, 21) == std::vector<float>{four[0] + 1, four[1] + 1});
}

TEST_CASE("shard_core rows: a row is the same on every copy: it depends on (seed, table, id) only") {
  shard_core a(rows_shard(infinite_staleness)), b(rows_shard(infinite_staleness));
  a.pull_rows({1, 0, 0, 0}, 0, {1, 2, 3}, 1, t0);
  b.pull_rows({1, 0, 0, 0}, 0, {3}, 1, t0);  // another order of first touches
  b.forget_pull(1);
  b.pull_rows({1, 0, 0, 0}, 0, {1, 2, 3}, 2, t0);
  CHECK(read(a, 1) == read(b, 2));
}

TEST_CASE("count-min sketch: never under a key's count, exact for keys that share no counter") {
  count_min_sketch sketch(16, 4);
  std::vector<std::uint32_t> truth(20000);
  for (std::uint64_t k = 0; k < truth.size(); ++k) {
    truth[k] = 1 + k % 7;
    for (std::uint32_t i = 0; i < truth[k]; ++i) sketch.add(k);
  }
  std::size_t exact = 0;
  for (std::uint64_t k = 0; k < truth.size(); ++k) {
    auto e = sketch.estimate(k);
    CHECK(e >= truth[k]);
    exact += e == truth[k];
  }
  CHECK(exact > truth.size() * 95 / 100);  // 80,000 sightings over 4 x 65,536 counters
  CHECK(sketch.estimate(1u << 30) <= 7);
  CHECK_THROWS_AS(count_min_sketch(2, 4), bad_request);
}

TEST_CASE("shard_core rows: admission after 3 pushes: earlier gradients are dropped, pulls get the first-touch value, no row is made") {
  auto cfg = rows_shard(infinite_staleness);
  cfg.tables[0].admit_after = 3;
  shard_core core(cfg);
  std::vector<float> grads{1, 2};
  for (std::uint64_t seq = 1; seq <= 2; ++seq) {
    CHECK(core.push_rows({1, 0, seq, seq}, 0, {5}, grads.data(), 2).ok());
    core.pull_rows({1, 0, 0, 0}, 0, {5}, seq, t0);
    CHECK(read(core, seq) == first_touch(5));
  }
  CHECK(core.rows().table(0).rows() == 0);
  CHECK(core.rows().stats().refused == 2);
  CHECK(core.push_rows({1, 0, 3, 3}, 0, {5}, grads.data(), 2).ok());  // the third: admitted, applied
  CHECK(core.rows().table(0).rows() == 1);
  auto five = first_touch(5);
  core.pull_rows({1, 0, 0, 0}, 0, {9, 5}, 7, t0);  // 9 never pushed: first touch, not created
  auto nine = first_touch(9);
  CHECK(read(core, 7) == std::vector<float>{nine[0], nine[1], five[0] + 1, five[1] + 2});
  CHECK(core.rows().rows_created() == 1);
  sparse_table_spec bad = table_spec("emb", 2);
  bad.admit_after = 0;
  CHECK_THROWS_AS(bad.validate(), bad_request);
}

TEST_CASE("shard_core rows: admission's counts go into a checkpoint, and a shard restored from it admits on the pushes still missing") {
  auto cfg = rows_shard(infinite_staleness);
  cfg.tables[0].admit_after = 3;
  shard_core before(cfg);
  std::vector<float> grads{1, 2};
  for (std::uint64_t seq = 1; seq <= 2; ++seq) CHECK(before.push_rows({1, 0, seq, seq}, 0, {5}, grads.data(), 2).ok());
  auto counts = before.rows().sightings();
  REQUIRE_FALSE(counts.empty());

  auto restored_cfg = cfg;
  restored_cfg.restored_sightings = counts;
  shard_core after(restored_cfg), fresh(cfg);
  CHECK(after.push_rows({1, 0, 3, 3}, 0, {5}, grads.data(), 2).ok());  // the third sighting: admitted
  CHECK(fresh.push_rows({1, 0, 3, 3}, 0, {5}, grads.data(), 2).ok());  // a first one: refused
  CHECK(after.rows().table(0).rows() == 1);
  CHECK(fresh.rows().table(0).rows() == 0);

  auto without = rows_shard(infinite_staleness);  // no table admits after more than 1 push
  without.restored_sightings = counts;
  CHECK_THROWS_WITH_AS(shard_core{without}, doctest::Contains("holds admission counts"), bad_request);
  restored_cfg.restored_sightings.pop_back();
  CHECK_THROWS_WITH_AS(shard_core{restored_cfg}, doctest::Contains("saved counters, this sketch has"), bad_request);
}

TEST_CASE("row tier: a restored disk tier's rows count in table_bytes, per table") {
  auto a = table_spec("a", 2), b = table_spec("b", 8);
  row_tier tier({a, b}, 1 << 20, eviction_policy::slru);
  tier.restored_on_disk({3, 5}, 8);
  CHECK(tier.rows_live() == 8);
  CHECK(tier.table_bytes() == (3 * tier.table(0).stride() + 5 * tier.table(1).stride()) * sizeof(float));
  row_tier old_file({a, b}, 1 << 20, eviction_policy::slru);
  old_file.restored_on_disk({}, 8);  // a file of format 3: rows but no counts per table
  CHECK(old_file.rows_live() == 8);
  CHECK(old_file.table_bytes() == 0);
  CHECK_THROWS_WITH_AS(old_file.restored_on_disk({1, 2, 3}, 6), doctest::Contains("rows of 3 sparse tables, the job has 2"),
                       bad_request);
}

TEST_CASE("shard_core rows: a copy that sees only the pushes admits and holds the same rows as the head") {
  auto cfg = rows_shard(infinite_staleness);
  cfg.tables[0].admit_after = 2;
  shard_core head(cfg);
  cfg.head = false;
  shard_core replica(cfg);
  std::vector<float> grads{0.5f, -1};
  std::uint64_t token = 0;
  for (std::uint64_t seq = 1; seq <= 40; ++seq) {
    std::vector<std::uint64_t> rows{seq % 3, seq % 11, 100 + seq};  // often, now and then, once
    std::vector<float> g;
    for (std::size_t i = 0; i < rows.size(); ++i) g.insert(g.end(), grads.begin(), grads.end());
    head.pull_rows({1, 0, 0, 0}, 0, rows, ++token, t0);
    head.forget_pull(token);
    CHECK(head.push_rows({1, 0, seq, seq}, 0, rows, g.data(), g.size()).ok());
    CHECK(replica.push_rows({1, 0, seq, seq}, 0, rows, g.data(), g.size()).ok());
  }
  CHECK(head.rows().table(0).rows() == 11);  // 0..10; the ids pushed once never
  CHECK(replica.rows().table(0).rows() == 11);
  std::vector<std::uint64_t> all;
  for (std::uint64_t id = 0; id < 141; ++id) all.push_back(id);
  head.pull_rows({1, 0, 0, 0}, 0, all, ++token, t0);
  replica.pull_rows({1, 0, 0, 0}, 0, all, token, t0);
  CHECK(read(head, token) == read(replica, token));
}

TEST_CASE("shard_core rows: a row not pushed to for expire_after clocks is dropped, and made afresh when touched") {
  auto cfg = rows_shard(0);
  cfg.num_workers = 1;
  cfg.tables[0].expire_after = 8;
  shard_core core(cfg);
  std::vector<float> grads{1, 1};
  std::uint64_t seq = 0;
  for (std::uint64_t clock = 0; clock < 30; ++clock) {
    std::vector<std::uint64_t> rows{1};
    if (clock < 2) rows.push_back(2);  // row 2: pushed at clocks 0 and 1 only
    std::vector<float> g(rows.size() * 2, 1.0f);
    CHECK(core.push_rows({1, 0, clock, ++seq, clock + 1}, 0, rows, g.data(), g.size()).ok());
    bool two_held = core.rows().table(0).holds(2);
    // Last pushed at clock 1: expired once the minimum clock passes 1 + 8, swept every 2.
    if (clock + 1 <= 9) CHECK(two_held);
    if (clock + 1 >= 12) CHECK_FALSE(two_held);
  }
  CHECK(core.rows().table(0).holds(1));
  CHECK(core.rows().stats().expired == 1);
  CHECK(core.rows().rows_live() == 1);
  core.pull_rows({1, 0, 30, 0}, 0, {2}, 1, t0);
  CHECK(read(core, 1) == first_touch(2));  // made afresh
  CHECK(core.rows().rows_live() == 2);
}

TEST_CASE("shard_core rows: a checkpoint's rows restore the same values; rows of another model are refused") {
  shard_core core(rows_shard(infinite_staleness));
  std::vector<float> grads{1, 2, 3, 4};
  CHECK(core.push_rows({1, 0, 0, 1}, 0, {8, 3}, grads.data(), 4).ok());
  auto snap = core.table_snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].ids == std::vector<std::uint64_t>{3, 8});  // by id
  auto cfg = rows_shard(infinite_staleness);
  cfg.restored_rows = snap;
  shard_core back(cfg);
  CHECK(back.rows().rows_created() == 2);
  core.pull_rows({1, 0, 0, 0}, 0, {8, 3, 5}, 1, t0);
  back.pull_rows({1, 0, 0, 0}, 0, {8, 3, 5}, 1, t0);
  CHECK(read(core, 1) == read(back, 1));
  cfg.tables[0].dim = 3;  // another model's table
  CHECK_THROWS_WITH_AS(shard_core{cfg}, doctest::Contains("rows of sparse table emb have 2 floats each, the job's 3"),
                       bad_request);
  cfg = rows_shard(infinite_staleness);
  cfg.restored_rows = snap;
  cfg.shard_memory = 1 << 20;
  CHECK_THROWS_WITH_AS(shard_core{cfg}, doctest::Contains("is not restored into a disk tier"), bad_request);
}
