// Handing keys and rows over when the map changes (libps/core/handoff.hpp, shard_core's
// hand_off and take_over): a third shard joins two, and every key and row ends on its new
// owner with its value and optimizer state, its deferred pushes, the givers' clocks and
// their record of applied pushes; the givers refuse what moved.
#include <doctest/doctest.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "libps/core/handoff.hpp"
#include "libps/keys/keys.hpp"
#include "libps/core/shard_core.hpp"
#include "libps/persist/handoff_codec.hpp"

using namespace ps;

namespace {

using time_point = shard_core::time_point;
const time_point t0{};
constexpr std::uint64_t num_keys = 4096;  // 1024 buckets of 4 keys
constexpr std::uint32_t bits = 2;

partitioner map_of_shards(std::uint64_t epoch, std::vector<std::uint32_t> ids) {
  return partitioner(epoch, std::move(ids), partitioner::default_vnodes, bits);
}

shard_config shard(std::uint32_t id, std::uint64_t epoch, std::vector<std::uint32_t> ids, std::uint64_t staleness) {
  shard_config c;
  c.id = id;
  c.epoch = epoch;
  c.shard_ids = std::move(ids);
  c.bucket_bits = bits;
  c.num_workers = 2;
  c.staleness = staleness;
  c.rule.kind = "sgd";  // one slot of optimizer state per key: it must travel too
  c.rule.lr = 1.0f;
  c.rule.momentum = 0.5f;
  sparse_table_spec t;
  t.name = "emb";
  t.dim = 2;
  t.init_scale = 0;
  c.tables = {t};
  return c;
}

// Two shards of one map, every key set to its own number.
struct two_and_a_newcomer {
  partitioner before = map_of_shards(1, {0, 1});
  partitioner after = before.with_shard(2);
  std::vector<std::unique_ptr<shard_core>> cores;
  std::uint64_t seq = 1;

  explicit two_and_a_newcomer(std::uint64_t staleness) {
    cores.push_back(std::make_unique<shard_core>(shard(0, 1, {0, 1}, staleness)));
    cores.push_back(std::make_unique<shard_core>(shard(1, 1, {0, 1}, staleness)));
    cores.push_back(std::make_unique<shard_core>(shard(2, 2, {0, 1, 2}, staleness)));
    for (const auto& p : before.split(key_set::single({0, num_keys}))) {
      std::vector<float> v;
      for (auto k = p.keys.begin; k < p.keys.end; ++k) v.push_back(static_cast<float>(k));
      REQUIRE(cores[p.shard]->init({1, 0, 0, seq++}, {p.keys}, v.data(), v.size()).ok());
    }
  }
  // Worker w's push of `g` on every key, at clock c, under `map` (sgd, lr 1: value -= g).
  // One request per shard, as a client sends it (one sequence number per request).
  void push_all(const partitioner& map, std::uint32_t w, std::uint64_t c, float g, std::uint64_t s) {
    std::map<std::uint32_t, std::vector<key_range>> ranges;
    for (const auto& p : map.split(key_set::single({0, num_keys}))) ranges[p.shard].push_back(p.keys);
    for (const auto& [shard, rs] : ranges) {
      std::uint64_t n = 0;
      for (const auto& r : rs) n += r.size();
      std::vector<float> grads(n, g);
      auto fx = cores[shard]->push({map.epoch(), w, c, s}, rs, grads.data(), grads.size());
      REQUIRE(fx.error == "");
    }
  }
  std::vector<shard_handoff> hand_off(std::uint32_t from, shard_effects& fx) {
    return cores[from]->hand_off(after, fx);
  }
  float value(std::uint32_t shard, key_type k) const {
    float v = 0;
    cores[shard]->store().pull({{k, k + 1}}, &v, 1);
    return v;
  }
};

}  // namespace

