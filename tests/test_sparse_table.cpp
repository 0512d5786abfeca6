// Sparse tables (libps/rows/sparse_table.hpp): rows created on first touch from (seed, table,
// id) alone, updated by the table's rule with its state beside each row; duplicate ids
// merged on the client side.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <unordered_map>

#include "libps/rows/id_index.hpp"
#include "libps/keys/keys.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/rows/sparse_table.hpp"

using namespace ps;

namespace {

sparse_table_spec spec_of(const std::string& name, std::uint32_t dim, rule_handle kind = "sum",
                          std::uint64_t seed = 7) {
  sparse_table_spec s;
  s.name = name;
  s.dim = dim;
  s.init_scale = 0.5f;
  s.rule.kind = kind;
  s.rule.lr = 0.1f;
  s.seed = seed;
  return s;
}

std::vector<float> pulled(sparse_table& t, std::vector<std::uint64_t> ids) {
  std::vector<float> out(ids.size() * t.spec().dim);
  t.pull(ids, out.data());
  return out;
}

}  // namespace

TEST_CASE("sparse table: a row's first value depends on (seed, table, id) only, wherever and whenever it is made") {
  sparse_table a(spec_of("ads", 8)), b(spec_of("ads", 8));
  pulled(b, {1, 2, 3});  // another history: other rows first
  const std::uint64_t id = 0xdeadbeefcafef00dull;
  auto first = pulled(a, {id});
  CHECK(first == pulled(b, {id}));  // a replica, a restart, a migration: the same row
  CHECK(first != pulled(a, {id + 1}));
  sparse_table other_name(spec_of("users", 8)), other_seed(spec_of("ads", 8, "sum", 8));
  CHECK(first != pulled(other_name, {id}));
  CHECK(first != pulled(other_seed, {id}));
  for (auto v : pulled(a, {1, 2, 3, 4, 5, 6, 7, 8})) {
    CHECK(v >= -0.5f);
    CHECK(v < 0.5f);
  }
  // Spread over the range, not a constant: the mean of many values is near 0.
  std::vector<std::uint64_t> many(1000);
  for (std::uint64_t i = 0; i < many.size(); ++i) many[i] = i * 7919;
  double sum = 0;
  for (auto v : pulled(a, many)) sum += v;
  CHECK(std::abs(sum / (1000.0 * 8)) < 0.02);
}

TEST_CASE("sparse table: pulls create rows once; pushes fold gradients in with the rule, per occurrence") {
  sparse_table t(spec_of("t", 2));
  auto start = pulled(t, {5, 9});
  CHECK(t.rows() == 2);
  CHECK(pulled(t, {9, 5, 9}) == std::vector<float>{start[2], start[3], start[0], start[1], start[2], start[3]});
  CHECK(t.rows() == 2);
  std::vector<float> g{1.0f, 2.0f, 10.0f, 20.0f};
  t.push(std::vector<std::uint64_t>{5, 5}, g.data());  // sum rule, once per occurrence
  auto now = pulled(t, {5});
  CHECK(now[0] == doctest::Approx(start[0] + 11.0f));
  CHECK(now[1] == doctest::Approx(start[1] + 22.0f));
  t.push(std::vector<std::uint64_t>{42}, g.data());  // a push creates the row first
  CHECK(t.rows() == 3);
  std::vector<float> fresh(2);
  initial_row(7, "t", 42, 0.5f, fresh.data(), 2);
  CHECK(pulled(t, {42}) == std::vector<float>{fresh[0] + 1.0f, fresh[1] + 2.0f});
}

TEST_CASE("sparse table: Adagrad keeps its accumulator beside each row") {
  sparse_table t(spec_of("emb", 1, "adagrad"));
  auto w0 = pulled(t, {3})[0];
  std::vector<float> g{2.0f};
  t.push(std::vector<std::uint64_t>{3}, g.data());
  auto w1 = pulled(t, {3})[0];
  CHECK(w1 == doctest::Approx(w0 - 0.1f * 2.0f / (2.0f + 1e-8f)));  // h = 4
  t.push(std::vector<std::uint64_t>{3}, g.data());
  CHECK(pulled(t, {3})[0] == doctest::Approx(w1 - 0.1f * 2.0f / (std::sqrt(8.0f) + 1e-8f)));  // h = 8: state kept
  CHECK(t.bytes() == 2 * sizeof(float) + sparse_table::row_overhead);  // value and accumulator, plus the index entry
}

