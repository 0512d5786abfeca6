// The shard's decisions without actors (libps/core/shard_core.hpp): event in, effects out.
#include <doctest/doctest.h>

#include <vector>

#include "libps/core/shard_core.hpp"

using namespace ps;
using std::chrono::milliseconds;

namespace {

using time_point = shard_core::time_point;
const time_point t0{};

// One shard of one, 2 workers, 16 keys from 0 (all its own).
shard_config one_shard(std::uint64_t staleness, std::uint32_t workers = 2) {
  shard_config c;
  c.id = 0;
  c.shard_ids = {0};
  c.bucket_bits = 2;
  c.rule = update_rule{};  // sum
  c.num_workers = workers;
  c.staleness = staleness;
  return c;
}

std::vector<float> values_of(const shard_core& core, key_range r) {
  std::vector<float> out(r.size());
  core.store().pull({r}, out.data(), r.size());
  return out;
}

const std::vector<key_range> keys{{0, 4}};
const std::vector<float> ones(4, 1.0f);

}  // namespace

TEST_CASE("shard_core: a push is applied and traced once; a resend of the same (worker, seq) only acknowledged") {
  shard_core core(one_shard(infinite_staleness));
  core.init({1, 0, 0, 1}, keys, std::vector<float>(4, 0.0f).data(), 4);
  auto fx = core.push({1, 0, 0, 7}, keys, ones.data(), 4);
  CHECK(fx.ok());
  REQUIRE(fx.traces.size() == 1);
  CHECK(fx.traces[0].kind == trace_event::push);
  auto again = core.push({1, 0, 0, 7}, keys, ones.data(), 4);  // the same push, resent after a failover
  CHECK(again.ok());
  CHECK(again.traces.empty());
  CHECK(values_of(core, {0, 4}) == ones);
}

TEST_CASE("shard_core: a request of a newer epoch, or for keys of another shard, is refused by name") {
  auto cfg = one_shard(infinite_staleness);
  cfg.shard_ids = {0, 1};
  cfg.bucket_bits = 0;
  shard_core core(cfg);
  auto newer = core.push({2, 0, 0, 1}, keys, ones.data(), 4);
  CHECK(newer.error == "shard 0: request from worker 0 has epoch 2, current epoch is 1");
  // Some of 64 one-key buckets belong to shard 1.
  std::vector<float> many(64, 1.0f);
  auto foreign = core.push({1, 0, 0, 2}, {{0, 64}}, many.data(), 64);
  CHECK(foreign.error.find("belong to shard 1 (epoch 1), not to this one") != std::string::npos);
  core.saw_epoch(2);
  CHECK(core.push({2, 0, 0, 3}, {}, nullptr, 0).ok());  // the map of epoch 2 arrived
}

TEST_CASE("shard_core: under BSP a read waits for every worker's clock, a push of a running clock waits for its end") {
  shard_core core(one_shard(0));
  core.init({1, 0, 0, 1}, keys, std::vector<float>(4, 0.0f).data(), 4);
  // Worker 0 finished clock 0 and reads at clock 1: worker 1 is still at 0.
  CHECK(core.tick({1, 0, 1, 0}).ok());
  auto read = core.pull({1, 0, 1, 0}, keys, 11, t0);
  CHECK(read.answer.empty());
  // Worker 1 pushes for clock 0 (its current clock): acknowledged, not yet applied.
  auto push = core.push({1, 1, 0, 5}, keys, ones.data(), 4);
  CHECK(push.ok());
  CHECK(push.traces.empty());
  CHECK(values_of(core, {0, 4}) == std::vector<float>(4, 0.0f));
  // Its tick completes clock 0: the push is applied first, then the read is answered.
  auto fx = core.tick({1, 1, 1, 0});
  REQUIRE(fx.traces.size() == 2);
  CHECK(fx.traces[0].kind == trace_event::push);
  CHECK(fx.traces[1].kind == trace_event::pull);
  CHECK(fx.traces[1].min_clock == 1);
  CHECK(fx.answer == std::vector<std::uint64_t>{11});
  CHECK(values_of(core, {0, 4}) == ones);
  CHECK(core.pull_ranges(11) == keys);
}

TEST_CASE("shard_core: under SSP a read at clock c waits only for clock c - s") {
  shard_core core(one_shard(2));
  CHECK(core.pull({1, 0, 2, 0}, keys, 1, t0).answer == std::vector<std::uint64_t>{1});  // 2 - 2 <= min 0
  CHECK(core.pull({1, 0, 3, 0}, keys, 2, t0).answer.empty());                         // needs min 1
  core.tick({1, 0, 1, 0});
  CHECK(core.tick({1, 1, 1, 0}).answer == std::vector<std::uint64_t>{2});
}

