// The shared-memory ring between processes (libps/net/shm_ring): bytes in order across the
// wrap-around, a reader in another process, and a writer that dies mid-payload.
#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "libps/keys/keys.hpp"
#include "libps/net/shm_ring.hpp"

using namespace ps;
using namespace std::chrono_literals;

namespace {

std::uint64_t fresh_nonce() { return std::random_device{}() * 0x9E3779B97F4A7C15ull + 1; }

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  std::mt19937 rng(seed);
  for (auto& b : v) b = static_cast<std::byte>(rng());
  return v;
}

bool ring_listed(const std::string& name) { return ::access(("/dev/shm" + name).c_str(), F_OK) == 0; }

// 3 payloads, 3.5 MiB in all through a 1 MiB ring, the reader taking them in other cuts;
// both sides poll for `poll` before each wait.
void check_whole_and_in_order(std::chrono::microseconds poll) {
  auto nonce = fresh_nonce();
  auto ring = shm_ring::create(nonce, 1u << 20);
  REQUIRE(ring_listed(ring->name()));
  std::string why;
  auto peer = shm_ring::open(static_cast<std::uint32_t>(::getpid()), nonce, &why);
  REQUIRE_MESSAGE(peer, why);
  CHECK_FALSE(ring_listed(ring->name()));  // the name goes once both have it mapped
  auto budget = std::make_shared<const std::atomic<std::int64_t>>(poll.count());
  ring->poll_before_waiting(budget);
  peer->poll_before_waiting(budget);

  std::vector<std::vector<std::byte>> sent{pattern(2'500'001, 1), pattern(7, 2), pattern(1'200'000, 3)};
  std::thread writer([&] {
    std::string wwhy;
    for (auto& p : sent) {
      std::span<const std::byte> halves[] = {std::span<const std::byte>(p).first(p.size() / 2),
                                             std::span<const std::byte>(p).subspan(p.size() / 2)};
      CHECK(ring->write(halves, {}, 5s, &wwhy));
    }
  });
  for (auto& p : sent) {
    std::vector<std::byte> got(p.size());
    std::span<std::byte> cut[] = {std::span<std::byte>(got).first(got.size() / 3),
                                  std::span<std::byte>(got).subspan(got.size() / 3)};
    REQUIRE_MESSAGE(peer->read(cut, {}, 5s, &why), why);
    CHECK(got == p);
  }
  writer.join();
  CHECK(peer->consumed() == 2'500'001u + 7 + 1'200'000);
  CHECK(ring->written() == peer->consumed());
}

}  // namespace

TEST_CASE("shm ring: payloads larger than the ring arrive whole and in order, in pieces of any size") {
  check_whole_and_in_order(std::chrono::microseconds(0));
}

TEST_CASE("shm ring: sides that poll before they wait move the same bytes, whether the poll finds the other side "
          "or runs out") {
  check_whole_and_in_order(std::chrono::microseconds(200));  // found mostly
  check_whole_and_in_order(std::chrono::microseconds(1));    // runs out: they sleep too
}

TEST_CASE("shm ring: a reader in another process gets the bytes; one in another /dev/shm is told there is no ring") {
  auto nonce = fresh_nonce();
  auto ring = shm_ring::create(nonce, 256u << 10);
  auto payload = pattern(3'000'000, 7);
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // the reader: exit 0 when every byte matched
    std::string why;
    auto peer = shm_ring::open(static_cast<std::uint32_t>(::getppid()), nonce, &why);
    if (!peer) ::_exit(2);
    std::vector<std::byte> got(payload.size());
    std::span<std::byte> all[] = {got};
    ::_exit(peer->read(all, {}, 5s, &why) && got == payload ? 0 : 1);
  }
  std::string why;
  std::span<const std::byte> all[] = {payload};
  CHECK_MESSAGE(ring->write(all, {}, 5s, &why), why);
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  auto missing = shm_ring::open(static_cast<std::uint32_t>(::getpid()), nonce + 1, &why);
  CHECK_FALSE(missing);
  CHECK(why.find("no shared-memory ring /actorps-ring-") != std::string::npos);
}