TEST_CASE("sparse table: a bad spec is refused, naming the table") {
  CHECK_THROWS_WITH_AS(sparse_table{spec_of("", 4)}, "a sparse table needs a name", bad_request);
  CHECK_THROWS_WITH_AS(sparse_table{spec_of("t", 0)}, doctest::Contains("sparse table t: dim 0"), bad_request);
  auto s = spec_of("t", 4);
  s.init_scale = NAN;
  CHECK_THROWS_WITH_AS(sparse_table{s}, doctest::Contains("init scale"), bad_request);
}

TEST_CASE("merge_rows: duplicates merged in first-seen order, gradients summed, positions mapped back") {
  std::vector<std::uint64_t> ids{7, 3, 7, 9, 3, 7};
  std::vector<float> g{1, 10, 2, 20, 3, 30, 4, 40, 5, 50, 6, 60};
  auto m = merge_rows(ids, g.data(), 2);
  CHECK(m.ids == std::vector<std::uint64_t>{7, 3, 9});
  CHECK(m.grads == std::vector<float>{10, 100, 7, 70, 4, 40});
  CHECK(m.slot == std::vector<std::uint32_t>{0, 1, 0, 2, 1, 0});
  auto pull_only = merge_rows(ids, nullptr, 2);
  CHECK(pull_only.ids == m.ids);
  CHECK(pull_only.grads.empty());
  CHECK(merge_rows({}, nullptr, 2).ids.empty());
}

TEST_CASE("sparse table eviction: LRU takes the row used longest ago; segmented LRU keeps rows used twice through a scan") {
  auto touch_all = [](sparse_table& t, std::vector<std::uint64_t> ids) { pulled(t, ids); };
  auto evict_ids = [](sparse_table& t, int n) {
    std::vector<std::uint64_t> out;
    std::vector<float> dirty;
    for (int i = 0; i < n; ++i) out.push_back(t.evict(dirty).id);
    return out;
  };
  sparse_table lru(spec_of("t", 2), eviction_policy::lru), slru(spec_of("t", 2), eviction_policy::slru);
  for (auto* t : {&lru, &slru}) {
    touch_all(*t, {1, 2});
    touch_all(*t, {1, 2});              // used twice: hot
    touch_all(*t, {10, 11, 12, 13});    // a scan of rows used once
  }
  CHECK(evict_ids(lru, 2) == std::vector<std::uint64_t>{1, 2});
  CHECK(evict_ids(slru, 4) == std::vector<std::uint64_t>{10, 11, 12, 13});
  CHECK(slru.holds(1));
  CHECK(slru.holds(2));
  CHECK(eviction_policy_of("slru") == eviction_policy::slru);
  CHECK_THROWS_WITH_AS(eviction_policy_of("fifo"), "eviction policy 'fifo' is not lru or slru", bad_request);
}

TEST_CASE("sparse table eviction: a row read from disk is clean until pushed; a new row is dirty; dirty rows come out whole") {
  auto spec = spec_of("emb", 2, "adagrad");
  sparse_table t(spec);
  std::vector<float> stored{0.5f, -0.5f, 1.0f, 2.0f};  // value, then the Adagrad accumulator
  t.install(7, stored.data());
  std::vector<float> dirty;
  auto out = t.evict(dirty);
  CHECK(out.id == 7);
  CHECK_FALSE(out.dirty);
  CHECK(dirty == stored);
  dirty.clear();
  t.install(7, stored.data());
  std::vector<float> grad{1.0f, 1.0f};
  t.push(std::vector<std::uint64_t>{7}, grad.data());
  out = t.evict(dirty);
  CHECK(out.dirty);
  REQUIRE(dirty.size() == 4);
  CHECK(dirty[2] == doctest::Approx(2.0f));  // accumulator 1 + 1^2
  CHECK(dirty[0] < 0.5f);
  t.install(8, nullptr);  // first touch: the disk has never seen it
  dirty.clear();
  CHECK(t.evict(dirty).dirty);
  std::vector<float> first(2);
  initial_row(spec.seed, "emb", 8, spec.init_scale, first.data(), 2);
  CHECK(dirty == std::vector<float>{first[0], first[1], 0.0f, 0.0f});
  CHECK(t.rows() == 0);
}

