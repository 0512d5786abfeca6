// Chain replication, failover and membership on CAF's deterministic scheduler: copies
// apply each push once, a killed server's copies are spliced out at every possible
// moment of a request's life without losing or doubling an update, and a worker joins
// a running BSP job at the minimum clock.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>

#include "actors/checkpointer.hpp"
#include "tests/actor_fixture.hpp"

using namespace ps;
using namespace ps::test;

namespace {

constexpr std::uint64_t num_keys = two_shard_cluster::num_keys;

// 2 servers with 2 copies of each shard, BSP, `workers` clients that follow failovers.
struct chain_cluster : two_shard_cluster {
  std::vector<shard_actor>& heads = shards;
  void start(std::uint32_t workers) {
    coordinator_options o;
    o.staleness = 0;
    o.replication = 2;
    two_shard_cluster::start(o, workers, {}, true);
  }
  // Every key pulled must hold exactly `expect`.
  void check_all(kv_client& kv, float expect) {
    auto f = kv.pull(keys);
    sched.run();
    REQUIRE(f.ready());
    REQUIRE(f.error() == "");
    auto got = f.get();
    for (std::size_t i = 0; i < got.size(); ++i) {
      CAPTURE(i);
      CHECK(got[i] == expect);
    }
  }
};

}  // namespace

TEST_CASE("replication: the map names a chain of 2 copies per shard, on different servers") {
  chain_cluster c;
  c.start(1);
  REQUIRE(c.view.shards.size() == 2);
  for (const auto& s : c.view.shards) {
    REQUIRE(s.chain.size() == 2);
    CHECK(s.chain[0] == caf::actor_cast<caf::actor>(c.heads[s.id]));  // the head: this shard's server
    CHECK(s.chain[1] != s.chain[0]);
  }
  // The tail of shard 0 lives with the head of shard 1 (consecutive servers on the ring).
  CHECK(c.view.shards[0].chain[1] != c.view.shards[1].chain[0]);
  c.clients[0]->push(c.keys, std::vector<float>(num_keys, 2.0f));
  c.clients[0]->advance_clock(1);
  c.check_all(*c.clients[0], 2.0f);  // answered by the tails: the pushes went down the chains
}

TEST_CASE("replication: a server killed at any step of a BSP iteration loses and doubles nothing") {
  // For each cut-off point, a fresh cluster: step the scheduler that far into two workers'
  // iteration, kill both actors of server 1 (the head of shard 1 and the copy of shard 0),
  // then let everything run. Every interleaving must end with exactly 3 clocks x (1 + 1).
  for (int steps = 0; steps < 60; ++steps) {
    CAPTURE(steps);
    chain_cluster c;
    c.start(2);
    auto server1 = {caf::actor_cast<caf::actor>(c.heads[1]), c.view.shards[0].chain[1]};
    std::vector<kv_future> ops;
    for (int clock = 0; clock < 3; ++clock) {
      for (auto& kv : c.clients) {
        ops.push_back(kv->push(c.keys, std::vector<float>(num_keys, 1.0f)));
        ops.push_back(kv->advance_clock(clock + 1));
      }
      if (clock == 1) {
        for (int i = 0; i < steps && c.sched.try_run_once(); ++i) {
        }
        for (const auto& a : server1) caf::anon_send_exit(a, caf::exit_reason::kill);
      }
      c.sched.run();
    }
    for (auto& op : ops) {
      REQUIRE(op.ready());
      CHECK(op.error() == "");  // every push and tick acknowledged, none failed
    }
    for (auto& kv : c.clients) c.check_all(*kv, 6.0f);
    // Requests the dead actors had taken were sent again: none of their answers is awaited.
    for (auto& kv : c.clients) CHECK(kv->awaited_answers() == 0);
  }
}

TEST_CASE("replication: a push sent twice with the same sequence number is applied once") {
  chain_cluster c;
  c.start(1);
  auto head = c.heads[0];
  auto k = key_type{0};
  while (c.clients[0]->map().owner(k) != 0) k += 4;
  request_header hdr{1, 0, 0, 424242};
  auto block = float_block::own({5.0f});
  auto box = std::make_shared<inbox>();
  auto sender = c.spawn_inbox(box);
  for (int i = 0; i < 2; ++i)
    caf::send_as(sender, head, push_atom::value, hdr, range_list{{{k, k + 1}}}, block);
  c.sched.run();
  CHECK(box->count<std::uint64_t>() == 2);  // both acknowledged ...
  c.clients[0]->advance_clock(1);
  auto f = c.clients[0]->pull(key_set::single({k, k + 1}));
  c.sched.run();
  REQUIRE(f.ready());
  CHECK(f.get() == std::vector<float>{5.0f});  // ... applied once, on the tail too
}

TEST_CASE("replication: a pull sent right behind a push sees it, though the tail answers pulls (read-my-writes)") {
  // ASP: no clock gate holds the pull back, so only the client's ordering can keep it
  // behind the push on its way down the chain (found by sim before the client waited).
  chain_cluster c;
  coordinator_options o;
  o.staleness = infinite_staleness;
  o.replication = 2;
  c.two_shard_cluster::start(o, 1, {}, true);
  auto& kv = *c.clients[0];
  for (int i = 1; i <= 3; ++i) {
    kv.push(c.keys, std::vector<float>(num_keys, 1.0f));
    auto read = kv.pull(c.keys);
    auto got = c.settle(read);
    CAPTURE(i);
    CHECK(got.front() == static_cast<float>(i));
    CHECK(got.back() == static_cast<float>(i));
  }
}

