// The tiered store's bookkeeping (libps/rows/row_tier.hpp) and the shard core over it, with
// the disk tier played by a map answered in FIFO order as the I/O actor answers; and the
// RocksDB disk tier itself (libps/rows/row_disk.hpp).
#include <doctest/doctest.h>

#include <unistd.h>

#include <rocksdb/env.h>
#include <rocksdb/file_system.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "libps/keys/keys.hpp"
#include "libps/rows/row_disk.hpp"
#include "libps/rows/row_tier.hpp"
#include "libps/core/shard_core.hpp"
#include "tests/scratch_dir.hpp"

using namespace ps;
using ps::test::scratch_dir;

namespace {

sparse_table_spec emb(std::uint32_t dim = 2, rule_handle kind = "sum") {
  sparse_table_spec s;
  s.name = "emb";
  s.dim = dim;
  s.rule.kind = kind;
  s.rule.lr = 0.1f;
  s.seed = 3;
  return s;
}

std::vector<std::uint64_t> ids(std::initializer_list<std::uint64_t> l) { return l; }

// The disk tier as the I/O actor serves it: requests answered in the order sent.
struct fake_disk {
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<float>> rows;
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> pushed;
  std::size_t reads = 0;
  // Rows of different tables differ in stride: stride(table) says each one's.
  template <class Stride>
  void write(const row_write& w, Stride stride) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < w.keys.size(); ++i) {
      const auto& k = w.keys[i];
      auto n = stride(k.table);
      rows[{k.table, k.id}].assign(w.rows.begin() + at, w.rows.begin() + at + n);
      pushed[{k.table, k.id}] = w.pushed.empty() ? 0 : w.pushed.at(i);
      at += n;
    }
    for (const auto& k : w.deleted) rows.erase({k.table, k.id}), pushed.erase({k.table, k.id});
  }
  void read(const std::vector<row_key>& keys, std::vector<std::uint8_t>& found, std::vector<float>& out,
            std::vector<std::uint64_t>& clocks) {
    ++reads;
    for (const auto& k : keys) {
      auto it = rows.find({k.table, k.id});
      found.push_back(it != rows.end());
      clocks.push_back(it != rows.end() ? pushed.at({k.table, k.id}) : 0);
      if (it != rows.end()) out.insert(out.end(), it->second.begin(), it->second.end());
    }
  }
  // Pages of 2 rows, as row_disk's of 2^16.
  swept_page expired(const disk_sweep& s) const {
    swept_page out;
    std::size_t scanned = 0;
    for (auto it = pushed.lower_bound({s.table, s.from}); it != pushed.end() && it->first.first == s.table; ++it) {
      if (scanned++ == 2) {
        out.more = true;
        out.next = it->first.second;
        break;
      }
      if (std::max(it->second, s.revived_at) < s.before) out.ids.push_back(it->first.second);
    }
    return out;
  }
  // A map change's scan in pages of 2 rows scanned, taking the moved rows off; a listed
  // move takes 2 listed ids a page.
  moved_page take_moved(const disk_move& m) {
    moved_page out{m.table, {}, {}, false, 0};
    if (!m.listed.empty()) {
      for (auto i = m.from; i < std::min<std::uint64_t>(m.from + 2, m.listed.size()); ++i) {
        auto it = rows.find({m.table, m.listed[i]});
        if (it == rows.end()) continue;
        out.ids.push_back(m.listed[i]);
        out.rows.insert(out.rows.end(), it->second.begin(), it->second.end());
        if (m.keep) continue;
        pushed.erase(it->first);
        rows.erase(it);
      }
      out.next = m.from + 2;
      out.more = out.next < m.listed.size();
      return out;
    }
    std::size_t scanned = 0;
    for (auto it = rows.lower_bound({m.table, m.from}); it != rows.end() && it->first.first == m.table;) {
      if (scanned++ == 2) {
        out.more = true;
        out.next = it->first.second;
        break;
      }
      if (!m.moves(it->first.second)) {
        ++it;
        continue;
      }
      out.ids.push_back(it->first.second);
      out.rows.insert(out.rows.end(), it->second.begin(), it->second.end());
      pushed.erase(it->first);
      it = rows.erase(it);
    }
    return out;
  }
  // row_disk::drop_moved: deletes every row of the table the move picks; how many.
  std::uint64_t drop_moved(const disk_move& m) {
    std::uint64_t dropped = 0;
    for (auto it = rows.lower_bound({m.table, 0}); it != rows.end() && it->first.first == m.table;) {
      if (!m.moves(it->first.second)) {
        ++it;
        continue;
      }
      ++dropped;
      pushed.erase(it->first);
      it = rows.erase(it);
    }
    return dropped;
  }
  // Pages of 3 rows of a table of a pinned copy of the store, as row_disk::pinned_page's.
  static moved_page page_of(const std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<float>>& pinned,
                            std::uint32_t table, std::uint64_t from) {
    moved_page out{table, {}, {}, false, 0};
    for (auto it = pinned.lower_bound({table, from}); it != pinned.end() && it->first.first == table; ++it) {
      if (out.ids.size() == 3) {
        out.more = true;
        out.next = it->first.second;
        break;
      }
      out.ids.push_back(it->first.second);
      out.rows.insert(out.rows.end(), it->second.begin(), it->second.end());
    }
    return out;
  }
};

}  // namespace

TEST_CASE("row tier without a budget: every row is in RAM, created on first touch; hits and misses counted") {
  row_tier tier({emb()}, 0, eviction_policy::lru);
  std::vector<row_key> reads;
  CHECK(tier.want(0, ids({1, 2}), true, reads));
  CHECK(tier.want(0, ids({2, 3}), true, reads));
  CHECK(reads.empty());
  CHECK(tier.rows_created() == 3);
  CHECK(tier.stats().hits == 1);
  CHECK(tier.stats().misses == 3);
  CHECK_FALSE(tier.trim());
}

TEST_CASE("row tier with a budget: misses are read, evicted dirty rows written, and taken back from the write until it lands") {
  const auto row = sparse_table(emb()).row_bytes();
  row_tier tier({emb()}, 2 * row, eviction_policy::lru);
  std::vector<row_key> reads;
  CHECK_FALSE(tier.want(0, ids({1, 2, 3}), true, reads));
  REQUIRE(reads.size() == 3);
  std::vector<row_key> again;
  CHECK_FALSE(tier.want(0, ids({3}), false, again));  // already being read: not asked twice
  CHECK(again.empty());
  tier.loaded(reads, {0, 0, 0}, {});  // none on disk: first touch
  CHECK(tier.rows_created() == 3);
  CHECK(tier.held_bytes() == 3 * row);
  auto w = tier.trim();  // over budget by one row: the oldest goes, dirty (never on disk)
  REQUIRE(w);
  REQUIRE(w->keys.size() == 1);
  CHECK(w->keys[0].id == 1);
  CHECK(tier.held_bytes() == 2 * row);
  reads.clear();
  CHECK(tier.want(0, ids({1}), true, reads));  // taken back from the write under way
  CHECK(reads.empty());
  tier.written(w->seq);
  CHECK(tier.buffered_bytes() == 0);
  auto w2 = tier.trim();
  REQUIRE(w2);
  CHECK(w2->keys[0].id == 2);
  tier.written(w2->seq);
  CHECK_FALSE(tier.want(0, ids({2}), true, reads));  // written: read from disk
  REQUIRE(reads.size() == 1);
  std::vector<float> stored{5, 6};
  tier.loaded(reads, {1}, stored);
  std::vector<float> out(2);
  tier.table(0).pull(ids({2}), out.data());
  CHECK(out == stored);
  CHECK(tier.stats().read == 1);
  CHECK_THROWS_AS(tier.loaded(reads, {1, 1}, stored), bad_request);
}