TEST_CASE("chunked_rows: rows stay where they were made while the array grows, and keep their values") {
  chunked_rows<float> rows(3, 64);  // 3 floats a row, chunks of at most 64 bytes: 4 rows each
  std::vector<const float*> where;
  for (std::size_t i = 0; i < 50; ++i) {
    rows.emplace_back();
    REQUIRE(rows.size() == i + 1);
    float* r = rows.row(i);
    for (int k = 0; k < 3; ++k) r[k] = static_cast<float>(i * 10 + k);
    where.push_back(r);
  }
  for (std::size_t i = 0; i < 50; ++i) {
    CHECK(rows.row(i) == where[i]);  // nothing moved: growing copied nothing
    for (int k = 0; k < 3; ++k) CHECK(rows.row(i)[k] == static_cast<float>(i * 10 + k));
  }
  CHECK(rows.row(1) == rows.row(0) + 3);  // rows of one chunk lie back to back
  CHECK(rows.row(3) == rows.row(0) + 9);
  chunked_rows<std::uint64_t> one_each;  // width 1: an array of elements
  for (std::uint64_t i = 0; i < 300000; ++i) {  // many chunks
    one_each.emplace_back();
    one_each[i] = i * i;
  }
  CHECK(one_each[299999] == 299999ull * 299999ull);
  CHECK(one_each[262143] == 262143ull * 262143ull);
  CHECK(one_each[262144] == 262144ull * 262144ull);
}

namespace {
// Resets the process's peak memory to what it holds now (Linux: clear_refs 5) and returns
// it, so a test measures its own growth alone.
std::uint64_t reset_peak_rss() {
  {
    std::ofstream reset("/proc/self/clear_refs");
    reset << "5";
  }
  return process_peak_rss();
}
}  // namespace

TEST_CASE("sparse table: growing to 600k rows raises the process's peak memory by about what the rows hold") {
  const auto before = reset_peak_rss();
  REQUIRE(before > 0);
  sparse_table t(spec_of("grow", 64));
  std::vector<float> out(64);
  for (std::uint64_t id = 0; id < 600000; ++id) t.pull(std::span<const std::uint64_t>(&id, 1), out.data());
  REQUIRE(t.rows() == 600000);
  const auto grown = process_peak_rss() - before;
  // A std::vector arena peaked at its old and new arrays at once (1.67x here) when it
  // doubled; chunks never copy. 32 MiB: the index's buckets and the allocator's slack.
  CHECK(grown <= t.bytes() * 11 / 10 + (32u << 20));
  MESSAGE("held " << t.bytes() << " bytes, peak grew by " << grown);
}

TEST_CASE("sparse table: 200 tables of one row each raise the process's peak memory by a few MiB") {
  const auto before = reset_peak_rss();
  REQUIRE(before > 0);
  std::vector<sparse_table> tables;
  tables.reserve(200);
  std::vector<float> out(16);
  const std::uint64_t id = 7;
  for (int t = 0; t < 200; ++t) {
    tables.emplace_back(spec_of("small" + std::to_string(t), 16));
    tables.back().pull(std::span<const std::uint64_t>(&id, 1), out.data());
  }
  const auto grown = process_peak_rss() - before;
  // Chunks of 2 MiB wrote 1.3 MB of row metadata per table (260 MB here).
  CHECK(grown <= (16u << 20));
  MESSAGE("200 one-row tables raised the peak by " << grown << " bytes");
}

// The flat id index agrees with std::unordered_map through inserts and erases that
// make long probe runs (ids that differ in their high bits only land near one another
// under Fibonacci hashing's multiply, consecutive ids far apart) and wrap past the end.
TEST_CASE("id index: finds, erases and grows as a map does, across long probe runs") {
  id_index index;
  std::unordered_map<std::uint64_t, std::uint32_t> truth;
  std::mt19937_64 rng(5);
  std::vector<std::uint64_t> pool;
  for (std::uint64_t i = 0; i < 3000; ++i) pool.push_back(i);                  // consecutive
  for (std::uint64_t i = 0; i < 3000; ++i) pool.push_back(i << 52);            // high bits only
  for (std::uint64_t i = 0; i < 3000; ++i) pool.push_back(rng() | 1ull << 63); // anywhere
  pool.push_back(0xFFFFFFFFFFFFFFFFull);
  for (int round = 0; round < 60000; ++round) {
    const auto id = pool[rng() % pool.size()];
    if (rng() % 3 != 0) {
      if (!truth.count(id)) {
        const auto slot = static_cast<std::uint32_t>(rng() % 1000000);
        index.insert(id, slot);
        truth[id] = slot;
      }
    } else {
      CHECK(index.erase(id) == (truth.erase(id) == 1));
    }
  }
  CHECK(index.size() == truth.size());
  CHECK(truth.size() > 1000);
  for (auto id : pool) {
    auto it = truth.find(id);
    REQUIRE(index.find(id) == (it == truth.end() ? id_index::none : it->second));
  }
  for (auto& [id, slot] : truth) CHECK(index.erase(id));
  CHECK(index.size() == 0);
  for (auto id : pool) CHECK(!index.contains(id));
  CHECK(!index.erase(pool.front()));
}