TEST_CASE("membership: a worker joins a running BSP job at the minimum clock and its pushes count") {
  chain_cluster c;
  c.start(1);
  auto& first = *c.clients[0];
  for (int clock = 0; clock < 3; ++clock) {
    first.push(c.keys, std::vector<float>(num_keys, 1.0f));
    first.advance_clock(clock + 1);
  }
  c.sched.run();
  auto joined = c.register_worker(c.coord);
  c.sched.run();
  REQUIRE(joined->has_value());
  CHECK((*joined)->id == 1);
  CHECK((*joined)->start_clock == 3);
  CHECK((*joined)->view.num_workers == 2);
  kv_client_options opts{1, default_chunk_bytes, milliseconds(60000)};
  opts.coordinator = c.coord;
  kv_client second(c.sys, (*joined)->view, chain_cluster::links_of((*joined)->view), opts);
  second.advance_clock(3);
  c.sched.run();
  // BSP: the first worker's read at clock 4 now waits for the joiner's clock 3.
  first.push(c.keys, std::vector<float>(num_keys, 1.0f));
  first.advance_clock(4);
  auto waiting = first.pull(c.keys);
  c.sched.run();
  CHECK_FALSE(waiting.ready());
  second.push(c.keys, std::vector<float>(num_keys, 10.0f));
  second.advance_clock(4);
  c.sched.run();
  REQUIRE(waiting.ready());
  auto got = waiting.get();
  CHECK(got.front() == 14.0f);  // 4 clocks of the first worker and one of the joiner
  CHECK(got.back() == 14.0f);
  CHECK(second.live_workers() == std::vector<std::uint32_t>{0, 1});
}

TEST_CASE("recovery from a checkpoint (one copy): a shard killed at any step of a BSP iteration; exact apart from the reported loss") {
  namespace fs = std::filesystem;
  long long total_lost = 0;  // over all runs: the checkpoint (every 2 clocks) lags the kill
  for (int steps = 0; steps < 40; steps += 3) {
    CAPTURE(steps);
    auto dir = fs::temp_directory_path() / ("actorps-recovery-" + std::to_string(::getpid()) + "-" + std::to_string(steps));
    fs::remove_all(dir);
    fs::create_directories(dir);
    two_shard_cluster c;
    auto box = std::make_shared<inbox>();
    auto observer = c.spawn_inbox(box);
    checkpointer_options ck;
    ck.dir = dir.string();
    ck.observer = caf::actor_cast<observer_actor>(observer);
    // The file writer on the test's scheduler, not a thread of its own: deterministic.
    ck.file_writer = c.sys.spawn(checkpoint_file_writer, dir.string());
    ck.header.model = "test";
    ck.header.shard_ids = {0, 1};
    ck.header.vnodes = 128;
    ck.header.bucket_bits = 2;
    auto writer = c.sys.spawn(checkpointer, ck);
    c.alive.push_back(caf::actor_cast<caf::actor>(writer));
    coordinator_options o;
    o.staleness = 0;
    o.observer = caf::actor_cast<observer_actor>(observer);
    o.checkpoint_every = 2;
    o.checkpointer = writer;
    o.checkpoint_dir = dir.string();
    o.checkpoint_reads_on_scheduler = true;  // deterministic: no thread of its own
    c.start(o, 2, {}, true);
    std::vector<kv_future> ops;
    for (int clock = 0; clock < 6; ++clock) {
      for (std::uint32_t w = 0; w < 2; ++w) {
        ops.push_back(c.clients[w]->push(c.keys, std::vector<float>(num_keys, static_cast<float>(w + 1))));
        ops.push_back(c.clients[w]->advance_clock(clock + 1));
      }
      if (clock == 3) {
        for (int i = 0; i < steps && c.sched.try_run_once(); ++i) {
        }
        caf::anon_send_exit(c.shards[1], caf::exit_reason::kill);
      }
      c.sched.run();
    }
    for (auto& op : ops) {
      REQUIRE(op.ready());
      CHECK(op.error() == "");
    }
    // Lost clocks per worker on shard 1, from the replacement's loss events.
    std::map<std::uint32_t, long long> lost;
    for (const auto& m : box->messages) {
      if (!m.match_elements<loss_atom, update_loss>()) continue;
      const auto& loss = m.get_as<update_loss>(1);
      CHECK(loss.shard == 1);
      CHECK(!loss.at_most);  // BSP
      lost[loss.worker] += static_cast<long long>(loss.lost_clocks);
    }
    CHECK(lost.size() == 2);  // both workers pushed to the replacement: both reported
    total_lost += lost[0] + lost[1];
    auto f = c.clients[0]->pull(c.keys);
    c.sched.run();
    REQUIRE(f.ready());
    auto got = f.get();
    for (std::size_t i = 0; i < got.size(); ++i) {
      auto owner = c.clients[0]->map().owner(i);
      float expect = owner == 0 ? 3.0f * 6 : static_cast<float>(1 * (6 - lost[0]) + 2 * (6 - lost[1]));
      CAPTURE(i);
      CHECK(got[i] == expect);
    }
    fs::remove_all(dir);
  }
  CHECK(total_lost > 0);  // some runs really lost updates, and the sums above matched the reports
}
