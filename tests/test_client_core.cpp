// The client's decisions about its requests without actors (libps/core/client_core.hpp): a
// request issued, sent, answered (or answered late), timed out, a map change's fence and
// clock ticks, event by event.
#include <doctest/doctest.h>

#include "libps/core/client_core.hpp"

using namespace ps;
using std::chrono::milliseconds;

namespace {

// A request as the core sees it; `id` names it in the checks.
struct req {
  int id = 0;
  std::uint64_t bytes = 100;
  bool read = false, write = false, tick = false;
  std::uint64_t plan_epoch = 1;
  std::chrono::steady_clock::time_point sent_at{};
  bool awaiting = true;
  bool timed() const { return awaiting; }
};

req push(int id, std::uint64_t epoch = 1) { return {id, 100, false, true, false, epoch}; }
req pull(int id, std::uint64_t epoch = 1) { return {id, 100, true, false, false, epoch}; }
req tick(int id, std::uint64_t epoch = 1) { return {id, 0, false, false, true, epoch}; }

const auto never_crowded = [] { return false; };
const auto chained = [] { return true; };
const auto one_copy = [] { return false; };

// Sends whatever may leave from shard idx now; the ids sent, in order.
std::vector<int> pump(client_core<req>& core, std::size_t idx, bool down_a_chain = false) {
  std::vector<int> ids;
  auto chain = [=] { return down_a_chain; };
  while (core.why_held(idx, true, chain, never_crowded) == held_by::nothing) {
    auto r = core.take_next(idx);
    ids.push_back(r.id);
    core.sent(idx, std::move(r));
  }
  return ids;
}

}  // namespace

TEST_CASE("client_core: requests leave in order within the in-flight budget; one always may") {
  client_core<req> core({250, 250, false}, 1);
  core.add_flow();
  for (int i = 1; i <= 4; ++i) core.submit(0, push(i));
  CHECK(pump(core, 0) == std::vector<int>{1, 2});  // 300 bytes would pass 250
  CHECK(core.why_held(0, true, one_copy, never_crowded) == held_by::budget);
  CHECK(core.at(0).inflight_bytes == 200);
  auto first = core.at(0).sent.begin()->first;
  auto answered = core.settle(0, first);
  REQUIRE(answered);
  CHECK(answered->id == 1);
  CHECK(pump(core, 0) == std::vector<int>{3});
  client_core<req> tiny({10, 10, false}, 1);  // one request larger than the budget still goes
  tiny.add_flow();
  tiny.submit(0, push(1));
  CHECK(pump(tiny, 0) == std::vector<int>{1});
}

TEST_CASE("client_core: a stale or duplicate reply settles nothing") {
  client_core<req> core({1000, 1000, false}, 1);
  core.add_flow();
  core.submit(0, push(1));
  pump(core, 0);
  auto tag = core.at(0).sent.begin()->first;
  CHECK(core.settle(0, tag));
  CHECK_FALSE(core.settle(0, tag));       // the duplicate answer
  CHECK_FALSE(core.settle(0, tag + 99));  // a tag never sent
  CHECK(core.at(0).inflight_bytes == 0);
  CHECK(core.at(0).idle());
}

TEST_CASE("client_core: nothing leaves to a shard that is down; its requests are taken back in send order") {
  client_core<req> core({150, 150, false}, 1);
  core.add_flow();
  core.submit(0, push(1));
  core.submit(0, push(2));
  pump(core, 0);
  core.submit(0, pull(3));
  CHECK(core.why_held(0, false, one_copy, never_crowded) == held_by::down);
  auto all = core.take_all(0);
  REQUIRE(all.size() == 3);
  CHECK(all[0].id == 1);
  CHECK(all[1].id == 2);
  CHECK(all[2].id == 3);
  CHECK(core.at(0).idle());
  CHECK(core.at(0).inflight_bytes == 0);
}

TEST_CASE("client_core: down a chain a read waits for this client's writes before it") {
  client_core<req> core({1000, 1000, false}, 1);
  core.add_flow();
  core.submit(0, push(1));
  core.submit(0, pull(2));
  CHECK(pump(core, 0, true) == std::vector<int>{1});
  CHECK(core.why_held(0, true, chained, never_crowded) == held_by::read_behind);
  CHECK(core.why_held(0, true, one_copy, never_crowded) == held_by::nothing);  // one copy: no overtaking
  core.settle(0, core.at(0).sent.begin()->first);
  CHECK(pump(core, 0, true) == std::vector<int>{2});
}