namespace {

shard_config tiered_shard(std::uint64_t budget, std::uint64_t staleness) {
  shard_config c;
  c.shard_ids = {0};
  c.num_workers = 2;
  c.staleness = staleness;
  c.tables = {emb(4, "adagrad"), emb(3)};
  c.tables[1].name = "other";
  c.shard_memory = budget;
  return c;
}

// Carries out a core's disk work now or later (FIFO), as the shard actor and its I/O
// actor do, and collects answered pulls.
struct disk_driver {
  shard_core& core;
  fake_disk disk;
  std::deque<shard_effects> pending;  // disk work not done yet, in order
  std::map<std::uint64_t, std::vector<float>> answers;
  std::vector<shard_handoff> moved = {};  // rows-only handoffs of map changes' scans, in order
  std::vector<std::uint64_t> failed = {};  // pulls failed (their rows moved)
  void take(shard_effects fx) {
    REQUIRE(fx.ok());
    for (auto t : fx.answer) answers[t] = core.take_row_values(t);
    for (const auto& f : fx.fail) failed.push_back(f.first);
    if (!fx.writes.empty() || !fx.reads.empty() || !fx.sweeps.empty() || !fx.moves.empty() || !fx.drops.empty())
      pending.push_back(std::move(fx));
  }
  void step() {
    auto fx = std::move(pending.front());
    pending.pop_front();
    for (const auto& w : fx.writes) {
      disk.write(*w, [&](std::uint32_t table) { return core.rows().table(table).stride(); });
      take(core.rows_written(w->seq));
    }
    for (const auto& s : fx.sweeps) take(core.rows_swept(s, disk.expired(s)));
    for (auto m : fx.moves)
      for (bool more = true; more;) {
        auto page = disk.take_moved(m);
        for (auto& h : core.rows_moved(page)) moved.push_back(std::move(h));
        more = page.more;
        m.from = page.next;
      }
    for (const auto& d : fx.drops) core.dropped_from_disk(d.table, disk.drop_moved(d));
    if (!fx.reads.empty()) {
      std::vector<std::uint8_t> found;
      std::vector<float> rows;
      std::vector<std::uint64_t> clocks;
      disk.read(fx.reads, found, rows, clocks);
      take(core.rows_loaded(fx.reads, found, rows, clocks));
    }
  }
};

}  // namespace

// 400 pushes of 2 workers on shared and own rows into a tiered core whose disk work is
// done in order, at most `lag` effects behind (with `eager`, now and then sooner); then
// every row must equal that of a core holding all in RAM. Returns the most bytes the
// tiered core's writes under way held meanwhile.
std::uint64_t pushes_end_as_in_ram(const shard_config& cfg, std::size_t lag, bool eager) {
  auto in_ram_cfg = cfg;
  in_ram_cfg.shard_memory = 0;
  shard_core tiered(cfg), in_ram(in_ram_cfg);
  disk_driver drive{tiered, {}, {}, {}};
  std::mt19937_64 rng(11);
  std::uint64_t seq = 0, most_buffered = 0;
  for (int step = 0; step < 400; ++step) {
    std::uint32_t worker = step % 2, table = rng() % 2;
    std::uint32_t dim = table == 0 ? 4 : 3;
    std::vector<std::uint64_t> rows;
    for (int i = 0; i < 3; ++i) {
      auto id = rng() % 2 ? rng() % 8 : 100 + worker * 50 + rng() % 20;  // shared, then own
      if (std::find(rows.begin(), rows.end(), id) == rows.end()) rows.push_back(id);
    }
    std::vector<float> grads(rows.size() * dim);
    for (auto& g : grads) g = static_cast<float>(rng() % 7) - 3.0f;
    shard_request r{1, worker, 0, ++seq, 0};
    REQUIRE(in_ram.push_rows(r, table, rows, grads.data(), grads.size()).ok());
    drive.take(tiered.push_rows(r, table, rows, grads.data(), grads.size()));
    most_buffered = std::max(most_buffered, tiered.rows().buffered_bytes());
    while (drive.pending.size() > lag || (eager && !drive.pending.empty() && rng() % 3 == 0)) drive.step();
  }
  while (!drive.pending.empty()) drive.step();
  CHECK(drive.disk.reads > 0);
  CHECK(tiered.rows().stats().written > 0);
  for (std::uint32_t table = 0; table < 2; ++table) {
    std::vector<std::uint64_t> all;
    for (std::uint64_t id = 0; id < 8; ++id) all.push_back(id);
    for (std::uint64_t id = 100; id < 220; ++id) all.push_back(id);
    auto token = 1000 + table;
    auto fx = in_ram.pull_rows({1, 0, 0, 0}, table, all, token, {});
    REQUIRE(fx.answer.size() == 1);
    auto expected = in_ram.take_row_values(token);
    drive.take(tiered.pull_rows({1, 0, 0, 0}, table, all, token, {}));
    while (!drive.pending.empty()) drive.step();
    REQUIRE(drive.answers.count(token) == 1);
    CHECK(drive.answers[token] == expected);
  }
  CHECK(tiered.rows().rows_created() == in_ram.rows().rows_created());
  return most_buffered;
}

TEST_CASE("shard core over a tiny RAM tier: pushes from 2 workers, shared and own rows, end exactly as all in RAM") {
  const std::uint64_t budget = 6 * sparse_table(emb(4, "adagrad")).row_bytes();
  pushes_end_as_in_ram(tiered_shard(budget, infinite_staleness), 3, true);
}

TEST_CASE("shard core over a disk that writes slowly: row work waits for the write backlog, so writes under way stay bounded; nothing lost") {
  const auto row = sparse_table(emb(4, "adagrad")).row_bytes();
  auto cfg = tiered_shard(6 * row, infinite_staleness);
  const std::size_t lag = 40;  // the disk's work runs 40 effects behind
  cfg.write_backlog_bytes = UINT64_MAX;  // no limit: writes under way pile up
  const auto unbounded = pushes_end_as_in_ram(cfg, lag, false);
  cfg.write_backlog_bytes = 2 * row;
  const auto bounded = pushes_end_as_in_ram(cfg, lag, false);
  // Past the limit, only the evictions of reads already under way add to the backlog:
  // at most what RAM holds.
  CHECK(bounded <= cfg.write_backlog_bytes + cfg.shard_memory);
  CHECK(unbounded > 4 * bounded);
  MESSAGE("writes under way held at most " << unbounded << " bytes without the limit, " << bounded << " with it");
}

TEST_CASE("shard core over a tiered store with expiry: rows not pushed for 4 clocks expire in RAM and on disk, each counted once, and come back fresh") {
  const std::uint64_t budget = 3 * sparse_table(emb(4, "adagrad")).row_bytes();
  auto cfg = tiered_shard(budget, infinite_staleness);
  cfg.num_workers = 1;
  cfg.tables[0].expire_after = 4;
  shard_core core(cfg);
  disk_driver drive{core, {}, {}, {}};
  std::vector<float> grads(4, 1.0f);
  std::uint64_t seq = 0;
  auto push = [&](std::uint64_t id, std::uint64_t clock) {
    drive.take(core.push_rows({1, 0, clock, ++seq, clock + 1}, 0, {id}, grads.data(), 4));  // pushes, then ticks
    while (!drive.pending.empty()) drive.step();
  };
  // Clock 0: rows 0..9 (more than RAM holds: most go to disk). From clock 1 on only row 0
  // and, at each clock, one of rows 20.. is pushed, so rows 1..9 expire once the minimum
  // clock passes 4 (a sweep every clock: 4 / 4).
  for (std::uint64_t id = 0; id < 10; ++id) push(id, 0);
  CHECK(core.rows().stats().written > 0);
  for (std::uint64_t clock = 1; clock < 12; ++clock) {
    push(0, clock);
    push(20 + clock, clock);
  }
  const auto& s = core.rows().stats();
  // Rows 1..9 and 21..26 (pushed at clocks 1..6, last pushed 5+ clocks before 12) expired.
  CHECK(s.expired == 9 + 6);
  CHECK(core.rows().rows_live() == 1 + 5);
  CHECK(core.rows().live_rows()[0] == 6);
  for (const auto& [key, clock] : drive.disk.pushed)  // none expired left on disk but copies of rows in RAM
    if (!core.rows().table(0).holds(key.second)) CHECK(clock + 4 >= 11);
  // An expired row touched again is made afresh: its first-touch value, not its old sums.
  auto token = 77;
  drive.take(core.pull_rows({1, 0, 0, 0}, 0, {3}, token, {}));
  while (!drive.pending.empty()) drive.step();
  auto in_ram = cfg;
  in_ram.shard_memory = 0;
  shard_core fresh(in_ram);
  REQUIRE(fresh.pull_rows({1, 0, 0, 0}, 0, {3}, token, {}).answer.size() == 1);
  REQUIRE(drive.answers.count(token) == 1);
  CHECK(drive.answers.at(token) == fresh.take_row_values(token));
  CHECK(core.rows().stats().expired == 15);  // not counted again
}

TEST_CASE("shard core over a tiered store: a pull of keys answerable while row work waits on the disk waits its turn") {
  shard_config c = tiered_shard(1, infinite_staleness);
  c.dense = {{0, 4}};
  shard_core core(c);
  std::vector<float> init(4, 1.0f);
  REQUIRE(core.init({1, 0, 0, 1}, {{0, 4}}, init.data(), 4).ok());
  auto rows = core.pull_rows({1, 0, 0, 0}, 0, {5}, 1, {});
  CHECK(rows.answer.empty());
  REQUIRE(rows.reads.size() == 1);
  auto keys = core.pull({1, 1, 0, 0}, {{0, 4}}, 2, {});
  CHECK(keys.answer.empty());
  auto loaded = core.rows_loaded(rows.reads, {0}, {});
  CHECK(loaded.answer == std::vector<std::uint64_t>{1, 2});
}