TEST_CASE("handoff: segments split by new owner at bucket boundaries, values and state alike") {
  auto before = map_of_shards(1, {0, 1});
  auto after = before.with_shard(2);
  stored_segment s{0, 64, {}, {}};
  for (key_type k = 0; k < 64; ++k) s.values.push_back(static_cast<float>(k));
  for (std::size_t slot = 0; slot < 2; ++slot)
    for (key_type k = 0; k < 64; ++k) s.state.push_back(static_cast<float>(1000 * (slot + 1) + k));
  auto parts = split_by_owner({s}, after, 2);
  std::uint64_t covered = 0;
  for (const auto& [owner, segs] : parts)
    for (const auto& p : segs) {
      CHECK(p.begin % 4 == 0);
      covered += p.end - p.begin;
      for (auto k = p.begin; k < p.end; ++k) {
        CHECK(after.owner(k) == owner);
        CHECK(p.values[k - p.begin] == static_cast<float>(k));
        CHECK(p.state[k - p.begin] == static_cast<float>(1000 + k));                      // slot 0
        CHECK(p.state[(p.end - p.begin) + (k - p.begin)] == static_cast<float>(2000 + k));  // slot 1
      }
    }
  CHECK(covered == 64);
  stored_segment bad{0, 4, {1, 2, 3}, {}};
  CHECK_THROWS_WITH_AS(split_by_owner({bad}, after, 0), doctest::Contains("holds 3 values"), bad_request);
}

TEST_CASE("handoff: a third shard joins two; about a third of the keys move, each with its value and state") {
  two_and_a_newcomer c(infinite_staleness);
  c.push_all(c.before, 0, 0, 1.0f, 1000);  // every key: k - 1, velocity 1
  std::uint64_t moved = 0;
  for (std::uint32_t from = 0; from < 2; ++from) {
    shard_effects fx;
    auto handoffs = c.hand_off(from, fx);
    REQUIRE(handoffs.size() == 1);  // everything that moves goes to the newcomer
    CHECK(handoffs[0].to == 2);
    for (const auto& s : handoffs[0].segments) moved += s.end - s.begin;
    CHECK(c.cores[2]->take_over(handoffs[0]).ok());
    CHECK(c.cores[from]->epoch() == 2);
  }
  // The target: at most 1.25 x 1/(n+1) of the keys move when a third shard joins.
  CHECK(moved > 0);
  CHECK(static_cast<double>(moved) <= 1.25 * num_keys / 3.0);
  for (key_type k = 0; k < num_keys; ++k) CHECK(c.value(c.after.owner(k), k) == static_cast<float>(k) - 1.0f);
  // The velocity travelled: the next push of 1 moves every key by 1.5 (sgd: v = 0.5 v + g, w -= v).
  c.push_all(c.after, 0, 1, 1.0f, 1001);
  for (key_type k = 0; k < num_keys; k += 97) CHECK(c.value(c.after.owner(k), k) == static_cast<float>(k) - 2.5f);
  // A giver refuses what it gave away, naming the new owner.
  key_type gone = 0;
  while (c.after.owner(gone) != 2 || c.before.owner(gone) != 0) gone += 4;
  std::vector<float> one{1.0f};
  CHECK_FALSE(c.cores[0]->owns({{gone, gone + 1}}));
  CHECK(c.cores[2]->owns({{gone, gone + 1}}));
  auto refused = c.cores[0]->push({2, 1, 1, 5000}, {{gone, gone + 1}}, one.data(), 1);
  CHECK(refused.error.find("belong to shard 2") != std::string::npos);
}

TEST_CASE("handoff: a push applied before the move and sent again after it is not applied twice") {
  two_and_a_newcomer c(infinite_staleness);
  key_type k = 0;
  while (c.after.owner(k) != 2) k += 4;
  auto giver = c.before.owner(k);
  std::vector<float> g{1.0f};
  REQUIRE(c.cores[giver]->push({1, 1, 0, 777}, {{k, k + 1}}, g.data(), 1).ok());  // applied, reply lost
  shard_effects fx;
  for (const auto& h : c.hand_off(giver, fx)) REQUIRE(c.cores[2]->take_over(h).ok());
  REQUIRE(c.cores[2]->push({2, 1, 0, 777}, {{k, k + 1}}, g.data(), 1).ok());  // the resend, by the new map
  CHECK(c.value(2, k) == static_cast<float>(k) - 1.0f);  // once
}