TEST_CASE("shm ring: a writer that dies mid-payload leaves the reader an error from its alive check, not a wait") {
  auto nonce = fresh_nonce();
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // writes half of 1 MiB into a 4 MiB ring, then dies without a word
    auto ring = shm_ring::create(nonce, 4u << 20);
    auto half = pattern(512u << 10, 9);
    std::string why;
    std::span<const std::byte> all[] = {half};
    ring->write(all, {}, 5s, &why);
    ring.release();  // no destructor: the name stays, as after a SIGKILL
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  std::string why;
  auto peer = shm_ring::open(static_cast<std::uint32_t>(child), nonce, &why);
  REQUIRE_MESSAGE(peer, why);
  std::vector<std::byte> got(1u << 20);
  std::span<std::byte> all[] = {got};
  int checks = 0;
  auto alive = [&]() -> std::string { return ++checks < 3 ? "" : "the data connection ended (closed by the peer)"; };
  CHECK_FALSE(peer->read(all, alive, 60s, &why));
  CHECK(why == "the data connection ended (closed by the peer)");
  CHECK(peer->consumed() == 512u << 10);  // what came before the death was read, no more

  // A ring whose maker died before its peer came is removed by the sweep.
  auto orphan = fresh_nonce();
  pid_t maker = ::fork();
  REQUIRE(maker >= 0);
  if (maker == 0) {
    shm_ring::create(orphan, 256u << 10).release();
    ::_exit(0);
  }
  ::waitpid(maker, &status, 0);
  auto orphan_name = shm_ring::name_of(static_cast<std::uint32_t>(maker), orphan);
  REQUIRE(ring_listed(orphan_name));
  CHECK(remove_stale_rings() >= 1);
  CHECK_FALSE(ring_listed(orphan_name));
}

TEST_CASE("shm ring: a reader that stops reading stalls the writer for its limit, which then fails naming it") {
  auto ring = shm_ring::create(fresh_nonce(), 256u << 10);
  auto payload = pattern(1u << 20, 4);
  std::span<const std::byte> all[] = {payload};
  std::string why;
  CHECK_FALSE(ring->write(all, {}, 50ms, &why));
  CHECK(why == "shared-memory ring: no room for 50 ms");
  CHECK(ring->written() == ring->capacity());
}

TEST_CASE("shm ring: a ring larger than /dev/shm can hold is refused at once, naming it, not mapped to crash later") {
  auto nonce = fresh_nonce();
  CHECK_THROWS_WITH_AS(shm_ring::create(nonce, std::size_t{1} << 50),
                       doctest::Contains("No space left on device (/dev/shm is full or too small)"), bad_request);
  CHECK_FALSE(ring_listed(shm_ring::name_of(static_cast<std::uint32_t>(::getpid()), nonce)));
}

namespace {

// A connected pair in this process: the maker writes, the peer reads.
std::pair<std::unique_ptr<shm_ring>, std::unique_ptr<shm_ring>> ring_pair(std::size_t capacity) {
  auto nonce = fresh_nonce();
  auto ring = shm_ring::create(nonce, capacity);
  std::string why;
  auto peer = shm_ring::open(static_cast<std::uint32_t>(::getpid()), nonce, &why);
  REQUIRE_MESSAGE(peer, why);
  return {std::move(ring), std::move(peer)};
}

// limit: how long the write may wait for room. Writes that must succeed wait up to 10 s (a
// bound only against a hang: a thread descheduled on a loaded machine makes the room late);
// a write that must find no room passes a short one.
bool write_record(shm_ring& ring, const std::vector<std::byte>& bytes, std::chrono::milliseconds limit = 10s) {
  std::string why;
  std::span<const std::byte> all[] = {bytes};
  return ring.write(all, {}, limit, &why);
}

std::vector<std::byte> read_record(shm_ring& ring, std::size_t bytes) {
  std::string why;
  std::vector<std::byte> got(bytes);
  std::span<std::byte> all[] = {got};
  REQUIRE_MESSAGE(ring.skip_to_record(bytes, {}, 1s, &why), why);
  REQUIRE_MESSAGE(ring.read(all, {}, 1s, &why), why);
  return got;
}

std::shared_ptr<const std::byte> lend_record(shm_ring& ring, std::size_t bytes) {
  std::string why;
  REQUIRE_MESSAGE(ring.skip_to_record(bytes, {}, 1s, &why), why);
  auto lent = ring.lend(bytes, {}, 1s, &why);
  REQUIRE_MESSAGE(lent, why);
  return lent;
}

bool same(const std::shared_ptr<const std::byte>& lent, const std::vector<std::byte>& bytes) {
  return std::equal(bytes.begin(), bytes.end(), lent.get());
}

}  // namespace

TEST_CASE("shm ring: a second thread that writes while one is writing is refused, naming it, and copies nothing") {
  auto [ring, peer] = ring_pair(256u << 10);
  auto payload = pattern(1u << 20, 4);
  std::span<const std::byte> all[] = {payload};
  std::string first_why;
  // Fills the ring, then waits for room that no reader makes, for 1 s: long enough that
  // the second write below comes while this one is still under way.
  std::thread first([&] { CHECK_FALSE(ring->write(all, {}, 1000ms, &first_why)); });
  while (ring->written() < ring->capacity()) std::this_thread::yield();
  auto other = pattern(100, 5);
  std::span<const std::byte> second[] = {other};
  std::string why;
  CHECK_FALSE(ring->write(second, {}, 50ms, &why));
  CHECK(why == "shared-memory ring " + ring->name() + ": a second thread wrote while one was writing");
  first.join();
  CHECK(first_why == "shared-memory ring: no room for 1000 ms");
  // What the ring holds is the first write's start, untouched by the second.
  auto held = read_record(*peer, ring->capacity());
  CHECK(std::equal(held.begin(), held.end(), payload.begin()));
}

