// The bulk data path's pure parts: frame headers and the payload store.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include "libps/net/bulk.hpp"
#include "libps/keys/keys.hpp"

using namespace ps;
using namespace std::chrono_literals;

namespace {

std::string refusal(std::array<std::byte, bulk_header_bytes> raw) {
  try {
    decode_bulk_header(raw);
  } catch (const bad_request& e) {
    return e.what();
  }
  return "";
}

// A header with one 8-byte field replaced (the check word then no longer fits).
std::array<std::byte, bulk_header_bytes> with_field(std::array<std::byte, bulk_header_bytes> raw, std::size_t at,
                                                    std::uint64_t v) {
  std::memcpy(raw.data() + at, &v, sizeof(v));
  return raw;
}

// A payload of these values, as put() takes it.
struct floats {
  std::shared_ptr<std::vector<float>> values;
  std::uint64_t count;
  floats(std::vector<float> v) : values(std::make_shared<std::vector<float>>(v)), count(v.size()) {}
};

void put(payload_store& store, std::uint64_t origin, std::uint64_t ticket, floats f) {
  store.put(origin, ticket, f.values, f.count);
}

}  // namespace

TEST_CASE("bulk headers round trip and refuse what is not one, naming the fault") {
  auto raw = encode_bulk_header({bulk_kind::payload, 77, 4 << 20});
  auto h = decode_bulk_header(raw);
  CHECK(h.kind == bulk_kind::payload);
  CHECK(h.id == 77);
  CHECK(h.bytes == (4u << 20));
  auto hello = decode_bulk_header(encode_bulk_header({bulk_kind::hello, 0xabcdef, 0}));
  CHECK(hello.kind == bulk_kind::hello);
  CHECK(hello.id == 0xabcdef);

  auto garbage = raw;
  garbage[0] = std::byte{'G'};
  CHECK(refusal(garbage).find("bad magic") != std::string::npos);
  CHECK(refusal(with_field(raw, 16, 5 << 20)).find("check word") != std::string::npos);  // size changed in flight
  CHECK(refusal(encode_bulk_header({static_cast<bulk_kind>(9), 1, 0})).find("unknown data-connection frame kind 9") !=
        std::string::npos);
  CHECK(refusal(encode_bulk_header({bulk_kind::payload, 1, 6})).find("not a whole number of floats") !=
        std::string::npos);
  CHECK(refusal(encode_bulk_header({bulk_kind::payload, 1, bulk_max_payload + 4})).find("exceeds the limit") !=
        std::string::npos);
  CHECK(refusal(encode_bulk_header({bulk_kind::hello, 1, 4})).find("hello frame announces") != std::string::npos);
  // Shared-memory frames: a ring names its maker's pid, an answer is 1 or 0.
  CHECK(decode_bulk_header(encode_bulk_header({bulk_kind::ring, 7, 4242})).bytes == 4242);
  CHECK(refusal(encode_bulk_header({bulk_kind::ring, 0, 4242})).find("ring frame with nonce 0") != std::string::npos);
  CHECK(refusal(encode_bulk_header({bulk_kind::ring, 7, 1ull << 40})).find("ring frame") != std::string::npos);
  CHECK(decode_bulk_header(encode_bulk_header({bulk_kind::ring_ok, 7, 1})).bytes == 1);
  CHECK(refusal(encode_bulk_header({bulk_kind::ring_ok, 7, 2})).find("ring_ok frame with answer 2") != std::string::npos);
  CHECK(refusal(encode_bulk_header({bulk_kind::ring_payload, 1, 6})).find("not a whole number") != std::string::npos);
  // Message frames: the body is CAF's (0) or typed (1).
  CHECK(decode_bulk_header(encode_bulk_header({bulk_kind::message, 1, 64})).id == 1);
  CHECK(refusal(encode_bulk_header({bulk_kind::message, 2, 64})).find("body is of unknown form 2") != std::string::npos);
}