TEST_CASE("row disk: rows written are read back; missing rows are not found; a write of the wrong size is refused") {
  scratch_dir scratch;
  const auto& dir = scratch.path;
  if (!scratch.holds_disk_tier()) return;
  auto orphan = dir / "actorps-rows-shard-9-2147483647";  // no process has that pid
  std::filesystem::create_directories(orphan);
  std::string path;
  {
    row_disk disk(dir.string(), "shard 0", {2, 3});
    CHECK_FALSE(std::filesystem::exists(orphan));  // left by a killed shard: removed
    path = disk.path();
    CHECK(std::filesystem::exists(path));
    disk.write({1, {{0, 5}, {1, 5}}, {1, 2, 3, 4, 5}});
    std::vector<std::uint8_t> found;
    std::vector<float> rows;
    std::vector<std::uint64_t> pushed;
    disk.read({{1, 5}, {0, 6}, {0, 5}}, found, rows, pushed);
    CHECK(found == std::vector<std::uint8_t>{1, 0, 1});
    CHECK(rows == std::vector<float>{3, 4, 5, 1, 2});
    CHECK(pushed == std::vector<std::uint64_t>{0, 0, 0});  // written without push clocks
    // With push clocks: kept beside each row; a sweep lists the rows pushed before a clock
    // (those pushed before revived_at count as pushed then); deleted rows are gone.
    row_write stamped{2, {{0, 7}, {0, 8}, {1, 9}}, {1, 2, 3, 4, 5, 6, 7}, {4, 9, 2}, {{0, 5}}};
    disk.write(stamped);
    found.clear(), rows.clear();
    disk.read({{0, 7}, {0, 8}, {0, 5}, {1, 9}}, found, rows, pushed);
    CHECK(found == std::vector<std::uint8_t>{1, 1, 0, 1});
    CHECK(pushed == std::vector<std::uint64_t>{4, 9, 0, 2});
    CHECK(rows == std::vector<float>{1, 2, 3, 4, 5, 6, 7});
    CHECK(disk.expired({0, 5, 0, 0}).ids == std::vector<std::uint64_t>{7});
    CHECK(disk.expired({0, 10, 0, 0}).ids == std::vector<std::uint64_t>{7, 8});
    CHECK(disk.expired({0, 5, 6, 0}).ids.empty());
    CHECK(disk.expired({1, 3, 0, 0}).ids == std::vector<std::uint64_t>{5, 9});  // {1, 5} was written without a clock
    auto first = disk.expired({1, 3, 0, 0}, 1);  // in pages of one row
    CHECK(first.ids == std::vector<std::uint64_t>{5});
    REQUIRE(first.more);
    CHECK(first.next == 9);
    auto second = disk.expired({1, 3, 0, first.next}, 1);
    CHECK(second.ids == std::vector<std::uint64_t>{9});
    CHECK_FALSE(second.more);
    stamped.pushed.pop_back();
    CHECK_THROWS_WITH_AS(disk.write(stamped), doctest::Contains("2 push clocks for 3 rows"), bad_request);
    CHECK_THROWS_WITH_AS(disk.write({2, {{0, 9}}, {1, 2, 3}}), doctest::Contains("a write carries 3 values, not 2"),
                         bad_request);
    // A map change's scan: the rows it picks leave the disk as they are returned, in pages.
    disk_move odd{1, 0, [](std::uint64_t id) { return id % 2 == 1; }};
    auto page = disk.take_moved(odd, 1);
    CHECK(page.ids == std::vector<std::uint64_t>{5});
    CHECK(page.rows == std::vector<float>{3, 4, 5});
    REQUIRE(page.more);
    odd.from = page.next;
    page = disk.take_moved(odd, 1);
    CHECK(page.ids == std::vector<std::uint64_t>{9});
    CHECK(page.rows == std::vector<float>{5, 6, 7});
    CHECK_FALSE(page.more);
    CHECK(disk.take_moved({0, 0, [](std::uint64_t id) { return id == 8; }}).ids == std::vector<std::uint64_t>{8});
    found.clear(), rows.clear();
    disk.read({{1, 5}, {1, 9}, {0, 8}, {0, 7}}, found, rows, pushed);
    CHECK(found == std::vector<std::uint8_t>{0, 0, 0, 1});
    CHECK(disk.bytes_on_disk() > 0);
  }
  CHECK_FALSE(std::filesystem::exists(path));  // scratch: removed when closed
}

TEST_CASE("row disk: a pinned store is read as it was when pinned, in pages, while writes go on; kept rows are dropped") {
  scratch_dir scratch;
  if (!scratch.holds_disk_tier()) return;
  row_disk disk(scratch.path.string(), "shard 0", {2, 3});
  CHECK_THROWS_WITH_AS(disk.pinned_page(0, 0), doctest::Contains("no pinned view"), bad_request);
  disk.write({1, {{0, 5}, {0, 6}, {1, 5}}, {1, 2, 3, 4, 5, 6, 7}});
  // Pinned with the RAM tier's changed rows written first (row 7 of table 0, with a clock).
  disk.pin({2, {{0, 7}}, {8, 9}, {3}});
  disk.write({3, {{0, 5}, {0, 9}}, {10, 11, 12, 13}, {}, {{0, 6}}});  // after the pin: not seen
  auto page = disk.pinned_page(0, 0, 2);
  CHECK(page.ids == std::vector<std::uint64_t>{5, 6});
  CHECK(page.rows == std::vector<float>{1, 2, 3, 4});
  REQUIRE(page.more);
  page = disk.pinned_page(0, page.next, 2);
  CHECK(page.ids == std::vector<std::uint64_t>{7});
  CHECK(page.rows == std::vector<float>{8, 9});  // its push clock stays behind
  CHECK_FALSE(page.more);
  CHECK(disk.pinned_page(1, 0).rows == std::vector<float>{5, 6, 7});
  CHECK_THROWS_WITH_AS(disk.pinned_page(2, 0), doctest::Contains("no table 2"), bad_request);
  std::vector<std::uint8_t> found;
  std::vector<float> rows;
  std::vector<std::uint64_t> pushed;
  disk.read({{0, 5}, {0, 6}}, found, rows, pushed);  // the store itself went on
  CHECK(found == std::vector<std::uint8_t>{1, 0});
  CHECK(rows == std::vector<float>{10, 11});
  disk.unpin();
  CHECK_THROWS_AS(disk.pinned_page(0, 0), bad_request);
  // What a copy kept of a map change is deleted whole, past any page boundary.
  CHECK(disk.drop_moved({0, 0, [](std::uint64_t id) { return id != 9; }}) == 2);  // rows 5 and 7
  found.clear(), rows.clear();
  disk.read({{0, 5}, {0, 7}, {0, 9}, {1, 5}}, found, rows, pushed);
  CHECK(found == std::vector<std::uint8_t>{0, 0, 1, 1});
}

TEST_CASE("row disk: a listed move takes only the listed rows held, by id, a page at a time, off the store") {
  scratch_dir scratch;
  if (!scratch.holds_disk_tier()) return;
  row_disk disk(scratch.path.string(), "shard 0", {2, 3});
  disk.write({1, {{0, 1}, {0, 2}, {0, 3}, {0, 8}, {1, 2}}, {1, 1, 2, 2, 3, 3, 8, 8, 5, 6, 7}, {4, 4, 4, 4, 4}});
  disk_move listed{0, 0, {}, {2, 3, 5, 8}};  // row 5 is not there (an id noted, never written)
  auto page = disk.take_moved(listed, 2);
  CHECK(page.ids == std::vector<std::uint64_t>{2, 3});
  CHECK(page.rows == std::vector<float>{2, 2, 3, 3});  // push clocks stay behind
  REQUIRE(page.more);
  listed.from = page.next;
  page = disk.take_moved(listed, 2);
  CHECK(page.ids == std::vector<std::uint64_t>{8});
  CHECK(page.rows == std::vector<float>{8, 8});
  CHECK_FALSE(page.more);
  std::vector<std::uint8_t> found;
  std::vector<float> rows;
  std::vector<std::uint64_t> pushed;
  disk.read({{0, 1}, {0, 2}, {0, 3}, {0, 8}, {1, 2}}, found, rows, pushed);
  CHECK(found == std::vector<std::uint8_t>{1, 0, 0, 0, 1});  // taken off; row 2 of table 1 is another table's
  CHECK_THROWS_WITH_AS(disk.take_moved({2, 0, {}, {1}}), doctest::Contains("table 2"), bad_request);
  // keep: a copy of the rows as the pin holds them, left on the disk (a seed's).
  disk_move copied{0, 0, {}, {1, 4}};
  copied.keep = true;
  CHECK_THROWS_WITH_AS(disk.take_moved(copied), doctest::Contains("no pinned view"), bad_request);
  disk.pin({2, {{0, 4}}, {4, 4}, {}});
  disk.write({3, {{0, 1}, {0, 4}}, {9, 9, 9, 9}, {}});  // after the pin: not seen
  page = disk.take_moved(copied);
  CHECK(page.ids == std::vector<std::uint64_t>{1, 4});
  CHECK(page.rows == std::vector<float>{1, 1, 4, 4});
  found.clear(), rows.clear();
  disk.read({{0, 1}, {0, 4}}, found, rows, pushed);
  CHECK(rows == std::vector<float>{9, 9, 9, 9});
}