TEST_CASE("handoff: rows move to their new owner; deferred BSP pushes travel and apply when the clock completes") {
  two_and_a_newcomer c(0);
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 1; ids.size() < 40; ++i) ids.push_back(i * 0x9E3779B97F4A7C15ull);
  std::map<std::uint32_t, std::vector<std::uint64_t>> by_owner;
  for (auto id : ids) by_owner[c.before.row_owner(0, id)].push_back(id);
  for (auto& [owner, mine] : by_owner) {
    std::vector<float> grads(mine.size() * 2, 1.0f);
    REQUIRE(c.cores[owner]->push_rows({1, 0, 0, c.seq++}, 0, mine, grads.data(), grads.size()).ok());
  }
  // Worker 0 pushes clock 0's update of every key; worker 1 has not finished clock 0, so
  // under BSP it is deferred everywhere.
  c.push_all(c.before, 0, 0, 1.0f, 2000);
  for (std::uint32_t from = 0; from < 2; ++from) {
    shard_effects fx;
    for (const auto& h : c.hand_off(from, fx)) {
      if (!h.segments.empty()) CHECK_FALSE(h.deferred.empty());
      REQUIRE(c.cores[2]->take_over(h).ok());
    }
  }
  // Both workers finish clock 0 everywhere: the deferred pushes apply, on the newcomer too.
  for (auto& core : c.cores)
    for (std::uint32_t w = 0; w < 2; ++w) core->tick({2, w, 1, 0});
  for (auto id : ids) {
    auto owner = c.after.row_owner(0, id);
    auto pull = c.cores[owner]->pull_rows({2, 0, 1, 0}, 0, {id}, id % 1000 + 1, t0);
    REQUIRE(pull.answer.size() == 1);
    CHECK(c.cores[owner]->take_row_values(pull.answer[0]) == std::vector<float>{1.0f, 1.0f});  // 0 + 1 (sum)
  }
  for (key_type k = 0; k < num_keys; k += 61) CHECK(c.value(c.after.owner(k), k) == static_cast<float>(k) - 1.0f);
}

TEST_CASE("handoff: admission's counts travel, so an id the giver saw is admitted on the pushes it still lacked") {
  auto admitting = [](std::uint32_t id, std::uint64_t epoch, std::vector<std::uint32_t> ids) {
    auto cfg = shard(id, epoch, std::move(ids), infinite_staleness);  // ASP: pushes apply as they come
    cfg.tables[0].admit_after = 3;
    return cfg;
  };
  auto before = map_of_shards(1, {0, 1}), after = before.with_shard(2);
  shard_core giver(admitting(0, 1, {0, 1})), newcomer(admitting(2, 2, {0, 1, 2}));
  // An id shard 0 owns now and shard 2 after the join, seen twice by shard 0: not admitted.
  std::uint64_t id = 1;
  while (before.row_owner(0, id) != 0 || after.row_owner(0, id) != 2) ++id;
  std::vector<float> grads{1, 1};
  for (std::uint64_t seq = 1; seq <= 2; ++seq) REQUIRE(giver.push_rows({1, 0, 0, seq}, 0, {id}, grads.data(), 2).ok());
  REQUIRE(giver.rows().table(0).rows() == 0);
  shard_effects fx;
  auto parts = giver.hand_off(after, fx);
  auto to_newcomer = std::find_if(parts.begin(), parts.end(), [](const shard_handoff& h) { return h.to == 2; });
  REQUIRE(to_newcomer != parts.end());
  CHECK(to_newcomer->sightings == giver.rows().sightings());
  auto bytes = encode_handoff(*to_newcomer);  // they cross the wire whole
  REQUIRE(newcomer.take_over(decode_handoff(bytes)).ok());
  // The third sighting, on the new owner: admitted and applied (a fresh count would refuse it).
  REQUIRE(newcomer.push_rows({2, 0, 0, 3}, 0, {id}, grads.data(), 2).ok());
  CHECK(newcomer.rows().table(0).rows() == 1);
  // Counts of another sketch size are refused, naming them, before anything is taken.
  auto odd = *to_newcomer;
  odd.sightings.pop_back();
  shard_core other(admitting(2, 2, {0, 1, 2}));
  CHECK_THROWS_WITH_AS(other.take_over(odd), doctest::Contains("saved counters, this sketch has"), bad_request);
}

TEST_CASE("handoff: parked pulls of keys that moved fail, naming why; bad handoffs are refused") {
  two_and_a_newcomer c(0);
  key_type k = 0;
  while (c.after.owner(k) != 2 || c.before.owner(k) != 0) k += 4;
  auto parked = c.cores[0]->pull({1, 0, 1, 0}, {{k, k + 1}}, 42, t0);  // waits for clock 1 of both workers
  REQUIRE(parked.answer.empty());
  shard_effects fx;
  auto handoffs = c.hand_off(0, fx);
  REQUIRE(fx.fail.size() == 1);
  CHECK(fx.fail[0].first == 42);
  CHECK(fx.fail[0].second.find("moved to another shard (epoch 2)") != std::string::npos);
  CHECK_THROWS_WITH_AS(c.cores[0]->hand_off(c.after, fx), doctest::Contains("needs a newer map than epoch 2"),
                       bad_request);
  CHECK_THROWS_WITH_AS(c.cores[1]->take_over(handoffs[0]), doctest::Contains("a handoff for shard 2"), bad_request);
}