TEST_CASE("the payload store hands each payload to its claim once, also when the claim comes first") {
  payload_store store(10s);
  put(store, 1, 5, floats({1.0f, 2.0f}));
  CHECK(*store.take(1, 5, 2, 1s, "peer").owned == std::vector<float>{1.0f, 2.0f});
  CHECK(store.waiting() == 0);
  // The claim waits for a payload that arrives later (the message overtook it).
  std::thread reader([&] { put(store, 2, 9, floats({3.0f})); });
  CHECK(*store.take(2, 9, 1, 10s, "peer").owned == std::vector<float>{3.0f});
  reader.join();
}

TEST_CASE("payload claims fail with a reason: closed origin, wrong size, timeout") {
  payload_store store(10s);
  put(store, 1, 1, floats({1.0f}));
  store.close_origin(1, "the data connection from 127.0.0.1:5 ended (closed by the peer)");
  CHECK(*store.take(1, 1, 1, 1s, "peer").owned == std::vector<float>{1.0f});  // arrived before the end: still there
  try {
    store.take(1, 2, 3, 10s, "127.0.0.1:5");  // fails at once, not after 10 s
    FAIL("no error");
  } catch (const bad_request& e) {
    CHECK(std::string(e.what()).find("payload 2 (3 floats) from 127.0.0.1:5 did not arrive: the data connection") !=
          std::string::npos);
  }
  store.open_origin(1);  // a new connection: claims wait again
  put(store, 1, 3, floats({1.0f, 2.0f}));
  CHECK_THROWS_WITH_AS(store.take(1, 3, 4, 1s, "p"), doctest::Contains("delivered 2 floats"), bad_request);
  CHECK_THROWS_WITH_AS(store.take(7, 1, 1, 1ms, "p"), doctest::Contains("did not arrive within 1 ms"), bad_request);
}

TEST_CASE("a payload that landed in place is claimed as null with its count checked") {
  payload_store store(10s);
  store.put(3, 4, nullptr, 1000);
  auto in_place = store.take(3, 4, 1000, 1s, "p");
  CHECK(in_place.owned == nullptr);
  CHECK(in_place.lent == nullptr);
  store.put(3, 5, nullptr, 1000);
  CHECK_THROWS_WITH_AS(store.take(3, 5, 999, 1s, "p"), doctest::Contains("delivered 1000 floats"), bad_request);
}

TEST_CASE("unclaimed payloads are dropped once they are older than the orphan limit") {
  payload_store store(0ms);  // every payload is an orphan by the next put
  put(store, 1, 1, floats({1.0f}));
  put(store, 1, 2, floats({2.0f}));
  CHECK(store.waiting() == 1);
  CHECK(*store.take(1, 2, 1, 1s, "p").owned == std::vector<float>{2.0f});
}

TEST_CASE("the buffer pool hands a released buffer out again without touching it, up to its bound") {
  auto pool = buffer_pool::make(8 * 1024 * sizeof(float));
  const float* first = nullptr;
  {
    auto b = pool->get(1024);
    REQUIRE(b->size() == 1024);
    std::fill(b->begin(), b->end(), 7.0f);
    first = b->data();
  }
  CHECK(pool->free_bytes() == 1024 * sizeof(float));
  {
    auto again = pool->get(1024);
    CHECK(again->data() == first);  // the same memory ...
    CHECK((*again)[1023] == 7.0f);  // ... not zeroed
    CHECK(pool->free_bytes() == 0);
    auto other = pool->get(512);  // nothing free: a new buffer
    CHECK(other->data() != first);
  }
  CHECK(pool->free_bytes() == 1536 * sizeof(float));
  auto big = pool->get(16 * 1024);
  big.reset();  // above the bound: freed, not kept
  CHECK(pool->free_bytes() == 1536 * sizeof(float));
  auto moved = pool->get(1024);
  std::vector<float> taken = std::move(*moved);  // its memory leaves with the caller
  moved.reset();
  CHECK(pool->free_bytes() == 512 * sizeof(float));
  auto outlives = pool->get(16);
  pool.reset();
  outlives.reset();  // the pool is gone: the buffer is simply freed
}