TEST_CASE("row disk: saved stores laid out for other shards: every row, as stored, at its new owner") {
  scratch_dir scratch;
  const auto& dir = scratch.path;
  if (!scratch.holds_disk_tier()) return;
  // Two old shards' saved stores: rows 0..99 of table 0 (stride 2) and of table 1 (stride 3),
  // split between them by id parity, some with a push clock stored beside them.
  std::vector<std::string> saved;
  for (std::uint64_t parity : {0, 1}) {
    row_disk disk(dir.string(), "old " + std::to_string(parity), {2, 3});
    row_write w{1, {}, {}, {}, {}};
    for (std::uint64_t id = parity; id < 100; id += 2) {
      w.keys.push_back({0, id});
      w.rows.insert(w.rows.end(), {float(id), 0.5f});
      w.keys.push_back({1, id});
      w.rows.insert(w.rows.end(), {float(id), 1.0f, 2.0f});
      w.pushed.insert(w.pushed.end(), {id, id + 1});
    }
    if (parity == 1) {  // left over from an earlier map change: row 0 is the even store's
      w.keys.push_back({0, 0});
      w.rows.insert(w.rows.end(), {-1.0f, -1.0f});
      w.pushed.push_back(0);
    }
    saved.push_back((dir / ("saved-" + std::to_string(parity))).string());
    disk.save(w, saved.back());
  }
  const auto into = (dir / "onto-3").string();
  auto owner = [](const row_key& k) { return static_cast<std::uint32_t>((k.id + k.table) % 3) + 10; };
  auto own = [](std::size_t store, const row_key& k) { return k.id % 2 == store; };
  auto counts = lay_out_saved_rows(saved, 2, owner, {10, 11, 12}, into, own);
  std::uint64_t rows = 0;
  for (std::uint32_t shard : {10, 11, 12}) {
    auto got = read_saved_rows(saved_rows_path(into, shard), {2, 3});
    REQUIRE(got.size() == 2);
    CHECK(counts.at(shard) == std::vector<std::uint64_t>{got[0].ids.size(), got[1].ids.size()});
    for (const auto& t : got)
      for (std::size_t i = 0; i < t.ids.size(); ++i) {
        CHECK(owner({t.table, t.ids[i]}) == shard);
        CHECK(t.rows[i * t.stride] == float(t.ids[i]));  // the row's own floats
      }
    rows += got[0].ids.size() + got[1].ids.size();
    // The push clocks travel too: a disk tier started from the new store reads them.
    row_disk started(dir.string(), "new " + std::to_string(shard), {2, 3}, nullptr, saved_rows_path(into, shard));
    std::vector<std::uint8_t> found;
    std::vector<float> values;
    std::vector<std::uint64_t> pushed;
    started.read({{1, got[1].ids.front()}}, found, values, pushed);
    CHECK(found == std::vector<std::uint8_t>{1});
    CHECK(pushed == std::vector<std::uint64_t>{got[1].ids.front() + 1});
  }
  CHECK(rows == 200);
  // A recovery's layout: one shard's rows (the owner answers none for the others' rows).
  const auto only = (dir / "only-11").string();
  auto only_11 = [&](const row_key& k) -> std::optional<std::uint32_t> {
    if (owner(k) != 11) return std::nullopt;
    return 11;
  };
  auto one = lay_out_saved_rows(saved, 2, only_11, {11}, only, own);
  CHECK(one.size() == 1);
  CHECK(one.at(11) == counts.at(11));
  auto got = read_saved_rows(saved_rows_path(only, 11), {2, 3});
  CHECK(got[0].ids.size() + got[1].ids.size() == counts.at(11)[0] + counts.at(11)[1]);
  CHECK_FALSE(std::filesystem::exists(saved_rows_path(only, 10)));
  // A row of a table the job does not have, an owner not among the shards, a missing store.
  CHECK_THROWS_WITH_AS(lay_out_saved_rows(saved, 1, owner, {10, 11, 12}, into), doctest::Contains("a row of table 1, the job has 1"),
                       bad_request);
  CHECK_THROWS_WITH_AS(lay_out_saved_rows(saved, 2, owner, {10, 11}, into), doctest::Contains("not among the new shards"),
                       bad_request);
  const auto missing = (dir / "none").string(), says = missing + ": not a directory";
  CHECK_THROWS_WITH_AS(lay_out_saved_rows({missing}, 2, owner, {10, 11, 12}, into), doctest::Contains(says.c_str()),
                       bad_request);
}

TEST_CASE("row disk: a directory that cannot hold it is named, with why") {
  CHECK(direct_io_problem("/nonexistent-actorps") == "/nonexistent-actorps is not a directory");
  if (std::filesystem::is_directory("/dev/shm"))
    CHECK_THROWS_WITH_AS(row_disk("/dev/shm", "s", {2}), doctest::Contains("/dev/shm is in memory (tmpfs)"),
                         bad_request);
}

TEST_CASE("shard core over a tiered store: a push waiting for disk reads is acknowledged once applied, not before") {
  shard_core core(tiered_shard(1 << 20, infinite_staleness));
  std::vector<float> grads(4, 1.0f);
  auto push = core.push_rows({1, 0, 0, 1}, 0, {42}, grads.data(), 4);
  REQUIRE(push.ok());
  REQUIRE(push.queued_push);
  CHECK(push.applied.empty());
  CHECK(push.traces.empty());  // not applied yet
  auto loaded = core.rows_loaded(push.reads, {0}, {});
  CHECK(loaded.applied == std::vector<std::uint64_t>{*push.queued_push});
  REQUIRE(loaded.traces.size() == 1);
  CHECK(loaded.traces[0].kind == trace_event::push);
  auto held = core.push_rows({1, 0, 0, 2}, 0, {42}, grads.data(), 4);  // in RAM now: applied at once
  CHECK_FALSE(held.queued_push);
  CHECK(held.traces.size() == 1);
}

namespace {
// Pulls row `id` of table 0, answering its reads as a disk that never saw it would and
// landing its writes at once; true when the row was not in RAM.
bool pull_missing(shard_core& core, std::uint64_t id, std::uint64_t token) {
  const auto misses = core.rows().stats().misses;
  auto fx = core.pull_rows({1, 0, 0, 0}, 0, {id}, token, {});
  auto land = [&](const shard_effects& e) {
    for (const auto& w : e.writes) core.rows_written(w->seq);
  };
  land(fx);
  if (!fx.reads.empty()) {
    fx = core.rows_loaded(fx.reads, std::vector<std::uint8_t>(fx.reads.size(), 0), {}, {});
    land(fx);
  }
  REQUIRE(fx.answer == std::vector<std::uint64_t>{token});
  core.forget_pull(token);
  return core.rows().stats().misses > misses;
}
}  // namespace

TEST_CASE("shard core over a tiered store, slru: rows read for one request stay on probation, so a scan of rows read "
          "once does not flush rows used twice") {
  const std::uint64_t row = sparse_table(emb(4, "adagrad")).row_bytes();
  shard_core core(tiered_shard(10 * row, infinite_staleness));  // 10 rows, 8 of them protected at most
  std::uint64_t token = 0;
  const std::vector<std::uint64_t> hot{1, 2, 3};
  for (auto id : hot) CHECK(pull_missing(core, id, ++token));        // read once: on probation
  for (auto id : hot) CHECK_FALSE(pull_missing(core, id, ++token));  // used again while held: protected
  for (std::uint64_t id = 100; id < 140; ++id) CHECK(pull_missing(core, id, ++token));  // the scan
  for (auto id : hot) CHECK_FALSE(pull_missing(core, id, ++token));  // still held
  CHECK(core.rows().stats().written > 0);  // the scan's rows went to disk
}

TEST_CASE("shard core over a tiered store: under BSP a deferred push is acknowledged on arrival and applied later") {
  shard_core core(tiered_shard(1 << 20, 0));
  std::vector<float> grads(4, 1.0f);
  auto push = core.push_rows({1, 0, 0, 1, 1}, 0, {42}, grads.data(), 4);  // clock 0, ticks to 1
  REQUIRE(push.ok());
  CHECK_FALSE(push.queued_push);
  auto other = core.push_rows({1, 1, 0, 1, 1}, 0, {43}, grads.data(), 4);  // completes clock 0: both applied
  CHECK_FALSE(other.queued_push);
  CHECK(other.reads.size() == 2);
  auto loaded = core.rows_loaded(other.reads, {0, 0}, {});
  CHECK(loaded.applied.empty());
  CHECK(loaded.traces.size() == 2);
}