TEST_CASE("handoff: one crosses the wire as bytes and comes back whole; corrupt bytes are refused by name") {
  two_and_a_newcomer c(0);
  c.push_all(c.before, 0, 0, 1.0f, 3000);  // deferred under BSP: they travel too
  shard_effects fx;
  auto handoffs = c.hand_off(0, fx);
  REQUIRE(handoffs.size() == 1);
  auto bytes = encode_handoff(handoffs[0]);
  auto back = decode_handoff(bytes);
  CHECK(back.from == 0);
  CHECK(back.to == 2);
  CHECK(back.epoch == 2);
  CHECK(back.segments.size() == handoffs[0].segments.size());
  CHECK(back.deferred.size() == handoffs[0].deferred.size());
  CHECK(back.clocks == handoffs[0].clocks);
  CHECK(back.applied.seen(0, 3000));
  CHECK(encode_handoff(back) == bytes);
  auto flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x20;
  CHECK_THROWS_WITH_AS(decode_handoff(flipped), doctest::Contains("checksum"), bad_request);
  CHECK_THROWS_WITH_AS(decode_handoff(bytes.substr(0, 3)), doctest::Contains("does not start as one"), bad_request);
}

TEST_CASE("handoff: a newcomer hears from every giver, even one that gives it nothing") {
  two_and_a_newcomer c(0);
  auto tiny = map_of_shards(1, {0});  // one shard holds everything
  shard_core alone(shard(0, 1, {0}, 0));
  shard_effects fx;
  auto handoffs = alone.hand_off(tiny.with_shard(1), fx);
  REQUIRE(handoffs.size() == 1);
  CHECK(handoffs[0].to == 1);
  CHECK(handoffs[0].clocks.size() == 2);
}

TEST_CASE("handoff: a giver's part sent again by its chain's new head counts once") {
  two_and_a_newcomer c(infinite_staleness);
  c.push_all(c.before, 0, 0, 1.0f, 1000);
  key_type k = 0;
  while (c.after.owner(k) != 2) k += 4;
  auto giver = c.before.owner(k);
  // The giver's copy adopts the same map and keeps the same part (its head then dies).
  shard_core copy(shard(giver, 1, {0, 1}, infinite_staleness));
  for (const auto& seg : c.cores[giver]->store().snapshot()) {
    REQUIRE(copy.init({1, 0, 0, 1}, {{seg.begin, seg.end}}, seg.values.data(), seg.values.size()).ok());
  }
  shard_effects fx, copy_fx;
  auto parts = c.hand_off(giver, fx);
  auto again = copy.hand_off(c.after, copy_fx);
  REQUIRE(parts.size() == 1);
  REQUIRE(again.size() == 1);
  REQUIRE(c.cores[2]->take_over(parts[0]).ok());
  std::vector<float> g{1.0f};
  REQUIRE(c.cores[2]->push({2, 1, 1, 5000}, {{k, k + 1}}, g.data(), 1).ok());  // an update after the first part
  REQUIRE(c.cores[2]->take_over(again[0]).ok());  // the same part again: ignored, not merged a second time
  CHECK(c.value(2, k) == static_cast<float>(k) - 2.5f);  // sgd with momentum 0.5: 1, then 1.5
  std::uint64_t held = 0;
  for (const auto& seg : c.cores[2]->store().snapshot()) held += seg.end - seg.begin;
  std::uint64_t given = 0;
  for (key_type x = 0; x < num_keys; ++x) given += c.after.owner(x) == 2 && c.before.owner(x) == giver;
  CHECK(held == given);  // no key twice
}

TEST_CASE("handoff: a shard that leaves hands every other shard its clocks, even one that gains nothing now") {
  auto three = map_of_shards(1, {0, 1, 2});
  auto two = three.without_shard(2);
  shard_core leaver(shard(2, 1, {0, 1, 2}, 0));
  shard_effects fx;
  auto handoffs = leaver.hand_off(two, fx);
  std::set<std::uint32_t> to;
  for (const auto& h : handoffs) {
    to.insert(h.to);
    CHECK(h.clocks.size() == 2);
  }
  CHECK(to == std::set<std::uint32_t>{0, 1});
  // A shard that stays hands nothing to the others that gain nothing from it.
  shard_core stays(shard(0, 1, {0, 1, 2}, 0));
  shard_effects fx0;
  CHECK(stays.hand_off(two, fx0).empty());
}

