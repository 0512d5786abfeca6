// The staleness controller in the server shards, driven through real kv_clients on CAF's
// deterministic scheduler: BSP, SSP and ASP reads, parked pulls, workers leaving, and a
// seeded randomized run per model that checks every read against the guarantees and the
// shards' own trace against check_trace.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "libps/core/consistency.hpp"
#include "actors/training.hpp"
#include "libps/core/trace.hpp"
#include "tests/actor_fixture.hpp"
#include "libps/persist/trace_file.hpp"

using namespace ps;
using namespace ps::test;

namespace {

constexpr std::uint64_t num_keys = two_shard_cluster::num_keys;

// A cluster of 2 shards and `workers` kv_clients, all on the test scheduler.
struct ssp_cluster : two_shard_cluster {
  void start(std::uint32_t workers, std::uint64_t staleness, shard_options sopts = {}) {
    coordinator_options o;
    o.staleness = staleness;
    two_shard_cluster::start(o, workers, sopts);
  }
  // One iteration's writes: +1 on every key, tagged with the worker's clock, then the tick.
  void push_and_tick(std::uint32_t w) {
    auto& kv = *clients[w];
    kv.push(keys, std::vector<float>(num_keys, 1.0f));
    kv.advance_clock(kv.clock() + 1);
  }
  // Through the coordinator, as a finishing worker does (the coordinator tells the shards).
  void leave(std::uint32_t w) { caf::anon_send(coord, done_atom::value, worker_result{w, true, "{}"}); }
  // Straight to the shards: the coordinator would end the job when the last worker goes.
  void leave_shards(std::uint32_t w) {
    for (auto& s : shards) caf::anon_send(s, leave_atom::value, w);
  }
  static void require_all(const std::vector<float>& v, float expect) {
    REQUIRE(v.size() == num_keys);
    for (auto x : v) REQUIRE(x == expect);
  }
};

}  // namespace

TEST_CASE_FIXTURE(ssp_cluster, "BSP: a read at clock c waits for every worker and sees exactly N*c") {
  start(2, 0);
  push_and_tick(0);
  auto early = clients[0]->pull(keys);  // clock 1: worker 1 is still at 0
  sched.run();
  CHECK_FALSE(early.ready());
  // Worker 1 still reads at clock 0: worker 0's push of clock 0 is not visible yet.
  require_all(settle(clients[1]->pull(keys)), 0.0f);
  push_and_tick(1);
  sched.run();
  REQUIRE(early.ready());
  require_all(early.get(), 2.0f);  // N * c = 2 * 1
  require_all(settle(clients[1]->pull(keys)), 2.0f);
}

TEST_CASE_FIXTURE(ssp_cluster, "SSP: a worker runs up to s clocks ahead, then waits; its own pushes are always visible") {
  start(2, 1);
  push_and_tick(0);
  require_all(settle(clients[0]->pull(keys)), 1.0f);  // clock 1, min 0 >= 1 - 1: own push seen
  push_and_tick(0);
  auto waiting = clients[0]->pull(keys);  // clock 2 needs min >= 1
  sched.run();
  CHECK_FALSE(waiting.ready());
  push_and_tick(1);
  sched.run();
  REQUIRE(waiting.ready());
  require_all(waiting.get(), 3.0f);  // both own pushes + worker 1's push of clock 0
}

TEST_CASE_FIXTURE(ssp_cluster, "ASP never waits") {
  start(2, infinite_staleness);
  for (int i = 0; i < 5; ++i) push_and_tick(0);
  require_all(settle(clients[0]->pull(keys)), 5.0f);  // clock 5 while worker 1 is at 0
}

TEST_CASE_FIXTURE(ssp_cluster, "a worker that leaves is not waited for") {
  start(3, 0);
  push_and_tick(0);
  push_and_tick(1);
  auto parked = clients[0]->pull(keys);
  sched.run();
  CHECK_FALSE(parked.ready());
  leave(2);  // the coordinator tells the shards
  sched.run();
  REQUIRE(parked.ready());
  require_all(parked.get(), 2.0f);
}

TEST_CASE_FIXTURE(ssp_cluster, "a pull parked too long fails, naming the worker everybody waits for") {
  shard_options sopts;
  sopts.park_limit = milliseconds(1000);
  start(2, 0, sopts);
  push_and_tick(0);
  auto parked = clients[0]->pull(keys);
  sched.run();
  sched.clock().advance_time(milliseconds(600));
  sched.run();
  CHECK_FALSE(parked.ready());  // a sweep ran at 500 ms and found nothing old enough
  sched.clock().advance_time(milliseconds(600));
  sched.run();
  REQUIRE(parked.ready());
  auto err = parked.error();
  CHECK(err.find("pull at clock 1 by worker 0 waited 1000 ms for the minimum clock to reach 1") != std::string::npos);
  CHECK(err.find("worker 1 is at clock 0") != std::string::npos);
}