TEST_CASE("shard core over a tiered store: a read let through under BSP and waiting for the disk is answered as of its gate, "
          "though a leaver's handoff lowers the min clock meanwhile") {
  auto config = [](std::uint32_t id) {
    auto c = tiered_shard(sparse_table(emb(4, "adagrad")).row_bytes(), 0);
    c.id = id;
    c.shard_ids = {0, 1};
    return c;
  };
  shard_core taker(config(0)), leaver(config(1));
  for (std::uint32_t w = 0; w < 2; ++w) REQUIRE(taker.tick({1, w, 2, 0}).ok());
  REQUIRE(leaver.tick({1, 0, 2, 0}).ok());
  REQUIRE(leaver.tick({1, 1, 1, 0}).ok());  // the leaver has not heard worker 1 finish clock 1
  std::vector<std::uint64_t> own;
  for (std::uint64_t id = 0; own.size() < 3; ++id)
    if (taker.map().row_owner(0, id) == 0) own.push_back(id);
  auto read = taker.pull_rows({1, 0, 2, 0}, 0, own, 7, {});  // needs min 2: let through, waits for the disk
  REQUIRE(read.ok());
  REQUIRE(read.answer.empty());
  REQUIRE_FALSE(read.reads.empty());
  const auto fewer = taker.map().without_shard(1);
  shard_effects given, gained;
  auto parts = leaver.hand_off(fewer, given);
  REQUIRE(parts.size() == 1);
  REQUIRE(taker.hand_off(fewer, gained).empty());
  REQUIRE(taker.take_over(parts[0]).ok());
  CHECK(taker.min_clock() == 1);  // the keys gained lack worker 1's clock 1 as far as anyone knows
  auto answered = taker.rows_loaded(read.reads, std::vector<std::uint8_t>(read.reads.size(), 0), {}, {});
  REQUIRE(answered.answer == std::vector<std::uint64_t>{7});
  REQUIRE(answered.traces.size() == 1);
  CHECK(answered.traces[0].kind == trace_event::pull);
  CHECK(answered.traces[0].min_clock == 2);  // it read only keys it held, complete to clock 2
  // A read arriving now waits: it might read the keys gained.
  CHECK(taker.pull_rows({2, 1, 2, 0}, 0, own, 8, {}).answer.empty());
}

TEST_CASE("row tier: a row taken back while its write is under way and evicted unchanged stays readable from that write until it lands") {
  const auto row = sparse_table(emb()).row_bytes();
  row_tier tier({emb()}, row, eviction_policy::lru);
  std::vector<row_key> reads;
  tier.want(0, ids({1, 2}), true, reads);
  tier.loaded(reads, {0, 0}, {});
  auto first = tier.trim();  // row 1 leaves, dirty (new): written
  REQUIRE(first);
  reads.clear();
  CHECK(tier.want(0, ids({1}), true, reads));  // back from its write, still under way
  auto second = tier.trim();                     // row 2 leaves, dirty: written
  REQUIRE(second);
  CHECK(second->keys[0].id == 2);
  CHECK(tier.want(0, ids({2}), true, reads));    // back too
  CHECK_FALSE(tier.trim());                      // row 1 leaves unchanged: no new write...
  CHECK(tier.want(0, ids({1}), true, reads));    // ...but taken back from that write, not read
  CHECK(reads.empty());
  tier.trim();                                   // row 2 leaves unchanged, readable from its write
  tier.written(first->seq);
  tier.written(second->seq);
  CHECK(tier.buffered_bytes() == 0);             // both writes landed: nothing kept
  CHECK_FALSE(tier.want(0, ids({2}), true, reads));  // now read from disk
  CHECK(reads.size() == 1);
}

namespace {

// A file system whose disk is full after `room` bytes: appends beyond it fail with
// ENOSPC as RocksDB's own file system reports it.
class filling_fs : public rocksdb::FileSystemWrapper {
 public:
  explicit filling_fs(std::uint64_t room) : FileSystemWrapper(rocksdb::FileSystem::Default()), room_(room) {}
  const char* Name() const override { return "filling_fs"; }
  rocksdb::IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                                    std::unique_ptr<rocksdb::FSWritableFile>* out,
                                    rocksdb::IODebugContext* dbg) override {
    std::unique_ptr<rocksdb::FSWritableFile> file;
    auto s = target()->NewWritableFile(name, options, &file, dbg);
    if (s.ok()) out->reset(new filling_file(std::move(file), *this));
    return s;
  }

 private:
  struct filling_file : rocksdb::FSWritableFileOwnerWrapper {
    filling_file(std::unique_ptr<rocksdb::FSWritableFile>&& f, filling_fs& fs)
        : FSWritableFileOwnerWrapper(std::move(f)), fs(fs) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& data, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
      if (!fs.take(data.size())) return rocksdb::IOStatus::NoSpace("No space left on device (test)");
      return FSWritableFileOwnerWrapper::Append(data, o, dbg);
    }
    rocksdb::IOStatus PositionedAppend(const rocksdb::Slice& data, uint64_t offset, const rocksdb::IOOptions& o,
                                       rocksdb::IODebugContext* dbg) override {
      if (!fs.take(data.size())) return rocksdb::IOStatus::NoSpace("No space left on device (test)");
      return FSWritableFileOwnerWrapper::PositionedAppend(data, offset, o, dbg);
    }
    filling_fs& fs;
  };
  bool take(std::uint64_t n) {
    auto left = room_.load();
    do {
      if (left < n) return false;
    } while (!room_.compare_exchange_weak(left, left - n));
    return true;
  }
  std::atomic<std::uint64_t> room_;
};

// Rows of 32 floats, ids from..from+count-1 of table 0, each row's floats its id.
row_write rows_of(std::uint64_t seq, std::uint64_t from, std::uint64_t count) {
  row_write w{seq, {}, {}};
  for (std::uint64_t id = from; id < from + count; ++id) {
    w.keys.push_back({0, id});
    w.rows.insert(w.rows.end(), 32, static_cast<float>(id));
  }
  return w;
}

}  // namespace

TEST_CASE("row disk: a full disk is an error naming the store's path; rows written before it still read back") {
  scratch_dir scratch;
  const auto& dir = scratch.path;
  if (!scratch.holds_disk_tier()) return;
  auto fs = std::make_shared<filling_fs>(std::uint64_t{8} << 20);  // 8 MiB of room
  auto env = rocksdb::NewCompositeEnv(fs);
  row_disk disk(dir.string(), "full", {32}, env.get());
  std::string error;
  std::uint64_t written = 0;
  for (std::uint64_t seq = 1; seq <= 40 && error.empty(); ++seq) {  // 40 x 4 MiB: far more than fits
    try {
      disk.write(rows_of(seq, written, 32768));
      written += 32768;
      if (seq % 4 == 0) disk.flush();
    } catch (const bad_request& e) {
      error = e.what();
    }
  }
  INFO(error);
  CHECK(error.find("disk tier at " + disk.path()) == 0);
  CHECK(error.find("No space left on device") != std::string::npos);
  REQUIRE(written > 0);
  std::vector<std::uint8_t> found;
  std::vector<float> rows;
  std::vector<std::uint64_t> pushed;
  disk.read({{0, 0}, {0, written - 1}}, found, rows, pushed);
  CHECK(found == std::vector<std::uint8_t>{1, 1});
  CHECK(rows.at(32) == static_cast<float>(written - 1));
}

TEST_CASE("row disk: a corrupt store file is an error naming the store's path, not a wrong row") {
  scratch_dir scratch;
  const auto& dir = scratch.path;
  if (!scratch.holds_disk_tier()) return;
  row_disk disk(dir.string(), "corrupt", {32});
  disk.write(rows_of(1, 0, 65536));
  disk.flush();
  std::size_t damaged = 0;
  for (const auto& e : std::filesystem::directory_iterator(disk.path())) {
    if (e.path().extension() != ".sst") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (std::uint64_t at = 4096; at + 64 < e.file_size() / 2; at += 4096) {  // one byte in each early block
      f.seekp(static_cast<std::streamoff>(at + 100));
      f.put('\x5a');
    }
    ++damaged;
  }
  REQUIRE(damaged > 0);
  std::vector<row_key> keys;
  for (std::uint64_t id = 0; id < 65536; ++id) keys.push_back({0, id});
  std::vector<std::uint8_t> found;
  std::vector<float> rows;
  std::vector<std::uint64_t> pushed;
  CHECK_THROWS_WITH_AS(disk.read(keys, found, rows, pushed), doctest::Contains(("disk tier at " + disk.path()).c_str()),
                       bad_request);
}