TEST_CASE("handoff: the fraction of keys a map change moves") {
  auto two = map_of_shards(1, {0, 1});
  auto three = two.with_shard(2);
  std::vector<key_range> all{{0, num_keys}};
  auto joined = moved_key_fraction(two, three, all);
  CHECK(joined > 0.2);
  CHECK(joined <= 1.25 / 3);  // the bound: 1.25 x 1/(n+1)
  CHECK(moved_key_fraction(two, two, all) == 0.0);
  CHECK(moved_key_fraction(two, three, {}) == 0.0);
  CHECK_THROWS_AS(moved_key_fraction(two, partitioner(1, {0, 1}, partitioner::default_vnodes, bits + 1), all), bad_request);
}

TEST_CASE("handoff: a whole copy seeds a new copy of the shard that then answers as the shard does; nothing is taken "
          "out; with a disk tier its rows go first, a page at a time") {
  two_and_a_newcomer c(0);  // BSP: deferred pushes must travel too
  std::vector<std::uint64_t> ids;
  for (std::uint64_t i = 1; ids.size() < 20; ++i)
    if (c.before.row_owner(0, i * 7919) == 0) ids.push_back(i * 7919);
  std::vector<float> grads(ids.size() * 2, 1.0f);
  REQUIRE(c.cores[0]->push_rows({1, 0, 0, 900}, 0, ids, grads.data(), grads.size()).ok());
  c.push_all(c.before, 0, 0, 1.0f, 2000);  // deferred: worker 1 has not finished clock 0
  auto copy = c.cores[0]->whole_copy();
  CHECK(copy.from == 0);
  CHECK(copy.to == 0);
  CHECK_FALSE(copy.deferred.empty());
  shard_core seeded(shard(0, 1, {0, 1}, 0));
  REQUIRE(seeded.take_over(decode_handoff(encode_handoff(copy))).ok());
  // A push applied before the copy and resent is filtered on the copy too; clocks go on alike.
  REQUIRE(seeded.push_rows({1, 0, 0, 900}, 0, ids, grads.data(), grads.size()).ok());
  for (auto* core : {c.cores[0].get(), &seeded})
    for (std::uint32_t w = 0; w < 2; ++w) REQUIRE(core->tick({1, w, 1, 0}).ok());
  for (key_type k = 0; k < num_keys; k += 37)
    if (c.before.owner(k) == 0) {
      float v = 0;
      seeded.store().pull({{k, k + 1}}, &v, 1);
      CHECK(v == static_cast<float>(k) - 1.0f);  // the deferred push applied once, on both
      CHECK(c.value(0, k) == v);
    }
  auto pull = seeded.pull_rows({1, 0, 1, 0}, 0, ids, 1, t0);
  REQUIRE(pull.answer.size() == 1);
  CHECK(seeded.take_row_values(pull.answer[0]) == std::vector<float>(ids.size() * 2, 1.0f));  // once, not twice
  // With a disk tier the whole copy carries no rows: they go before it, in pages of the
  // tail's pinned disk tier (seed_rows), which a copy with a disk tier of its own holds.
  auto tiered_config = shard(0, 1, {0, 1}, 0);
  tiered_config.shard_memory = 1 << 20;
  shard_core tiered(tiered_config);
  const auto stride = tiered.rows().table(0).stride();
  moved_page page{0, ids, {}, false, 0};
  for (std::size_t i = 0; i < ids.size() * stride; ++i) page.rows.push_back(static_cast<float>(i));
  auto part = tiered.seed_rows(page);
  CHECK(part.rows_only);
  CHECK(part.to == 0);
  auto whole = tiered.whole_copy();
  CHECK(whole.rows.empty());
  shard_core tiered_copy(tiered_config);
  REQUIRE(tiered_copy.take_over(decode_handoff(encode_handoff(part))).ok());
  REQUIRE(tiered_copy.take_over(decode_handoff(encode_handoff(whole))).ok());
  auto rows = tiered_copy.pull_rows({1, 0, 0, 0}, 0, ids, 0, t0);
  REQUIRE(rows.answer.size() == 1);
  auto values = tiered_copy.take_row_values(rows.answer[0]);
  REQUIRE(values.size() == ids.size() * 2);
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (std::size_t d = 0; d < 2; ++d) CHECK(values[i * 2 + d] == page.rows[i * stride + d]);
  page.rows.pop_back();
  CHECK_THROWS_WITH_AS(tiered.seed_rows(page), doctest::Contains("floats for 20 rows"), bad_request);
}