TEST_CASE("client_core: with retries a tick waits for the writes before it, a read does not") {
  client_core<req> core({1000, 1000, true}, 1);
  core.add_flow();
  core.submit(0, push(1));
  core.submit(0, tick(2));
  CHECK(pump(core, 0) == std::vector<int>{1});
  CHECK(core.why_held(0, true, one_copy, never_crowded) == held_by::tick_behind);
  client_core<req> reads({1000, 1000, true}, 1);
  reads.add_flow();
  reads.submit(0, push(1));
  reads.submit(0, pull(2));
  CHECK(pump(reads, 0) == std::vector<int>{1, 2});
}

TEST_CASE("client_core: the crowded budget applies only where the host is crowded, and is asked only when it matters") {
  client_core<req> core({1000, 150, false}, 1);
  core.add_flow();
  core.submit(0, push(1));
  core.submit(0, push(2));
  core.sent(0, core.take_next(0));
  int asked = 0;
  auto crowded = [&] { ++asked; return true; };
  CHECK(core.why_held(0, true, one_copy, crowded) == held_by::budget);
  CHECK(asked == 1);
  CHECK(core.why_held(0, true, one_copy, never_crowded) == held_by::nothing);
  client_core<req> roomy({1000, 5000, false}, 1);
  roomy.add_flow();
  roomy.submit(0, push(1));
  roomy.submit(0, push(2));
  roomy.sent(0, roomy.take_next(0));
  asked = 0;
  CHECK(roomy.why_held(0, true, one_copy, crowded) == held_by::nothing);
  CHECK(asked == 0);
}

TEST_CASE("client_core: after a map change reads and ticks of the new map wait until the old map's writes are acknowledged") {
  client_core<req> core({1000, 1000, false}, 1);
  core.add_flow();
  core.add_flow();
  core.submit(0, push(1, 1));
  pump(core, 0);
  auto stale = core.at(0).sent.begin()->first;
  core.map_changed(2);
  CHECK(core.fenced());
  CHECK(core.map_epoch() == 2);
  core.submit(1, pull(2, 2));
  core.submit(1, tick(3, 2));
  CHECK(core.why_held(1, true, one_copy, never_crowded) == held_by::fence);
  core.submit(0, pull(4, 1));  // planned by the old map: never held (writes may queue behind it)
  CHECK(core.why_held(0, true, one_copy, never_crowded) == held_by::nothing);
  CHECK_FALSE(core.lift_fence());  // the stale write is still out
  core.settle(0, stale);
  CHECK(core.lift_fence());
  CHECK_FALSE(core.fenced());
  CHECK(pump(core, 1) == std::vector<int>{2, 3});
}

TEST_CASE("client_core: a stale write still waiting (not sent) holds the fence too") {
  client_core<req> core({1000, 1000, false}, 1);
  core.add_flow();
  core.submit(0, push(1, 1));
  core.map_changed(2);
  CHECK_FALSE(core.lift_fence());
  pump(core, 0);
  core.settle(0, core.at(0).sent.begin()->first);
  CHECK(core.lift_fence());
  CHECK_FALSE(core.lift_fence());  // lifted once
}

TEST_CASE("client_core: overdue requests are those awaited for the timeout; the next due is the oldest's") {
  using clock = std::chrono::steady_clock;
  const clock::time_point t0{};
  client_core<req> core({1000, 1000, false}, 1);
  core.add_flow();
  core.add_flow();
  auto a = push(1);
  a.sent_at = t0;
  auto b = push(2);
  b.sent_at = t0 + milliseconds(40);
  auto c = push(3);
  c.sent_at = t0;
  c.awaiting = false;  // timed out before: kept for a failover, not timed out again
  auto ta = core.sent(0, a);
  core.sent(1, b);
  core.sent(1, c);
  std::optional<clock::time_point> next;
  CHECK(core.overdue(t0 + milliseconds(50), milliseconds(100), next).empty());
  REQUIRE(next);
  CHECK(*next == t0 + milliseconds(100));
  auto late = core.overdue(t0 + milliseconds(100), milliseconds(100), next);
  REQUIRE(late.size() == 1);
  CHECK(late[0] == std::pair<std::size_t, std::uint64_t>{0, ta});
  REQUIRE(next);
  CHECK(*next == t0 + milliseconds(140));
  core.settle(1, 2);
  core.settle(0, ta);
  core.overdue(t0 + milliseconds(200), milliseconds(100), next);
  CHECK_FALSE(next);  // nothing awaited: no sweep
}