TEST_CASE("the buffer pool hands out the buffer given back last (the one likeliest in cache)") {
  auto pool = buffer_pool::make(1 << 20);
  auto a = pool->get(1024), b = pool->get(1024), c = pool->get(1024);
  const float* pa = a->data();
  const float* pc = c->data();
  a.reset();
  b.reset();
  c.reset();  // given back last
  CHECK(pool->get(1024)->data() == pc);
  auto d = pool->get(1024);  // c again (returned at once above), then b, then a
  auto e = pool->get(1024);
  auto f = pool->get(1024);
  CHECK(f->data() == pa);
  // A buffer of the exact size wins over a larger one given back later (nothing to resize).
  auto small = pool->get(512);
  const float* psmall = small->data();
  small.reset();
  d.reset();
  CHECK(pool->get(512)->data() == psmall);
}

TEST_CASE("the payload store without waiting: try_take says not yet; on_ready fires once, when it lands or its connection ends") {
  payload_store store(10s);
  CHECK(!store.try_take(1, 5, 2, "peer"));  // not yet, and no wait
  int fired = 0;
  store.on_ready(1, 5, [&] { ++fired; });
  CHECK(fired == 0);
  put(store, 1, 6, floats({9.0f}));  // another payload: not this one's signal
  CHECK(fired == 0);
  put(store, 1, 5, floats({1.0f, 2.0f}));
  CHECK(fired == 1);
  auto got = store.try_take(1, 5, 2, "peer");
  REQUIRE(got);
  CHECK(*got->owned == std::vector<float>{1.0f, 2.0f});
  store.on_ready(1, 6, [&] { ++fired; });  // there already: at once
  CHECK(fired == 2);
  store.on_ready(2, 1, [&] { ++fired; });
  store.close_origin(2, "the data connection from 127.0.0.1:6 ended");
  CHECK(fired == 3);  // the end of its connection is news too: the claim fails now
  CHECK_THROWS_WITH_AS(store.try_take(2, 1, 1, "127.0.0.1:6"), doctest::Contains("did not arrive: the data connection"),
                       bad_request);
  put(store, 1, 7, floats({1.0f}));
  CHECK_THROWS_WITH_AS(store.try_take(1, 7, 3, "p"), doctest::Contains("delivered 1 floats"), bad_request);
}

TEST_CASE("lent payloads nobody claimed are copied out on demand, so their ring can move on; claimed ones are left") {
  payload_store store(10s);
  std::vector<float> ring_bytes{1.0f, 2.0f, 3.0f, 4.0f};
  auto returned = std::make_shared<int>(0);
  auto lend = [&](std::size_t at) {
    landed_values v;
    v.lent = std::shared_ptr<const float>(ring_bytes.data() + at, [returned](const float*) { ++*returned; });
    return v;
  };
  store.put(1, 1, lend(0), 2);
  store.put(1, 2, lend(2), 2);
  store.put(2, 1, lend(0), 4);  // another origin's ring: not this one's to copy
  auto claimed = store.try_take(1, 1, 2, "peer");
  REQUIRE(claimed);
  CHECK(claimed->lent.get() == ring_bytes.data());
  std::size_t asked = 0;
  auto copy = [&](const float* from, std::size_t n) {
    asked += n;
    return std::make_shared<std::vector<float>>(from, from + n);
  };
  CHECK(store.own_lent(1, copy) == 1);
  CHECK(asked == 2);
  CHECK(*returned == 1);  // ticket 2 went back to its ring at once; ticket 1 is still out
  auto copied = store.try_take(1, 2, 2, "peer");
  REQUIRE(copied);
  CHECK(copied->lent == nullptr);
  CHECK(*copied->owned == std::vector<float>{3.0f, 4.0f});
  CHECK(store.own_lent(1, copy) == 0);
  claimed.reset();
  CHECK(*returned == 2);
}