namespace {

// A random push of 1 to 3 rows (shared ones and worker w's own) of a random table.
struct row_push {
  std::uint32_t table;
  std::vector<std::uint64_t> ids;
  std::vector<float> grads;
};
row_push random_push(std::mt19937_64& rng, std::uint32_t worker) {
  row_push p{static_cast<std::uint32_t>(rng() % 2), {}, {}};
  for (int i = 0; i < 3; ++i) {
    auto id = rng() % 2 ? rng() % 8 : 100 + worker * 50 + rng() % 20;
    if (std::find(p.ids.begin(), p.ids.end(), id) == p.ids.end()) p.ids.push_back(id);
  }
  p.grads.resize(p.ids.size() * (p.table == 0 ? 4 : 3));
  for (auto& g : p.grads) g = static_cast<float>(rng() % 7) - 3.0f;
  return p;
}

}  // namespace

TEST_CASE("handoff from a tiered store: its disk's scans take only rows it owned until then, not rows left over there; rows a copy drops stop counting") {
  auto config = tiered_shard(1 << 20, infinite_staleness);
  config.shard_ids = {0, 1};
  shard_core core(config);
  const auto before = core.map();
  const auto after = before.with_shard(2);
  shard_effects fx;
  core.hand_off(after, fx);
  REQUIRE(fx.moves.size() == 2);
  int moved = 0, left_over = 0, kept = 0;
  for (std::uint64_t id = 0; id < 3000; ++id) {
    const bool mine = before.row_owner(0, id) == 0, stays = after.row_owner(0, id) == 0;
    const bool picked = fx.moves[0].moves(id);
    CHECK(picked == (mine && !stays));
    moved += picked;
    left_over += !mine && after.row_owner(0, id) != 0;  // another's before and after: never picked
    kept += mine && stays;
  }
  CHECK(moved > 0);
  CHECK(left_over > 0);
  CHECK(kept > 0);
  // A copy deletes what it kept of the change once it is over: those rows stop counting.
  core.filled_on_disk(0, 50);
  core.dropped_from_disk(0, 20);
  CHECK(core.rows().live_rows().at(0) == 30);
  CHECK(core.rows().rows_live() == 30);
  CHECK(core.rows().stats().moved == 20);
}

namespace {

// A tiered giver (shard 0, alone in the map) and a newcomer (shard 1) it hands rows to,
// beside an all-in-RAM twin that takes every push whole: what each row must end at.
struct tiered_handoff_rig {
  std::uint64_t budget = 6 * sparse_table(emb(4, "adagrad")).row_bytes();
  shard_core giver{tiered_shard(budget, infinite_staleness)}, in_ram{tiered_shard(0, infinite_staleness)};
  shard_core taker{newcomer(budget)};
  partitioner after = giver.map().with_shard(1);
  disk_driver from{giver, {}, {}, {}}, to{taker, {}, {}, {}};
  std::mt19937_64 rng;
  std::uint64_t seq = 0;
  std::uint64_t pull_token = 500;

  explicit tiered_handoff_rig(std::uint64_t seed = 5) : rng(seed) {}
  // The giver's disk tier pinned, as the shard asks it when a copy ahead begins: the RAM
  // tier's changed rows as they are now, written by the I/O writer behind the writes asked
  // before (reads under way land meanwhile). What the pin holds.
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<float>> pin_giver() {
    auto changed = giver.rows().dirty_rows();
    for (auto before = from.pending.size(); before > 0; --before) from.step();  // later work follows the pin
    from.disk.write(changed, [&](std::uint32_t t) { return giver.rows().table(t).stride(); });
    return from.disk.rows;
  }

  // A push applied to the giver (whose map has no other shard) and its twin as one
  // request, kept to be forwarded to a copy once it holds its seed.
  using forwarded_push = std::pair<shard_request, row_push>;
  forwarded_push push_to_forward(std::uint32_t worker, row_push p) {
    shard_request r{1, worker, 0, ++seq, 0};
    REQUIRE(in_ram.push_rows(r, p.table, p.ids, p.grads.data(), p.grads.size()).ok());
    from.take(giver.push_rows(r, p.table, p.ids, p.grads.data(), p.grads.size()));
    return {r, std::move(p)};
  }
  static void forward(disk_driver& copy, const std::vector<forwarded_push>& pushes) {
    for (const auto& [r, p] : pushes) copy.take(copy.core.push_rows(r, p.table, p.ids, p.grads.data(), p.grads.size()));
  }

  static shard_config newcomer(std::uint64_t budget) {
    auto c = tiered_shard(budget, infinite_staleness);
    c.id = 1;
    c.epoch = 2;
    c.shard_ids = {0, 1};
    return c;
  }
  // A random push, split by `map` as a client splits it; returns it whole.
  row_push push(const partitioner& map, std::uint32_t worker) { return push(map, worker, random_push(rng, worker)); }
  row_push push(const partitioner& map, std::uint32_t worker, row_push p) {
    shard_request r{map.epoch(), worker, 0, ++seq, 0};
    REQUIRE(in_ram.push_rows({1, worker, 0, seq, 0}, p.table, p.ids, p.grads.data(), p.grads.size()).ok());
    std::map<std::uint32_t, row_push> parts;
    for (std::size_t i = 0; i < p.ids.size(); ++i) {
      auto& part = parts.try_emplace(map.row_owner(p.table, p.ids[i]), row_push{p.table, {}, {}}).first->second;
      const auto dim = p.grads.size() / p.ids.size();
      part.ids.push_back(p.ids[i]);
      part.grads.insert(part.grads.end(), p.grads.begin() + i * dim, p.grads.begin() + (i + 1) * dim);
    }
    for (auto& [owner, part] : parts)
      (owner == 0 ? from : to).take((owner == 0 ? giver : taker).push_rows(r, part.table, part.ids, part.grads.data(), part.grads.size()));
    return p;
  }
  // Disk work done at random moments, as an I/O actor's.
  void some_disk_work() {
    for (auto* d : {&from, &to})
      while (d->pending.size() > 3 || (!d->pending.empty() && rng() % 3 == 0)) d->step();
  }
  void all_disk_work() {
    for (auto* d : {&from, &to})
      while (!d->pending.empty()) d->step();
  }
  // A chain of two (the giver and a copy it seeded): every push from now on reaches both;
  // then every row of each, and their counts, are exactly as in RAM.
  void check_chain_exact(disk_driver& head, disk_driver& copy, const std::vector<std::uint64_t>& also = {}) {
    for (int step = 0; step < 100; ++step) {
      auto p = random_push(rng, step % 2);
      shard_request r{1, step % 2u, 0, ++seq, 0};
      REQUIRE(in_ram.push_rows(r, p.table, p.ids, p.grads.data(), p.grads.size()).ok());
      for (auto* d : {&head, &copy}) {
        d->take(d->core.push_rows(r, p.table, p.ids, p.grads.data(), p.grads.size()));
        while (d->pending.size() > 3 || (!d->pending.empty() && rng() % 3 == 0)) d->step();
      }
    }
    for (auto* d : {&head, &copy})
      while (!d->pending.empty()) d->step();
    std::vector<std::uint64_t> checked{0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 105, 110, 119, 150, 151, 160, 169, 300, 302, 400, 401, 500, 501};
    checked.insert(checked.end(), also.begin(), also.end());
    for (std::uint32_t table = 0; table < 2; ++table)
      for (auto id : checked) {
        CAPTURE(table);
        CAPTURE(id);
        auto token = ++pull_token;
        REQUIRE(in_ram.pull_rows({1, 0, 0, 0}, table, {id}, token, {}).answer.size() == 1);
        auto expected = in_ram.take_row_values(token);
        for (auto* d : {&head, &copy}) {
          d->take(d->core.pull_rows({1, 0, 0, 0}, table, {id}, token, {}));
          while (!d->pending.empty()) d->step();
          REQUIRE(d->answers.count(token) == 1);
          CHECK(d->answers[token] == expected);
        }
      }
    for (auto* d : {&head, &copy}) CHECK(d->core.rows().rows_live() == in_ram.rows().rows_live());
  }
  // After the change and more pushes: every row where the new map says, exactly as in
  // RAM, counted once; none left on the giver's disk.
  void check_rows_exact() {
    for (int step = 0; step < 200; ++step) {
      push(after, step % 2);
      some_disk_work();
    }
    all_disk_work();
    for (const auto& [key, row] : from.disk.rows) CHECK(after.row_owner(key.first, key.second) == 0);
    for (std::uint32_t table = 0; table < 2; ++table)
      for (std::uint64_t id : {0, 1, 2, 3, 4, 5, 6, 7, 100, 101, 105, 110, 119, 150, 151, 160, 169}) {
        CAPTURE(table);
        CAPTURE(id);
        const auto owner = after.row_owner(table, id);
        auto& core = owner == 0 ? giver : taker;
        auto& drive = owner == 0 ? from : to;
        auto token = ++pull_token;
        REQUIRE(in_ram.pull_rows({1, 0, 0, 0}, table, {id}, token, {}).answer.size() == 1);
        auto expected = in_ram.take_row_values(token);
        drive.take(core.pull_rows({2, 0, 0, 0}, table, {id}, token, {}));
        while (!drive.pending.empty()) drive.step();
        REQUIRE(drive.answers.count(token) == 1);
        CHECK(drive.answers[token] == expected);
      }
    CHECK(giver.rows().rows_live() + taker.rows().rows_live() == in_ram.rows().rows_live());
    for (std::uint32_t table = 0; table < 2; ++table)
      CHECK(giver.rows().live_rows().at(table) + taker.rows().live_rows().at(table) ==
            in_ram.rows().live_rows().at(table));
    CHECK(giver.rows().stats().moved > 0);
  }
};

// A push of 1 to every row of each table that the tail holds in RAM and `on_disk` holds
// too, applied to the tail and its all-in-RAM twin; what a copy gets forwarded.
std::vector<tiered_handoff_rig::forwarded_push> push_to_held_rows(
    tiered_handoff_rig& rig, const std::map<std::pair<std::uint32_t, std::uint64_t>, std::vector<float>>& on_disk) {
  std::vector<tiered_handoff_rig::forwarded_push> forwarded;
  for (std::uint32_t table = 0; table < 2; ++table) {
    row_push p{table, {}, {}};
    for (const auto& [key, row] : on_disk)
      if (key.first == table && rig.giver.rows().table(table).holds(key.second)) p.ids.push_back(key.second);
    if (p.ids.empty()) continue;
    p.grads.assign(p.ids.size() * (table == 0 ? 4 : 3), 1.0f);
    forwarded.push_back(rig.push_to_forward(0, std::move(p)));
  }
  return forwarded;
}

}  // namespace

