// The vector clock, the staleness controller and the trace checker (pure logic).
#include <doctest/doctest.h>

#include <random>

#include "libps/core/consistency.hpp"
#include "libps/keys/keys.hpp"
#include "libps/core/trace.hpp"

using namespace ps;

TEST_CASE("staleness_from maps the consistency flags and refuses contradictions") {
  CHECK(staleness_from("bsp", -1) == 0);
  CHECK(staleness_from("bsp", 0) == 0);
  CHECK(staleness_from("ssp", 2) == 2);
  CHECK(staleness_from("ssp", -1) == 3);
  CHECK(staleness_from("asp", -1) == infinite_staleness);
  CHECK(staleness_from("", 4) == 4);
  CHECK(staleness_from("", -1) == 0);
  CHECK_THROWS_WITH_AS(staleness_from("bsp", 2), doctest::Contains("contradicts --consistency=bsp"), bad_request);
  CHECK_THROWS_WITH_AS(staleness_from("ssp", 0), doctest::Contains("needs --staleness >= 1"), bad_request);
  CHECK_THROWS_WITH_AS(staleness_from("asp", 1), doctest::Contains("contradicts --consistency=asp"), bad_request);
  CHECK_THROWS_WITH_AS(staleness_from("tsp", -1), doctest::Contains("not one of bsp|ssp|asp"), bad_request);
  CHECK(std::string(consistency_name(0)) == "bsp");
  CHECK(std::string(consistency_name(2)) == "ssp");
  CHECK(std::string(consistency_name(infinite_staleness)) == "asp");
}

TEST_CASE("consistency_model: one value for BSP, SSP(k) and ASP, named and compared") {
  CHECK(consistency_model::bsp().staleness == 0);
  CHECK(consistency_model::asp().staleness == infinite_staleness);
  CHECK(consistency_model::ssp(2).staleness == 2);
  CHECK(std::string(consistency_model::bsp().name()) == "bsp");
  CHECK(consistency_model::ssp(3).to_string() == "ssp(3)");
  CHECK(consistency_model::asp().to_string() == "asp");
  CHECK(consistency_model::from_flags("ssp", 2) == consistency_model::ssp(2));
  CHECK(consistency_model::from_flags("", -1) == consistency_model::bsp());
  CHECK_THROWS_WITH_AS(consistency_model::ssp(0), doctest::Contains("at least 1"), bad_request);
  CHECK_THROWS_AS(consistency_model::from_flags("bsp", 2), bad_request);
}

TEST_CASE("vector clock: minimum over live workers; leaving counts as infinity") {
  vector_clock v(3);
  CHECK(v.min_clock() == 0);
  v.advance(0, 2);
  v.advance(1, 1);
  CHECK(v.min_clock() == 0);
  CHECK(v.slowest() == 2);
  v.advance(2, 5);
  CHECK(v.min_clock() == 1);
  CHECK(v.slowest() == 1);
  v.leave(1);
  CHECK(v.min_clock() == 2);
  CHECK_FALSE(v.live(1));
  CHECK_THROWS_WITH_AS(v.advance(0, 1), doctest::Contains("clock goes back from 2 to 1"), bad_request);
  CHECK_THROWS_WITH_AS(v.advance(1, 9), doctest::Contains("worker 1 left"), bad_request);
  CHECK_THROWS_WITH_AS(v.advance(3, 1), doctest::Contains("worker 3 is not in the clock vector of 3"), bad_request);
  v.leave(0);
  v.leave(2);
  CHECK(v.min_clock() == left_clock);
  CHECK(v.slowest() == 3);
}