// Seeded random interleavings: each step picks a worker that either collects its read,
// or pushes, ticks and reads at its next clock (or leaves midway); the scheduler then
// delivers a random number of messages. Checks, for every read at clock c by worker w:
// (b) value >= own pushes + sum over others of min(their pushes, c - s), <= all pushes;
// (c) s = 0: exactly the pushes of clocks < c; (d) ASP reads never wait; (e) the fastest
// live worker is at most s + 1 clocks ahead of the slowest; (f) one worker leaving never
// blocks the others; nothing is lost at the end; the shards' trace passes check_trace.
TEST_CASE("randomized BSP/SSP/ASP runs keep every guarantee") {
  for (std::uint64_t s : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{3}, infinite_staleness}) {
    for (std::uint64_t seed = 1; seed <= 6; ++seed) {
      INFO("staleness " << staleness_to_string(s) << ", seed " << seed);
      ssp_cluster c;
      auto trace = "/tmp/actorps-test-trace-" + std::to_string(getpid()) + ".jsonl";
      std::remove(trace.c_str());
      shard_options sopts;
      sopts.trace_path = trace;
      const std::uint32_t n = 3;
      const std::uint64_t iterations = 10;
      c.start(n, s, sopts);
      std::mt19937_64 rng(seed);
      const std::uint32_t leaver = static_cast<std::uint32_t>(rng() % n);
      const std::uint64_t leave_at = 3 + rng() % 4;
      std::vector<std::uint64_t> pushes(n, 0);
      std::vector<bool> done(n, false);
      std::vector<std::optional<kv_future>> reading(n);
      std::uint64_t total = 0;
      auto all_done = [&] { return std::all_of(done.begin(), done.end(), [](bool d) { return d; }); };
      for (int step = 0; step < 20000 && !all_done(); ++step) {
        auto w = static_cast<std::uint32_t>(rng() % n);
        if (!done[w]) {
          auto& kv = *c.clients[w];
          if (reading[w]) {
            if (reading[w]->ready()) {
              auto values = reading[w]->get();
              reading[w].reset();
              auto clock = kv.clock();
              std::uint64_t floor = pushes[w], exact = 0;
              for (std::uint32_t o = 0; o < n; ++o) {
                exact += std::min(pushes[o], clock);
                if (o != w && s != infinite_staleness && clock > s) floor += std::min(pushes[o], clock - s);
              }
              for (auto v : values) {
                REQUIRE(v >= static_cast<float>(floor));
                REQUIRE(v <= static_cast<float>(total));
                if (s == 0) REQUIRE(v == static_cast<float>(exact));
              }
              if (clock == iterations) {
                done[w] = true;
                c.leave_shards(w);
              }
            }
          } else if (w == leaver && kv.clock() == leave_at) {
            done[w] = true;
            c.leave_shards(w);
          } else {
            c.push_and_tick(w);
            ++pushes[w];
            ++total;
            reading[w] = kv.pull(c.keys);
          }
        }
        // Actors run in random order (FIFO or LIFO job queue); each mailbox stays FIFO.
        for (auto k = rng() % 6; k > 0 && (rng() % 2 ? c.sched.try_run_once() : c.sched.try_run_once_lifo()); --k) {}
        if (s == infinite_staleness && rng() % 4 == 0) {  // (d): with everything delivered, no read waits
          c.sched.run();
          for (auto& r : reading) CHECK((!r || r->ready()));
        }
        // (e): clocks of live workers stay within s + 1 of each other.
        std::uint64_t lo = UINT64_MAX, hi = 0;
        for (std::uint32_t o = 0; o < n; ++o)
          if (!done[o]) {
            lo = std::min(lo, c.clients[o]->clock());
            hi = std::max(hi, c.clients[o]->clock());
          }
        if (s != infinite_staleness && lo != UINT64_MAX) REQUIRE(hi - lo <= s + 1);
        if (step % 64 == 63) c.sched.run();  // let parked reads settle now and then
      }
      REQUIRE(all_done());  // (f): nobody was left waiting
      c.sched.run();
      // Nothing lost: every push is in (all workers left, so nothing is deferred).
      auto final_values = c.settle(c.clients[(leaver + 1) % n]->pull(c.keys));  // at the last clock
      for (auto v : final_values) REQUIRE(v == static_cast<float>(total));
      auto rep = check_trace(read_trace(trace));
      CHECK(rep.violations.empty());
      if (!rep.violations.empty()) MESSAGE(rep.violations.front());
      CHECK(rep.pulls >= total);
      if (s != infinite_staleness) CHECK(rep.max_lag <= s + 1);
      std::remove(trace.c_str());
    }
  }
}

TEST_CASE_FIXTURE(fixture, "the loader stage's stand-in builds batches in request order when the scheduler runs it") {
  std::vector<std::uint64_t> built;
  batch_loader loader(sys, [&](std::uint64_t clock) {
    built.push_back(clock);
    if (clock == 2) throw bad_request("batch 2 is unreadable");
    sample_batch b;
    b.n = clock + 1;
    return b;
  }, false);
  auto first = loader.request(0), second = loader.request(1), broken = loader.request(2);
  CHECK(built.empty());  // nothing ran yet: the test's scheduler decides when
  sched.run();
  CHECK(built == std::vector<std::uint64_t>{0, 1, 2});
  CHECK(first.get().n == 1);
  CHECK(second.get().n == 2);
  CHECK_THROWS_WITH_AS(broken.get(), "batch 2 is unreadable", bad_request);  // the error reaches the caller
}
