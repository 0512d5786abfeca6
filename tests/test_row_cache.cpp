// The worker's embedding cache with bounded staleness (libps/rows/row_cache.hpp).
#include <doctest/doctest.h>

#include <algorithm>

#include "libps/keys/keys.hpp"
#include "libps/rows/row_cache.hpp"

using namespace ps;

namespace {

std::vector<std::uint64_t> ids(std::initializer_list<std::uint64_t> l) { return l; }

}  // namespace

TEST_CASE("row cache: a row is used while at most S clocks old, then pulled again") {
  row_cache c(2, 10, 2);
  CHECK(c.misses(ids({5, 7, 5}), 0) == ids({5, 7}));  // distinct ids, in order
  std::vector<float> v{1, 2, 3, 4};
  CHECK(c.fill(ids({5, 7}), v.data(), 0).empty());
  CHECK(c.misses(ids({5, 7}), 2).empty());  // pulled at 0, now 2: within S = 2
  CHECK(c.misses(ids({5}), 3) == ids({5}));  // 3 clocks old: again
  std::vector<float> out(4);
  c.read(ids({7, 5}), out.data());
  CHECK(out == std::vector<float>{3, 4, 1, 2});
  CHECK(c.hits() == 2);
  CHECK(c.missed() == 3);
  CHECK_THROWS_WITH_AS(c.read(ids({9}), out.data()), "row cache: row 9 is not cached", bad_request);
  CHECK_THROWS_AS(row_cache(2, 0, 1), bad_request);
}

TEST_CASE("row cache: gradients accumulate and leave once: when due, on refresh, on eviction, at the end") {
  row_cache c(1, 2, 1);
  std::vector<float> v{10, 20};
  c.fill(ids({1, 2}), v.data(), 0);
  std::vector<float> g{1, 2};
  c.accumulate(ids({1, 2}), g.data(), 0);
  c.accumulate(ids({1}), g.data(), 1);  // row 1: 1 + 1
  CHECK(c.due(1).empty());              // gradients of clock 0 are needed by reads of clock 2
  auto due = c.due(2);
  REQUIRE(due.size() == 2);
  std::sort(due.begin(), due.end(), [](auto& a, auto& b) { return a.id < b.id; });
  CHECK(due[0].grad == std::vector<float>{2});
  CHECK(due[1].grad == std::vector<float>{2});
  CHECK(c.due(2).empty());  // gone once
  // A refresh flushes what the old version had.
  c.accumulate(ids({1}), g.data(), 2);
  std::vector<float> fresh{11};
  auto refreshed = c.fill(ids({1}), fresh.data(), 3);
  REQUIRE(refreshed.size() == 1);
  CHECK(refreshed[0].id == 1);
  CHECK(refreshed[0].grad == std::vector<float>{1});
  // Capacity 2: a third row evicts the least recently used (row 2) with its gradients.
  c.accumulate(ids({2}), g.data() + 1, 3);
  std::vector<float> third{30};
  auto evicted = c.fill(ids({3}), third.data(), 3);
  REQUIRE(evicted.size() == 1);
  CHECK(evicted[0].id == 2);
  CHECK(evicted[0].grad == std::vector<float>{2});
  CHECK(c.size() == 2);
  c.accumulate(ids({3}), g.data(), 3);
  auto rest = c.drain();
  REQUIRE(rest.size() == 1);
  CHECK(rest[0].id == 3);
  CHECK(c.drain().empty());
}

TEST_CASE("row cache: a batch's rows are found again by position, and only while they hold that row") {
  row_cache c(1, 3, 10);
  std::vector<float> v{50, 60};
  c.fill(ids({5, 6}), v.data(), 0);
  auto batch = ids({5, 7, 5, 9});  // 5 cached, 7 and 9 not
  CHECK(c.misses(batch, 1) == ids({7, 9}));
  std::vector<float> pulled{70, 90};
  auto evicted = c.fill(ids({7, 9}), pulled.data(), 1);  // capacity 3: row 6 leaves
  CHECK(evicted.empty());
  CHECK(c.size() == 3);
  std::vector<float> out(4);
  c.read(batch, out.data());
  CHECK(out == std::vector<float>{50, 70, 50, 90});
  std::vector<float> g{1, 2, 3, 4};
  c.accumulate(batch, g.data(), 1);
  // Same size, other rows: each position is looked up again, not taken from the last batch.
  auto other = ids({9, 5, 7, 9});
  c.read(other, out.data());
  CHECK(out == std::vector<float>{90, 50, 70, 90});
  // The slot row 6 had is reused by row 8; a position that named 6 must not read 8's row.
  CHECK(c.misses(ids({8, 6}), 2) == ids({8, 6}));
  std::vector<float> more{80, 61};
  auto left = c.fill(ids({8, 6}), more.data(), 2);  // 5, 7 and 9 were used last at clock 1
  c.read(ids({6, 8}), out.data());
  CHECK(out[0] == 61);
  CHECK(out[1] == 80);
  auto rest = c.drain();
  for (const auto& f : left) rest.push_back(f);
  std::sort(rest.begin(), rest.end(), [](auto& a, auto& b) { return a.id < b.id; });
  REQUIRE(rest.size() == 3);  // each gradient once, summed per row
  CHECK(rest[0].id == 5);
  CHECK(rest[0].grad == std::vector<float>{4});
  CHECK(rest[1].id == 7);
  CHECK(rest[1].grad == std::vector<float>{2});
  CHECK(rest[2].id == 9);
  CHECK(rest[2].grad == std::vector<float>{4});
  CHECK_THROWS_WITH_AS(c.accumulate(ids({9, 1}), g.data(), 3), "row cache: gradient for row 1, which is not cached",
                       bad_request);
}

TEST_CASE("the unbounded cache's traffic, counted by hand") {
  // Clock 0: {1, 2}; 1: {1}; 2: {1, 3}; 3: {1}. S = 1.
  std::vector<std::vector<std::uint64_t>> batches{{1, 2, 2}, {1}, {1, 3}, {1}};
  auto b = unbounded_cache_traffic(batches, 1);
  CHECK(b.without_cache == 2 * (2 + 1 + 2 + 1));
  // Pulls: 1@0, 2@0, 3@2, 1@2 (pulled at 0, 2 > 0 + 1); pushes: 1's refresh at 2, and at
  // the end 1, 2, 3.
  CHECK(b.with_cache == 4 + 1 + 3);
  CHECK(unbounded_cache_traffic(batches, 100).with_cache == 3 + 3);  // never stale: 3 pulls, 3 pushes
}