TEST_CASE("controller: a read at clock c waits until min clock >= c - s") {
  SUBCASE("bsp") {
    staleness_controller ctl(2, 0);
    CHECK(ctl.defers_push(0));  // invisible until both workers finish clock 0
    CHECK(ctl.may_read(0));
    CHECK_FALSE(ctl.may_read(1));
    ctl.clocks().advance(0, 1);
    CHECK_FALSE(ctl.may_read(1));
    ctl.clocks().advance(1, 1);
    CHECK(ctl.may_read(1));
    CHECK_FALSE(ctl.defers_push(0));
    CHECK(ctl.defers_push(1));
  }
  SUBCASE("ssp 2") {
    staleness_controller ctl(2, 2);
    CHECK_FALSE(ctl.defers_push(5));  // SSP applies pushes at once
    CHECK(ctl.may_read(2));
    CHECK_FALSE(ctl.may_read(3));
    ctl.clocks().advance(0, 7);
    ctl.clocks().advance(1, 1);
    CHECK(ctl.may_read(3));
    CHECK_FALSE(ctl.may_read(4));
  }
  SUBCASE("asp never waits") {
    staleness_controller ctl(2, infinite_staleness);
    CHECK(ctl.may_read(1'000'000));
  }
}

TEST_CASE("parked reads are released in clock order once allowed, and by predicate") {
  staleness_controller ctl(2, 1);
  parked_reads<int> parked;
  parked.park(3, 30);
  parked.park(2, 20);
  parked.park(4, 40);
  CHECK(parked.release(ctl).empty());
  ctl.clocks().advance(0, 2);
  ctl.clocks().advance(1, 1);
  CHECK(parked.release(ctl) == std::vector<int>{20});
  ctl.clocks().advance(1, 3);
  CHECK(parked.release(ctl) == std::vector<int>{30});
  CHECK(parked.release_if([](int r) { return r == 40; }) == std::vector<int>{40});
  CHECK(parked.size() == 0);
}

// A seeded simulation of N workers on one key under the controller alone: each step a
// random worker either pushes 1, ticks and reads (if allowed), or leaves. Checks the
// guarantees (b), (c), (e), (f) of the consistency issue against the model.
TEST_CASE("randomized: reads see N(c-s) plus own pushes, never more than pushed; lead <= s+1") {
  for (std::uint64_t s : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{3}, infinite_staleness})
    for (std::uint64_t seed = 1; seed <= 20; ++seed) {
      const std::uint32_t n = 4;
      const std::uint64_t iters = 12;
      staleness_controller ctl(n, s);
      std::mt19937_64 rng(seed);
      std::uint64_t total = 0;               // pushes applied
      std::vector<std::uint64_t> clock(n, 0);
      std::vector<std::vector<std::uint64_t>> pushes_by_clock(n);  // per worker: clocks pushed
      std::vector<bool> waiting(n, false), done(n, false);
      std::uint32_t leaver = static_cast<std::uint32_t>(rng() % n);
      for (int step = 0; step < 10000; ++step) {
        std::uint32_t w = static_cast<std::uint32_t>(rng() % n);
        if (done[w]) continue;
        if (!waiting[w]) {
          if (w == leaver && clock[w] == iters / 2) {  // (f): one worker leaves midway
            ctl.clocks().leave(w);
            done[w] = true;
            continue;
          }
          ++total;  // push of clock c, then tick to c + 1 and read at c + 1
          pushes_by_clock[w].push_back(clock[w]);
          ctl.clocks().advance(w, ++clock[w]);
          waiting[w] = true;
        }
        if (!ctl.may_read(clock[w])) continue;  // (a) holds by construction here
        waiting[w] = false;
        // The value a read at clock c sees: everything pushed so far (pushes apply on
        // arrival), which must include every push with clock <= c - s - 1 and its own.
        auto c = clock[w];
        std::uint64_t guaranteed = 0;
        for (std::uint32_t o = 0; o < n; ++o)
          for (auto pc : pushes_by_clock[o])
            if (o == w || (s != infinite_staleness && pc + s + 1 <= c)) ++guaranteed;
        CHECK(total >= guaranteed);
        if (s == 0) {  // (c): exactly N*c from the live workers' view: all pushes below c
          std::uint64_t below = 0;
          for (std::uint32_t o = 0; o < n; ++o)
            for (auto pc : pushes_by_clock[o]) below += pc < c ? 1 : 0;
          CHECK(below == guaranteed);
        }
        // (e): the reader is at most s + 1 clocks ahead of the slowest live worker.
        auto m = ctl.clocks().min_clock();
        if (s != infinite_staleness && m != left_clock) CHECK(c - m <= s + 1);
        if (clock[w] == iters) {
          ctl.clocks().leave(w);
          done[w] = true;
        }
      }
      INFO("s=" << staleness_to_string(s) << " seed=" << seed);
      for (std::uint32_t w = 0; w < n; ++w) CHECK(done[w]);  // (f): nobody is stuck
    }
}