TEST_CASE("handoff from a tiered store: rows in RAM, on disk, being written or read, and queued pushes reach the new owner exactly") {
  tiered_handoff_rig rig;
  auto& from = rig.from;
  auto& to = rig.to;
  for (int step = 0; step < 200; ++step) {
    rig.push(rig.giver.map(), step % 2);
    while (from.pending.size() > 3 || (!from.pending.empty() && rig.rng() % 3 == 0)) from.step();
  }
  REQUIRE(!from.pending.empty());  // writes and reads under way
  // A push of rows that move and are not in RAM: it waits for their reads when the map
  // changes, so it travels as a deferred push and the reads are dropped when they land.
  std::vector<std::uint64_t> cold;
  for (std::uint64_t id = 100; id < 220; ++id)
    if (rig.after.row_owner(0, id) == 1 && !rig.giver.rows().table(0).holds(id)) cold.push_back(id);
  REQUIRE(!cold.empty());
  std::vector<float> twos(cold.size() * 4, 2.0f);
  const auto seq = ++rig.seq;
  REQUIRE(rig.in_ram.push_rows({1, 0, 0, seq, 0}, 0, cold, twos.data(), twos.size()).ok());
  auto queued = rig.giver.push_rows({1, 0, 0, seq, 0}, 0, cold, twos.data(), twos.size());
  REQUIRE(queued.queued_push);
  const auto ack = *queued.queued_push;
  from.take(std::move(queued));
  const auto pull_token = rig.pull_token;
  from.take(rig.giver.pull_rows({1, 0, 0, 0}, 0, {0, 1, 2, 3, 4, 5, 6, 7}, pull_token, {}));
  shard_effects fx;
  auto parts = rig.giver.hand_off(rig.after, fx);
  CHECK(std::count(fx.applied.begin(), fx.applied.end(), ack) == 1);  // all of it moved: acknowledged
  CHECK(fx.drops.empty());  // not copied ahead: the scans take every moved row
  from.take(std::move(fx));
  while (!from.pending.empty()) from.step();
  // The pages first, then the parts, as the shard actor sends them.
  CHECK(!from.moved.empty());
  for (const auto& h : from.moved) {
    CHECK(h.rows_only);
    CHECK_FALSE(h.again);
    to.take(rig.taker.take_over(h));
  }
  for (const auto& h : parts) to.take(rig.taker.take_over(h));
  CHECK((from.failed == std::vector<std::uint64_t>{pull_token} || from.answers.count(pull_token) == 1));
  rig.check_rows_exact();
}

TEST_CASE("handoff from a tiered store copied ahead: the moved rows go while it serves; the cut sends only those changed since (from RAM, or by id from disk), and every row ends exact, counted once") {
  tiered_handoff_rig rig;
  auto& from = rig.from;
  auto& to = rig.to;
  auto& giver = rig.giver;
  for (int step = 0; step < 200; ++step) {
    rig.push(giver.map(), step % 2);
    rig.some_disk_work();
  }
  // The precopy: its pin lands after the writes asked before, with the RAM tier's changed
  // rows written; the pinned store's pages of moved rows go to the taker.
  while (!from.pending.empty()) from.step();  // asked before the pin
  giver.begin_precopy(rig.after);
  from.disk.write(giver.rows().dirty_rows(), [&](std::uint32_t t) { return giver.rows().table(t).stride(); });
  const auto pinned = from.disk.rows;
  std::uint64_t copied = 0;
  for (std::uint32_t table = 0; table < 2; ++table)
    for (moved_page page{table, {}, {}, true, 0}; page.more;) {
      page = fake_disk::page_of(pinned, table, page.next);
      for (const auto& h : giver.precopy_page(page)) {
        CHECK(h.to == 1);
        CHECK(h.rows_only);
        copied += h.rows.front().ids.size();
        to.take(rig.taker.take_over(h));
      }
    }
  CHECK(copied > 0);
  // Serving goes on under the old map meanwhile: the moved rows it changes are noted.
  // Few of them are read by id at the cut, many found by scanning the moved rows.
  int pushes = 0;
  SUBCASE("a few pushes meanwhile") { pushes = 2; }
  SUBCASE("many pushes meanwhile") { pushes = 60; }
  CAPTURE(pushes);
  std::set<std::pair<std::uint32_t, std::uint64_t>> changed;
  for (int step = 0; step < pushes; ++step) {
    auto p = rig.push(giver.map(), step % 2);
    for (auto id : p.ids)
      if (rig.after.row_owner(p.table, id) == 1) changed.insert({p.table, id});
    rig.some_disk_work();
  }
  // Rows created meanwhile (never pinned): they go at the cut too, counted as new there.
  row_push fresh{0, {}, {}};
  for (std::uint64_t id = 300; fresh.ids.size() < 4; ++id)
    if (rig.after.row_owner(0, id) == 1) {
      fresh.ids.push_back(id);
      changed.insert({0, id});
    }
  fresh.grads.assign(fresh.ids.size() * 4, 1.5f);
  rig.push(giver.map(), 0, fresh);
  rig.all_disk_work();  // their reads find nothing: created
  REQUIRE(!changed.empty());
  giver.precopied();
  shard_effects fx;
  auto parts = giver.hand_off(rig.after, fx);
  // Per table, the changed rows taken by id and the rest deleted after the cut, or all
  // taken by a scan.
  const auto scans = std::count_if(fx.moves.begin(), fx.moves.end(), [](const disk_move& m) { return m.listed.empty(); });
  CHECK(fx.drops.size() + scans == 2);
  if (pushes == 2) CHECK(fx.drops.size() > 0);
  if (pushes == 60) CHECK(scans > 0);
  from.take(std::move(fx));
  while (!from.pending.empty()) from.step();
  std::set<std::pair<std::uint32_t, std::uint64_t>> sent;
  auto take = [&](const shard_handoff& h) {
    for (const auto& t : h.rows)
      for (auto id : t.ids) CHECK(sent.insert({t.table, id}).second);
    to.take(rig.taker.take_over(h));
  };
  for (const auto& h : from.moved) take(h);  // taken by id from its disk
  for (const auto& h : parts) take(h);       // from RAM, then the last parts
  CHECK(sent == changed);  // exactly the rows changed since the precopy began
  CHECK(sent.size() < copied);
  rig.check_rows_exact();
}

