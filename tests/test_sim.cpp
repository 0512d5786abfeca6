// The whole-cluster simulation (apps/sim_cluster.hpp): a seed's plan is a function of
// the seed, a run repeats exactly, clean seeds pass, and the simulator has teeth: with
// the duplicate filter or the staleness gate turned off it finds failing seeds.
#include <doctest/doctest.h>

#include <set>

#include "apps/sim_cluster.hpp"
#include "libps/core/consistency.hpp"
#include "libps/keys/keys.hpp"
#include "libps/observe/log.hpp"
#include "libps/sim/sabotage.hpp"

using namespace ps;

namespace {

// The members' news (failovers, by the hundred) would bury the test's own output.
const bool quiet = [] {
  set_log_level(log_level::error);
  return true;
}();

// The first failing seed in [1, seeds], or 0.
std::uint64_t first_failing_seed(std::uint64_t seeds) {
  for (std::uint64_t seed = 1; seed <= seeds; ++seed)
    if (!run_simulation(plan_for_seed(seed)).failure.empty()) return seed;
  return 0;
}

// Turns a break on for one scope.
struct broken {
  explicit broken(const std::string& name) { sabotage::turn_on(name); }
  ~broken() { sabotage::reset(); }
};

}  // namespace

TEST_CASE("sim: a seed's plan depends on the seed alone, and seeds cover every fault kind") {
  CHECK(to_json(plan_for_seed(42)) == to_json(plan_for_seed(42)));
  std::set<std::string> plans;
  bool servers3 = false, partition = false, kill = false, kill_worker = false, leave = false, drop = false, duplicate = false, delay = false, bsp = false, asp = false;
  for (std::uint64_t seed = 1; seed <= 100; ++seed) {
    auto p = plan_for_seed(seed);
    plans.insert(to_json(p));
    CHECK((p.workers >= 2 && p.workers <= 3));
    CHECK(p.speed.size() == p.workers);
    CHECK((p.servers >= 2 && p.servers <= 3 && p.replication >= 1 && p.replication <= p.servers));
    if (p.kill_server) CHECK(p.replication >= 2);  // nothing may be lost: the killed server's shards have copies
    servers3 |= p.servers == 3;
    if (p.messages.drop_p > 0) CHECK(p.retry_ms > 0);  // a lost request is sent again
    kill |= p.kill_server.has_value();
    kill_worker |= p.kill_worker.has_value();
    partition |= p.partition_server.has_value();
    if (p.partition_server) CHECK(*p.partition_server < p.servers);
    if (p.kill_worker) CHECK(p.kill_worker != p.leaver);
    leave |= p.leaver.has_value();
    drop |= p.messages.drop_p > 0;
    duplicate |= p.messages.duplicate_p > 0;
    delay |= p.messages.delay_ms > 0;
    bsp |= p.staleness == 0;
    asp |= p.staleness == infinite_staleness;
  }
  CHECK(plans.size() == 100);
  CHECK((servers3 && partition && kill && kill_worker && leave && drop && duplicate && delay && bsp && asp));
}

TEST_CASE("sim: a seed replays exactly (the same message trace)") {
  for (std::uint64_t seed : {3, 17, 64}) {
    auto a = run_simulation(plan_for_seed(seed));
    auto b = run_simulation(plan_for_seed(seed));
    CHECK(a.trace_hash == b.trace_hash);
    CHECK(a.messages == b.messages);
    CHECK(a.messages > 100);
  }
  CHECK(run_simulation(plan_for_seed(3)).trace_hash != run_simulation(plan_for_seed(4)).trace_hash);
}

TEST_CASE("sim: blocks go over the in-memory transport as production's go over its data plane; "
          "--no-data-plane keeps them in the messages, under the same invariants") {
  for (std::uint64_t seed : {3, 17, 64}) {
    auto plan = plan_for_seed(seed);
    INFO("seed " << seed << ": " << to_json(plan));
    auto over = run_simulation(plan);
    CHECK(over.failure == "");
    CHECK(over.plane_bytes >= plan.workers * 64 * sizeof(float));  // at least the keys' first pull
    plan.data_plane = false;
    auto inside = run_simulation(plan);
    CHECK(inside.failure == "");
    CHECK(inside.plane_bytes == 0);
    CHECK(inside.trace_hash != over.trace_hash);  // the shards' claimers and trackers are in the trace
  }
}

TEST_CASE("sim --tiered: with rows on disk tiers a seed replays exactly, keeps every invariant, and differs from "
          "the same plan all in RAM") {
  for (std::uint64_t seed : {3, 17, 64}) {
    auto plan = plan_for_seed(seed, true);
    plan.tiered = true;
    INFO("seed " << seed << ": " << to_json(plan));
    auto a = run_simulation(plan);
    auto b = run_simulation(plan);
    CHECK(a.failure == "");
    CHECK(a.trace_hash == b.trace_hash);
    CHECK(a.messages == b.messages);
    plan.tiered = false;
    CHECK(run_simulation(plan).trace_hash != a.trace_hash);  // the disk tier's messages are in the trace
  }
}

TEST_CASE("sim: 200 seeds keep every invariant") {
  for (std::uint64_t seed = 1; seed <= 200; ++seed) {
    auto out = run_simulation(plan_for_seed(seed));
    INFO("seed " << seed << ": " << to_json(plan_for_seed(seed)));
    CHECK(out.failure == "");
  }
}

TEST_CASE("sim: without the duplicate filter, failing seeds come within 200, naming a sum that is too high") {
  broken b("dedupe");
  auto seed = first_failing_seed(200);
  REQUIRE(seed != 0);
  auto failure = run_simulation(plan_for_seed(seed)).failure;
  INFO(failure);
  // Above what was pushed (SSP, ASP), or above the exact BSP value.
  CHECK((failure.find("more than was pushed") != std::string::npos || failure.find("is not exact") != std::string::npos));
}

TEST_CASE("sim: without the staleness gate, failing seeds come within 200, naming a read that saw too little") {
  broken b("ssp-gate");
  auto seed = first_failing_seed(200);
  REQUIRE(seed != 0);
  auto failure = run_simulation(plan_for_seed(seed)).failure;
  CHECK((failure.find("saw too little") != std::string::npos || failure.find("not exact") != std::string::npos));
}

TEST_CASE("sim: an unknown break is refused, naming the known ones") {
  CHECK_THROWS_WITH_AS(sabotage::turn_on("gravity"), doctest::Contains("known: dedupe, ssp-gate"), bad_request);
  CHECK_FALSE(sabotage::dedupe_off.load());
}