TEST_CASE("shard_core: a worker that leaves is no longer waited for; a tick seen before changes nothing") {
  shard_core core(one_shard(0));
  core.tick({1, 0, 1, 0});
  CHECK(core.pull({1, 0, 1, 0}, keys, 3, t0).answer.empty());
  CHECK(core.tick({1, 0, 1, 0}).answer.empty());  // a resend
  auto fx = core.leave(1);
  CHECK(fx.answer == std::vector<std::uint64_t>{3});
  CHECK(fx.traces.front().kind == trace_event::leave);
  // A worker that joins starts at the minimum of the live ones.
  CHECK(core.join(2) == 1);
}

TEST_CASE("shard_core: a push of a worker that has left is refused at the head, passed-down copies apply it") {
  // Found by sim: a killed worker's push still on its way when its departure was
  // announced landed behind BSP reads that had been told the worker was gone.
  auto cfg = one_shard(infinite_staleness);
  sparse_table_spec table;
  table.name = "t";
  table.dim = 4;
  table.init_scale = 0;
  cfg.tables = {table};
  shard_core core(cfg);
  core.init({1, 0, 0, 1}, keys, std::vector<float>(4, 0.0f).data(), 4);
  core.leave(1);
  auto late = core.push({1, 1, 3, 9}, keys, ones.data(), 4);
  CHECK(late.error == "shard 0: push from worker 1 refused: it has left the job (finished or died)");
  CHECK(late.traces.empty());
  std::vector<std::uint64_t> id{5};
  CHECK(core.push_rows({1, 1, 3, 10}, 0, id, ones.data(), 4).error == "shard 0: push from worker 1 refused: it has "
                                                                       "left the job (finished or died)");
  CHECK(values_of(core, {0, 4}) == std::vector<float>(4, 0.0f));
  CHECK(core.push({1, 0, 3, 11}, keys, ones.data(), 4).ok());  // the others go on
  CHECK(core.push_rows({1, 0, 3, 12}, 0, id, ones.data(), 4).ok());
  // A copy further down the chain applies what its head passed down, whatever it heard.
  shard_core copy(one_shard(infinite_staleness));
  copy.set_head(false);
  copy.leave(1);
  CHECK(copy.push({1, 1, 3, 9}, keys, ones.data(), 4).ok());
  CHECK(values_of(copy, {0, 4}) == ones);
}

TEST_CASE("shard_core: a pull parked past the limit fails naming whom it waits for") {
  shard_core core(one_shard(0));
  core.tick({1, 0, 1, 0});
  core.pull({1, 0, 1, 0}, keys, 9, t0);
  CHECK(core.next_expiry(milliseconds(100)) == t0 + milliseconds(100));
  CHECK(core.expire(t0 + milliseconds(99), milliseconds(100)).fail.empty());
  auto fx = core.expire(t0 + milliseconds(100), milliseconds(100));
  REQUIRE(fx.fail.size() == 1);
  CHECK(fx.fail[0].first == 9);
  CHECK(fx.fail[0].second == "shard 0: pull at clock 1 by worker 0 waited 100 ms for the minimum clock to reach 1 "
                             "(staleness 0): worker 1 is at clock 0");
  CHECK(!core.next_expiry(milliseconds(100)));
}

TEST_CASE("shard_core: the minimum clock crossing a multiple of checkpoint_every asks for this shard's part") {
  auto cfg = one_shard(0, 1);
  cfg.checkpoint_every = 2;
  cfg.sends_checkpoints = true;
  shard_core core(cfg);
  CHECK(!core.tick({1, 0, 1, 0}).checkpoint_at);
  CHECK(core.tick({1, 0, 2, 0}).checkpoint_at == 2);
  CHECK(!core.tick({1, 0, 3, 0}).checkpoint_at);
  CHECK(core.checkpoint_at(5));  // a time-based boundary from the coordinator
  CHECK_FALSE(core.checkpoint_at(3));  // passed already: refused, the coordinator proposes another
  CHECK(core.tick({1, 0, 4, 0}).checkpoint_at == 4);  // 4 is a multiple of 2
  CHECK(core.tick({1, 0, 5, 0}).checkpoint_at == 5);
  cfg.head = false;  // a copy further down the chain sends no parts
  shard_core copy(cfg);
  copy.tick({1, 0, 1, 0});
  CHECK(!copy.tick({1, 0, 2, 0}).checkpoint_at);
}