TEST_CASE("trace lines round-trip and bad lines are refused with the reason") {
  trace_event pull{trace_event::pull, 3, 17, 1, 15, 2};
  CHECK(to_json(pull) == R"({"ev":"pull","worker":3,"clock":17,"shard":1,"min_clock":15,"staleness":2})");
  auto back = parse_trace_line(to_json(pull));
  CHECK(back.worker == 3);
  CHECK(back.clock == 17);
  CHECK(back.min_clock == 15);
  CHECK(back.staleness == 2);
  trace_event asp{trace_event::pull, 0, 5, 0, 1, infinite_staleness};
  CHECK(to_json(asp).find("\"staleness\":\"inf\"") != std::string::npos);
  CHECK(parse_trace_line(to_json(asp)).staleness == infinite_staleness);
  trace_event leave{trace_event::leave, 2, 0, 0, 0, 0};
  CHECK(to_json(leave) == R"({"ev":"leave","worker":2,"shard":0})");
  CHECK_THROWS_WITH_AS(parse_trace_line("hello"), doctest::Contains("not a trace line"), bad_request);
  CHECK_THROWS_WITH_AS(parse_trace_line(R"({"ev":"jump","worker":1,"shard":0})"), doctest::Contains("unknown event"), bad_request);
  CHECK_THROWS_WITH_AS(parse_trace_line(R"({"ev":"push","worker":1,"shard":0})"), doctest::Contains("no \"clock\""), bad_request);
  CHECK_THROWS_WITH_AS(parse_trace_line(R"({"ev":"push","worker":"x","clock":1,"shard":0})"), doctest::Contains("\"worker\" is not a number"), bad_request);
  CHECK_THROWS_WITH_AS(parse_trace_line(R"({"ev":"push","worker":x,"clock":1,"shard":0})"), doctest::Contains("not a trace line ([json.exception.parse_error"), bad_request);
}

TEST_CASE("check_trace accepts a BSP history and names each kind of violation") {
  using E = trace_event;
  // Two workers, BSP: both push clock 0, then read at clock 1.
  std::vector<E> good{{E::push, 0, 0, 0, 0, 0}, {E::push, 1, 0, 0, 0, 0},
                      {E::pull, 0, 1, 0, 1, 0}, {E::pull, 1, 1, 0, 1, 0}};
  auto rep = check_trace(good);
  CHECK(rep.violations.empty());
  CHECK(rep.pushes == 2);
  CHECK(rep.pulls == 2);
  // Answered too early: min clock 0 < 1.
  std::vector<E> early{{E::push, 0, 0, 0, 0, 0}, {E::pull, 0, 1, 0, 0, 0}, {E::push, 1, 0, 0, 0, 0}};
  rep = check_trace(early);
  REQUIRE(rep.violations.size() == 2);
  CHECK(rep.violations[0].find("answered while the min clock was 0") != std::string::npos);
  CHECK(rep.violations[1].find("missed worker 1's push of clock 0") != std::string::npos);
  // Read-my-writes under ASP: own push of clock 0 applied after the read at clock 1.
  std::vector<E> rmw{{E::pull, 0, 1, 0, 0, infinite_staleness}, {E::push, 0, 0, 0, 0, 0}};
  rep = check_trace(rmw);
  REQUIRE(rep.violations.size() == 1);
  CHECK(rep.violations[0].find("missed its own push of clock 0") != std::string::npos);
  // BSP reads are exact: a push of clock 1 before a read at clock 1 is a violation.
  std::vector<E> fresh{{E::push, 0, 0, 0, 0, 0}, {E::push, 1, 0, 0, 0, 0}, {E::push, 1, 1, 0, 0, 0},
                       {E::pull, 0, 1, 0, 1, 0}};
  rep = check_trace(fresh);
  REQUIRE(rep.violations.size() == 1);
  CHECK(rep.violations[0].find("BSP pull by worker 0 at clock 1 saw a push of clock 1") != std::string::npos);
  // Shards are checked separately: a push to another shard after the pull is fine.
  std::vector<E> other{{E::pull, 0, 1, 0, 1, 0}, {E::push, 1, 0, 1, 0, 0}};
  CHECK(check_trace(other).violations.empty());
}