TEST_CASE("shm ring: a record of at most half the ring that would wrap starts over at the ring's start, on both sides") {
  auto [ring, peer] = ring_pair(256u << 10);
  const auto cap = ring->capacity();
  std::vector<std::vector<std::byte>> sent{pattern(100'000, 1), pattern(100'000, 2), pattern(100'000, 3),
                                           pattern(cap / 2 + 4, 4), pattern(12, 5)};
  std::uint64_t expected_end = 0;
  for (auto& p : sent) {
    REQUIRE(write_record(*ring, p));
    CHECK(read_record(*peer, p.size()) == p);
    const bool kept_whole = p.size() <= cap / 2 && expected_end % cap + p.size() > cap;
    if (kept_whole) expected_end += cap - expected_end % cap;  // the skip
    expected_end += p.size();
    CHECK(ring->written() == expected_end);
    CHECK(peer->consumed() == expected_end);
  }
  CHECK(ring->written() > 100'000u * 3 + cap / 2 + 4 + 12);  // the third record was moved, the fourth wraps
}

TEST_CASE("shm ring: a lent record holds its room until returned, in ring order, while later records are read") {
  auto [ring, peer] = ring_pair(256u << 10);
  auto a = pattern(64u << 10, 1), b = pattern(64u << 10, 2), c = pattern(64u << 10, 3);
  REQUIRE(write_record(*ring, a));
  REQUIRE(write_record(*ring, b));
  REQUIRE(write_record(*ring, c));
  auto lent_a = lend_record(*peer, a.size());
  auto lent_b = lend_record(*peer, b.size());
  CHECK(read_record(*peer, c.size()) == c);
  CHECK(same(lent_a, a));
  CHECK(same(lent_b, b));
  CHECK(peer->consumed() == 0);  // a is out: nothing is the writer's again
  lent_b.reset();
  CHECK(peer->consumed() == 0);  // b came back before a
  lent_a.reset();
  CHECK(peer->consumed() == 3 * (64u << 10));
}

namespace {

// A 256 KiB ring whose writer is held: record a (128 KiB) lent, b after it read, no room
// for c.
struct held_ring {
  std::unique_ptr<shm_ring> ring, peer;
  std::vector<std::byte> a, c;
  std::shared_ptr<const std::byte> lent_a;
};

held_ring make_held_ring() {
  auto [ring, peer] = ring_pair(256u << 10);
  held_ring h{std::move(ring), std::move(peer), pattern(128u << 10, 1), pattern(128u << 10, 3), nullptr};
  auto b = pattern(128u << 10, 2);
  REQUIRE(write_record(*h.ring, h.a));
  REQUIRE(write_record(*h.ring, b));
  h.lent_a = lend_record(*h.peer, h.a.size());
  CHECK_FALSE(h.peer->held_by_lent());  // b is still the reader's to take
  CHECK(read_record(*h.peer, b.size()) == b);
  return h;
}

}  // namespace

TEST_CASE("shm ring: a full ring held by a lent record stalls its writer, says so, and moves on once it returns") {
  auto h = make_held_ring();
  CHECK(h.peer->held_by_lent());
  CHECK_FALSE(write_record(*h.ring, h.c, 50ms));  // no room for 50 ms
  CHECK(same(h.lent_a, h.a));               // and a was left alone
  h.lent_a.reset();
  CHECK_FALSE(h.peer->held_by_lent());
  REQUIRE(write_record(*h.ring, h.c));
  CHECK(read_record(*h.peer, h.c.size()) == h.c);
}

TEST_CASE("shm ring: a lent record outlives both ends of its ring; one too large or not skipped to is refused") {
  auto payload = pattern(4096, 8);
  std::shared_ptr<const std::byte> lent;
  {
    auto [ring, peer] = ring_pair(256u << 10);
    REQUIRE(write_record(*ring, payload));
    lent = lend_record(*peer, payload.size());
    REQUIRE(write_record(*ring, pattern(100u << 10, 9)));
    std::string why;
    CHECK_THROWS_WITH_AS(peer->lend(200u << 10, {}, 1s, &why), doctest::Contains("cannot be lent"), bad_request);
  }
  CHECK(same(lent, payload));  // still mapped: the last copy of the loan unmaps it
}

TEST_CASE("shm ring: a reader that waits while lent records hold its writer tells their owner, after a grace") {
  auto h = make_held_ring();
  int told = 0;
  h.peer->when_held_by_lent([&] {  // the owner copies a out (here: drops it) and returns it
    ++told;
    h.lent_a.reset();
  });
  std::thread writer([&] { CHECK(write_record(*h.ring, h.c)); });  // no room until a returns
  CHECK(read_record(*h.peer, h.c.size()) == h.c);
  writer.join();
  CHECK(told == 1);
}