TEST_CASE("shard_core: at the job's end the highest clock is known and the final part is asked for") {
  auto cfg = one_shard(infinite_staleness, 2);
  cfg.sends_checkpoints = true;
  shard_core core(cfg);
  core.tick({1, 0, 5, 0});
  core.tick({1, 1, 7, 0});
  core.tick({1, 1, 6, 0});  // an old tick again: no lower
  CHECK(core.highest_clock() == 7);
  core.leave(0);
  core.leave(1);
  CHECK(core.final_checkpoint(7).checkpoint_at == 7);
  cfg.sends_checkpoints = false;  // a job without checkpoints: no part
  shard_core quiet(cfg);
  CHECK(!quiet.final_checkpoint(3).checkpoint_at);
}

TEST_CASE("shard_core: a replacement reports per worker which clocks were lost, once") {
  shard_core core(one_shard(0));
  core.start_as_replacement(10, {});
  CHECK(core.min_clock() == 10);
  auto fx = core.push({1, 0, 13, 1}, keys, ones.data(), 4);
  REQUIRE(fx.losses.size() == 1);
  const auto& loss = fx.losses[0];
  CHECK(loss.shard == 0);
  CHECK(loss.worker == 0);
  CHECK(loss.from_clock == 10);
  CHECK(loss.lost_clocks == 3);
  CHECK(!loss.at_most);  // BSP: the checkpoint holds none of clocks 10..12
  CHECK(describe(loss, "shard 0") ==
        "shard 0: worker 0: updates of clocks 10..12 were lost with the dead shard (lost_clocks=3)");
  CHECK(core.push({1, 0, 14, 2}, keys, ones.data(), 4).losses.empty());
  auto second = core.push({1, 1, 10, 1}, keys, ones.data(), 4).losses;
  REQUIRE(second.size() == 1);
  CHECK(second[0].lost_clocks == 0);
  CHECK(describe(second[0], "shard 0") == "shard 0: worker 1: no update lost (lost_clocks=0)");
}

TEST_CASE("shard_core: the fault injector's kill clock ends the shard before it answers anything more") {
  auto cfg = one_shard(0, 1);
  cfg.kill_at = 3;
  shard_core core(cfg);
  core.tick({1, 0, 1, 0});
  core.pull({1, 0, 3, 0}, keys, 4, t0);
  core.tick({1, 0, 2, 0});
  auto fx = core.tick({1, 0, 3, 0});
  REQUIRE(fx.die);
  CHECK(*fx.die == "shard 0 reached clock 3 (--faults: kill server=0 at=3)");
  CHECK(fx.answer.empty());
}

TEST_CASE("shard_core: bad input is an error naming the shard, never a crash") {
  shard_core core(one_shard(infinite_staleness));
  CHECK(core.push({1, 0, 0, 1}, keys, ones.data(), 3).error.find("shard 0:") == 0);        // wrong count
  CHECK(core.push({1, 0, 0, 2}, {{4, 2}}, ones.data(), 4).error.find("shard 0:") == 0);    // malformed range
  CHECK(core.tick({1, 9, 1, 0}).error.find("shard 0:") == 0);                              // unknown worker
  CHECK_THROWS_AS(shard_core(one_shard(0), nullptr).join(1), bad_request);                 // already there
}

TEST_CASE("shard_core: a push that carries a tick applies the push, then advances the clock, resent or not") {
  shard_core core(one_shard(0));
  core.init({1, 0, 0, 1}, keys, std::vector<float>(4, 0.0f).data(), 4);
  CHECK(core.tick({1, 1, 1, 0}).ok());                    // worker 1 finished clock 0
  CHECK(core.pull({1, 1, 1, 0}, keys, 21, t0).answer.empty());  // it reads at 1: waits for worker 0
  auto fx = core.push({1, 0, 0, 8, 1}, keys, ones.data(), 4);  // worker 0's push of clock 0, ending it
  REQUIRE(fx.ok());
  REQUIRE(fx.traces.size() == 2);
  CHECK(fx.traces[0].kind == trace_event::push);  // applied first (its clock completes) ...
  CHECK(fx.traces[1].kind == trace_event::pull);  // ... then the read it unblocks
  CHECK(fx.answer == std::vector<std::uint64_t>{21});
  CHECK(core.min_clock() == 1);
  CHECK(values_of(core, {0, 4}) == ones);
  auto again = core.push({1, 0, 0, 8, 1}, keys, ones.data(), 4);  // resent after a failover
  CHECK(again.ok());
  CHECK(again.traces.empty());
  CHECK(values_of(core, {0, 4}) == ones);
}
