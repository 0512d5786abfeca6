// The fault injector's plan: parsing, errors naming the clause, and seeded decisions.
#include <doctest/doctest.h>

#include <string>

#include "libps/core/duplicate_filter.hpp"
#include "libps/sim/faults.hpp"
#include "libps/keys/keys.hpp"
#include "libps/observe/text.hpp"

using ps::fault_plan;
using ps::parse_faults;

namespace {

std::string error_of(const std::string& spec) {
  try {
    parse_faults(spec);
  } catch (const ps::bad_request& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("faults: every clause kind parses, and the plan prints back to the same plan") {
  auto p = parse_faults(
    "kill server=1 at=20; kill worker=0 at=5 ;slow worker=2 factor=3.5;drop p=0.01 seed=7;"
    "delay ms=4;duplicate p=0.2 seed=9;");
  REQUIRE(p.kills.size() == 2);
  CHECK(p.kill_clock(fault_plan::role::server, 1) == 20u);
  CHECK(p.kill_clock(fault_plan::role::worker, 0) == 5u);
  CHECK_FALSE(p.kill_clock(fault_plan::role::server, 0).has_value());
  CHECK_FALSE(p.kill_clock(fault_plan::role::worker, 1).has_value());
  CHECK(p.slow_factor(2) == doctest::Approx(3.5));
  CHECK(p.slow_factor(0) == 1.0);
  CHECK(p.drop_p == doctest::Approx(0.01));
  CHECK(p.drop_seed == 7);
  CHECK(p.delay_ms == 4);
  CHECK(p.duplicate_p == doctest::Approx(0.2));
  CHECK(p.touches_messages());
  auto again = parse_faults(to_string(p));
  CHECK(to_string(again) == to_string(p));
  CHECK(again.kills.size() == 2);
  CHECK(parse_faults("").empty());
  CHECK(parse_faults(" ; ").empty());
  // A server killed in its first map change instead of at a clock.
  auto in_handoff = parse_faults("kill server=2 at=handoff");
  CHECK(in_handoff.kills_at_handoff(2));
  CHECK_FALSE(in_handoff.kills_at_handoff(1));
  CHECK_FALSE(in_handoff.kill_clock(fault_plan::role::server, 2).has_value());
  CHECK(to_string(in_handoff) == "kill server=2 at=handoff");
  CHECK(parse_faults(to_string(in_handoff)).kills_at_handoff(2));
}

TEST_CASE("faults: bad clauses are refused naming the clause and the problem") {
  struct bad {
    const char* spec;
    const char* expect;
  };
  const bad cases[] = {
    {"kill server=1", "\"kill server=1\": missing at="},
    {"kill worker=1 at=handoff", "at=handoff is not an integer"},
    {"kill at=3", "exactly one of server=I or worker=I"},
    {"kill server=1 worker=2 at=3", "exactly one of server=I or worker=I"},
    {"kill server=x at=3", "server=x is not an integer"},
    {"kill server=-1 at=3", "server=-1 is not an integer"},
    {"kill worker=0 at=0", "at=0"},
    {"kill worker=0 at=2;kill worker=0 at=4", "already killed"},
    {"kill worker=0 at=2 when=now", "unknown argument when="},
    {"explode server=1", "unknown fault \"explode\""},
    {"drop p=2 seed=1", "p=2 is not a number in (0, 0.5]"},
    {"drop p=0 seed=1", "p=0 is not a number"},
    {"drop p=nan seed=1", "p=nan is not a number"},
    {"drop p=0.1", "missing seed="},
    {"drop p=0.1 seed=1;drop p=0.2 seed=2", "drop given twice"},
    {"slow worker=1 factor=0.5", "factor=0.5 is not a number in [1, 1000]"},
    {"delay ms=abc", "ms=abc is not an integer"},
    {"p=0.1", "no fault named"},
    {"kill server=1 at=3 now", "\"now\" after the arguments"},
    {"kill server=1 =3 at=4", "no name before '='"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.spec);
    auto err = error_of(c.spec);
    CHECK(err.rfind("--faults: ", 0) == 0);
    CHECK(err.find(c.expect) != std::string::npos);
  }
}

TEST_CASE("faults: ids are checked against the cluster; killing every worker is refused") {
  auto p = parse_faults("kill server=2 at=3");
  CHECK_THROWS_WITH_AS(p.check_against(2, 2), doctest::Contains("the job has only 2 servers"), ps::bad_request);
  CHECK_NOTHROW(p.check_against(3, 2));
  auto w = parse_faults("kill worker=0 at=3;kill worker=1 at=4");
  CHECK_THROWS_WITH_AS(w.check_against(2, 2), doctest::Contains("every worker is killed"), ps::bad_request);
  CHECK_NOTHROW(w.check_against(2, 3));
  CHECK_THROWS_WITH_AS(parse_faults("slow worker=5 factor=2").check_against(1, 2),
                       doctest::Contains("slow worker=5"), ps::bad_request);
}

TEST_CASE("faults: message decisions are seeded per sender and follow the probabilities") {
  auto p = parse_faults("drop p=0.1 seed=3;duplicate p=0.25 seed=4;delay ms=2");
  ps::message_faults a(p, 1), b(p, 1), other(p, 2);
  int drops = 0, dups = 0, same = 0, differs = 0;
  constexpr int n = 20000;
  for (int i = 0; i < n; ++i) {
    auto va = a.next(), vb = b.next(), vo = other.next();
    CHECK(va.drop == vb.drop);  // same plan, same sender: same sequence
    CHECK(va.duplicate == vb.duplicate);
    CHECK(va.delay_ms == 2u);
    drops += va.drop;
    dups += va.duplicate;
    (va.drop == vo.drop ? same : differs) += 1;
  }
  CHECK(drops > n * 0.08);
  CHECK(drops < n * 0.12);
  CHECK(dups > n * 0.22);
  CHECK(dups < n * 0.28);
  CHECK(differs > 0);  // another sender gets another sequence
  ps::message_faults none(parse_faults(""), 1);
  for (int i = 0; i < 100; ++i) {
    auto v = none.next();
    CHECK_FALSE(v.drop);
    CHECK_FALSE(v.duplicate);
  }
}

TEST_CASE("duplicate filter: each (worker, seq) passes once, out of order too; memory stays bounded") {
  ps::duplicate_filter f(4);
  CHECK(f.first_time(0, 5));
  CHECK(f.first_time(0, 3));  // a resend overtaken by later pushes still counts once
  CHECK_FALSE(f.first_time(0, 5));
  CHECK_FALSE(f.first_time(0, 3));
  CHECK(f.first_time(1, 5));  // another worker's sequence is its own
  for (std::uint64_t s = 6; s < 20; ++s) CHECK(f.first_time(0, s));
  CHECK(f.remembered() <= 4 + 1);
  // Older than the window: counts as seen (never applied twice), the newest stay exact.
  CHECK_FALSE(f.first_time(0, 7));
  CHECK(f.seen(0, 19));
  CHECK_FALSE(f.seen(0, 20));
  CHECK(f.first_time(0, 20));
}

TEST_CASE("duplicate filter: a resend inside the window is found between newer ones; merge keeps both histories") {
  ps::duplicate_filter f(8);
  for (std::uint64_t s : {10, 12, 14, 16}) CHECK(f.first_time(0, s));
  CHECK(f.first_time(0, 13));  // between two remembered ones
  CHECK_FALSE(f.first_time(0, 13));
  CHECK_FALSE(f.seen(0, 11));
  CHECK(f.seen(0, 12));
  ps::duplicate_filter g(8);
  for (std::uint64_t s : {11, 12, 30}) CHECK(g.first_time(0, s));
  CHECK(g.first_time(2, 1));
  f.merge(g);
  for (std::uint64_t s : {10, 11, 12, 13, 14, 16, 30}) CHECK(f.seen(0, s));
  CHECK_FALSE(f.seen(0, 15));
  CHECK(f.seen(2, 1));
  CHECK(f.remembered() == 8);  // 7 of worker 0 (12 once), 1 of worker 2
  // A window of 4 after a merge keeps the newest four; older ones count as seen.
  ps::duplicate_filter small(4);
  small.merge(f);
  CHECK(small.remembered() == 4 + 1);
  CHECK(small.seen(0, 12));  // the floor now: 13, 14, 16 and 30 are kept
  CHECK(small.seen(0, 16));
  CHECK_FALSE(small.seen(0, 15));
}

TEST_CASE("split keeps empty pieces, and the empty text has none") {
  CHECK(ps::split("host,cuda", ',') == std::vector<std::string>{"host", "cuda"});
  CHECK(ps::split("a,,b,", ',') == std::vector<std::string>{"a", "", "b", ""});
  CHECK(ps::split("", ',').empty());
  CHECK(ps::split("one", ';') == std::vector<std::string>{"one"});
}

TEST_CASE("split_flag: a name and the value after the first '=', none without one") {
  auto full = ps::split_flag("--sizes=[1,2]=x");
  CHECK(full.name == "--sizes");
  CHECK(full.value == "[1,2]=x");
  CHECK(full.text == "--sizes=[1,2]=x");
  CHECK(full.needed() == "[1,2]=x");
  auto bare = ps::split_flag("--help");
  CHECK(bare.name == "--help");
  CHECK_FALSE(bare.value.has_value());
  CHECK_THROWS_WITH_AS(bare.needed(), "flag --help needs a value (--name=value)", ps::bad_request);
  CHECK(ps::split_flag("--out=").value == "");
  char prog[] = "prog", one[] = "--a=1", two[] = "--b";
  char* argv[] = {prog, one, two};
  auto flags = ps::split_flags(3, argv);
  REQUIRE(flags.size() == 2);
  CHECK(flags[0].name == "--a");
  CHECK(flags[1].text == "--b");
}

TEST_CASE("numbers in flags: the whole text, no sign on counts, finite") {
  CHECK(ps::parse_count("42") == 42u);
  CHECK(ps::parse_count("18446744073709551615") == UINT64_MAX);
  CHECK_FALSE(ps::parse_count("18446744073709551616").has_value());  // overflow
  for (auto bad : {"", "-1", "+1", " 1", "1 ", "1x", "0x10"}) CHECK_FALSE(ps::parse_count(bad).has_value());
  CHECK(ps::parse_number("0.25") == 0.25);
  CHECK(ps::parse_number("-3e2") == -300.0);
  for (auto bad : {"", "nan", "inf", "1.5.2", " 1", "1,5"}) CHECK_FALSE(ps::parse_number(bad).has_value());
}