TEST_CASE("check_trace: a read a copy answered after its reader left that copy's clock vector is not bound") {
  using E = trace_event;
  // BSP: worker 1's read at clock 3 was let through, then worker 1 died (its leave line),
  // worker 0's push of clock 3 was applied, and the read answered: nobody waits for it.
  std::vector<E> dead_reader{{E::push, 0, 2, 0, 0, 0}, {E::push, 1, 2, 0, 0, 0}, {E::leave, 1, 0, 0, 0, 0},
                             {E::push, 0, 3, 0, 0, 0}, {E::pull, 1, 3, 0, 3, 0}};
  auto rep = check_trace(dead_reader);
  CHECK(rep.violations.empty());
  CHECK(rep.reads_after_leave == 1);
  CHECK(rep.pulls == 0);
  // The same read answered before the leave line is checked, and fails.
  std::swap(dead_reader[2], dead_reader[4]);
  std::swap(dead_reader[3], dead_reader[2]);
  rep = check_trace(dead_reader);  // push 3, pull, leave
  REQUIRE(rep.violations.size() == 1);
  CHECK(rep.violations[0].find("BSP pull by worker 1 at clock 3 saw a push of clock 3") != std::string::npos);
  // Another copy's leave line says nothing of this copy's vector.
  std::vector<E> other_copy{{E::leave, 1, 0, 0, 0, 0, 7}, {E::push, 0, 3, 0, 0, 0, 9}, {E::pull, 1, 3, 0, 3, 0, 9}};
  CHECK(check_trace(other_copy).violations.size() == 1);
}

TEST_CASE("check_trace: each copy of a shard is its own history") {
  using E = trace_event;
  // ASP, a chain of two copies (ids 7: head, 9: tail). The tail applied worker 0's push of
  // clock 0 before answering its read at clock 1; the head's line for the same push comes
  // later in the file. Not a violation: the head answered no read.
  std::vector<E> chain{{E::push, 0, 0, 0, 0, 0, 9}, {E::pull, 0, 1, 0, 0, infinite_staleness, 9},
                       {E::push, 0, 0, 0, 0, 0, 7}};
  CHECK(check_trace(chain).violations.empty());
  // The same lines from one copy are: its read missed its own write.
  for (auto& e : chain) e.copy = 9;
  std::swap(chain[0], chain[1]);
  auto rep = check_trace(chain);
  REQUIRE(rep.violations.size() == 1);
  CHECK(rep.violations[0].find("missed its own push of clock 0") != std::string::npos);
  // The copy survives the trip through a line; a line without one is copy 0.
  E tagged{E::push, 1, 2, 0, 0, 0, (std::uint64_t{4242} << 32) | 17};
  CHECK(parse_trace_line(to_json(tagged)).copy == tagged.copy);
  CHECK(parse_trace_line(R"({"ev":"push","worker":1,"clock":2,"shard":0})").copy == 0);
}

TEST_CASE("vector clock: a worker joins a running job at a clock; gaps count as left") {
  ps::vector_clock vc(2);
  vc.advance(0, 5);
  vc.advance(1, 7);
  vc.join(3, 5);  // id 2 never came
  CHECK(vc.size() == 4);
  CHECK_FALSE(vc.live(2));
  CHECK(vc.clock(3) == 5);
  CHECK(vc.min_clock() == 5);
  vc.advance(0, 8);
  CHECK(vc.min_clock() == 5);  // the joiner is the slowest now
  CHECK(vc.slowest() == 3);
  vc.advance(3, 9);
  CHECK(vc.min_clock() == 7);
  CHECK_THROWS_AS(vc.join(1, 3), ps::bad_request);
  CHECK_THROWS_AS(vc.join(4, ps::left_clock), ps::bad_request);
}