TEST_CASE("a tiered tail seeds a new copy ahead: pinned pages while it acknowledges alone, then the rows changed since, pushes queued behind reads and the rest; the copy ends exact, counted once") {
  tiered_handoff_rig rig;
  auto& tail = rig.giver;
  auto& from = rig.from;
  shard_core copy(tiered_shard(rig.budget, infinite_staleness));
  disk_driver to_copy{copy, {}, {}, {}};
  for (int step = 0; step < 200; ++step) {
    rig.push(tail.map(), step % 2);
    rig.some_disk_work();
  }
  tail.begin_seed_copy();
  const auto pinned = rig.pin_giver();
  for (std::uint32_t table = 0; table < 2; ++table)
    for (moved_page page{table, {}, {}, true, 0}; page.more;) {
      page = fake_disk::page_of(pinned, table, page.next);
      if (!page.ids.empty()) to_copy.take(copy.take_over(tail.seed_rows(page)));
    }
  // The tail acknowledges alone meanwhile: these pushes reach the copy only as changed
  // rows (few: read by id; many: found by scanning the table).
  int pushes = 0;
  SUBCASE("a few pushes meanwhile") { pushes = 2; }
  SUBCASE("many pushes meanwhile") { pushes = 60; }
  CAPTURE(pushes);
  for (int step = 0; step < pushes; ++step) {
    rig.push(tail.map(), step % 2);
    rig.some_disk_work();
  }
  row_push fresh{0, {300, 301, 302}, std::vector<float>(12, 0.5f)};  // created after the pin
  rig.push(tail.map(), 0, fresh);
  // Rows another shard hands over meanwhile (a leaver's pages copied ahead): the copy is
  // not this tail's successor yet, so they reach it only as changed rows.
  shard_handoff handed{1, 0, tail.map().epoch(), {}, {table_rows{0, 8, {500, 501}, std::vector<float>(16, 0.25f)}},
                       {}, {}, {}, 0};
  handed.rows_only = true;
  rig.in_ram.take_over(handed);
  from.take(tail.take_over(handed));
  while (!from.pending.empty()) from.step();
  // A push queued behind reads at the moment of the seed: applied here later, by the copy
  // from the seed's deferred pushes.
  const std::vector<std::uint64_t> cold{400, 401};
  std::vector<float> ones(cold.size() * 4, 1.0f);
  ++rig.seq;
  REQUIRE(rig.in_ram.push_rows({1, 0, 0, rig.seq, 0}, 0, cold, ones.data(), ones.size()).ok());
  auto queued = tail.push_rows({1, 0, 0, rig.seq, 0}, 0, cold, ones.data(), ones.size());
  REQUIRE(queued.queued_push);
  from.take(std::move(queued));
  // The moment of the seed: what the I/O writer was asked before it comes first.
  std::vector<disk_move> listed;
  auto parts = tail.seed_changes(listed);
  auto whole = tail.whole_copy();
  CHECK(whole.deferred.size() == 1);
  for (auto before = from.pending.size(); before > 0; --before) from.step();
  const auto pinned_again = from.disk.rows;  // the second pin, behind those
  // Pushes after the moment, to rows held in RAM then that the pinned disk also holds (an
  // older version): applied here, and at the copy only once it holds its seed (forwarded
  // in order). The changed rows' pages must carry neither them nor those older versions.
  auto forwarded = push_to_held_rows(rig, pinned_again);
  REQUIRE(!forwarded.empty());
  std::uint64_t resent = 0;
  const auto scans = std::count_if(listed.begin(), listed.end(), [](const disk_move& m) { return m.listed.empty(); });
  if (pushes == 2) CHECK(scans < static_cast<std::ptrdiff_t>(listed.size()));
  if (pushes == 60) CHECK(scans > 0);
  for (auto m : listed) {
    CHECK(m.keep);
    for (bool more = true; more;) {  // by id, or scanning the table (many changed)
      auto page = m.listed.empty() ? fake_disk::page_of(pinned_again, m.table, m.from) : from.disk.take_moved(m);
      for (auto& h : tail.seed_changed(page)) parts.push_back(std::move(h));
      more = page.more;
      m.from = page.next;
    }
  }
  for (const auto& h : parts) {
    for (const auto& t : h.rows) resent += t.ids.size();
    to_copy.take(copy.take_over(h));
  }
  to_copy.take(copy.take_over(whole));
  rig.forward(to_copy, forwarded);
  tail.end_precopy();
  CHECK(resent > 0);
  CHECK(resent < tail.rows().rows_live());
  rig.check_chain_exact(from, to_copy);
}

namespace {

// What goes on at a tiered tail while it seeds a copy ahead, one random step of it: a
// push (acknowledged alone), rows handed over by another shard (next_handed: their ids),
// or some of its disk work.
void seed_window_step(tiered_handoff_rig& rig, std::uint64_t& next_handed) {
  switch (rig.rng() % 4) {
    case 0:
    case 1:
      rig.push(rig.giver.map(), static_cast<std::uint32_t>(rig.rng() % 2));
      return;
    case 2: {
      shard_handoff handed{1, 0, rig.giver.map().epoch(), {}, {}, {}, {}, {}, 0};
      handed.rows_only = true;
      handed.rows.push_back({0, 8, {next_handed, next_handed + 1}, std::vector<float>(16, 0.5f)});
      next_handed += 2;
      rig.in_ram.take_over(handed);
      rig.from.take(rig.giver.take_over(handed));
      return;
    }
    default:
      rig.some_disk_work();
  }
}

}  // namespace

TEST_CASE("a tiered tail seeds a copy ahead under 60 random interleavings of pushes, handed rows, evictions and reads, "
          "before and after its moment; the copy ends exact, counted once") {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    CAPTURE(seed);
    tiered_handoff_rig rig(seed);
    auto& tail = rig.giver;
    auto& from = rig.from;
    shard_core copy(tiered_shard(rig.budget, infinite_staleness));
    disk_driver to_copy{copy, {}, {}, {}};
    std::uint64_t next_handed = 500;
    for (auto steps = 20 + rig.rng() % 100; steps > 0; --steps) seed_window_step(rig, next_handed);
    tail.begin_seed_copy();
    const auto pinned = rig.pin_giver();
    for (std::uint32_t table = 0; table < 2; ++table)
      for (moved_page page{table, {}, {}, true, 0}; page.more;) {
        page = fake_disk::page_of(pinned, table, page.next);
        if (!page.ids.empty()) to_copy.take(copy.take_over(tail.seed_rows(page)));
        for (auto steps = rig.rng() % 4; steps > 0; --steps) seed_window_step(rig, next_handed);
      }
    // The moment: the copy becomes the successor; what the writer was asked before it
    // lands before the second pin, from which the changed rows on disk are read later.
    std::vector<disk_move> listed;
    auto parts = tail.seed_changes(listed);
    auto whole = tail.whole_copy();
    for (auto before = from.pending.size(); before > 0; --before) from.step();
    fake_disk pinned_again = from.disk;
    // From now on updates reach the copy forwarded, after the seed, in order.
    std::vector<tiered_handoff_rig::forwarded_push> forwarded;
    auto push_forwarded = [&] {
      const auto worker = static_cast<std::uint32_t>(rig.rng() % 2);
      forwarded.push_back(rig.push_to_forward(worker, random_push(rig.rng, worker)));
      rig.some_disk_work();
    };
    for (auto m : listed)
      for (bool more = true; more;) {
        auto page = m.listed.empty() ? fake_disk::page_of(pinned_again.rows, m.table, m.from) : pinned_again.take_moved(m);
        for (auto& h : tail.seed_changed(page)) parts.push_back(std::move(h));
        more = page.more;
        m.from = page.next;
        if (rig.rng() % 2) push_forwarded();
      }
    for (const auto& h : parts) to_copy.take(copy.take_over(h));
    to_copy.take(copy.take_over(whole));
    rig.forward(to_copy, forwarded);
    tail.end_precopy();
    std::vector<std::uint64_t> handed;
    for (auto id = std::uint64_t{500}; id < next_handed; ++id) handed.push_back(id);
    rig.check_chain_exact(from, to_copy, handed);
  }
}

TEST_CASE("handoff from a tiered store copied ahead under 60 random interleavings of pushes, evictions and reads "
          "between its pages and at its cut; every row ends exact, counted once") {
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    CAPTURE(seed);
    tiered_handoff_rig rig(seed);
    auto& giver = rig.giver;
    auto serve = [&](std::uint64_t steps) {  // under the old map, while it copies ahead
      for (; steps > 0; --steps) {
        rig.push(giver.map(), static_cast<std::uint32_t>(rig.rng() % 2));
        rig.some_disk_work();
      }
    };
    serve(20 + rig.rng() % 100);
    giver.begin_precopy(rig.after);
    const auto pinned = rig.pin_giver();
    for (std::uint32_t table = 0; table < 2; ++table)
      for (moved_page page{table, {}, {}, true, 0}; page.more;) {
        page = fake_disk::page_of(pinned, table, page.next);
        for (const auto& h : giver.precopy_page(page)) rig.to.take(rig.taker.take_over(h));
        serve(rig.rng() % 4);
      }
    giver.precopied();
    shard_effects fx;  // the cut, with reads and writes still under way
    auto parts = giver.hand_off(rig.after, fx);
    rig.from.take(std::move(fx));
    while (!rig.from.pending.empty()) rig.from.step();
    for (const auto& h : rig.from.moved) rig.to.take(rig.taker.take_over(h));
    for (const auto& h : parts) rig.to.take(rig.taker.take_over(h));
    rig.check_rows_exact();
  }
}
