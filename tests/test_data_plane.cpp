// The data plane over real loopback sockets, in one process: payloads both ways
// bit-exact, small blocks left to CAF, and a peer that sends garbage or dies in the
// middle of a payload gives a claim error naming the connection, not a hang.
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <thread>

#include "actors/data_plane.hpp"
#include "libps/net/shm_ring.hpp"
#include "raw_peer.hpp"

using namespace ps;
using namespace ps::test;
using namespace std::chrono_literals;

namespace {

float_block special_values(std::size_t n) {
  std::vector<float> v(n);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f, 1e-45f, std::bit_cast<float>(0x7fc12345u)};
  for (std::size_t i = 0; i < n; ++i) v[i] = i < 6 ? specials[i] : static_cast<float>(i);
  return float_block::own(std::move(v));
}

bool same_bits(const float_block& a, const float_block& b) {
  return a.size == b.size && std::memcmp(a.data(), b.data(), a.size * sizeof(float)) == 0;
}

// A worker's plane connected to a server's, both offering rings of `ring` bytes, with
// the planes' claim and stall timeouts.
struct ring_planes {
  ring_planes(std::size_t ring, std::chrono::milliseconds claim, std::chrono::milliseconds stall)
      : worker("127.0.0.1", 1024, claim, stall, std::nullopt, ring),
        server("127.0.0.1", 1024, claim, stall, std::nullopt, ring) {
    std::string why;
    REQUIRE_MESSAGE(worker.connect(server.token(), "127.0.0.1", server.port(), &why), why);
  }
  data_plane worker;
  data_plane server;
};

}  // namespace

TEST_CASE("data plane: large blocks cross both ways bit-exact; small ones stay with CAF") {
  data_plane worker("127.0.0.1", 1024, 10s, 10s);
  data_plane server("127.0.0.1", 1024, 10s, 10s);
  CHECK(worker.token() != server.token());
  std::string why;
  REQUIRE(worker.connect(server.token(), "127.0.0.1", server.port(), &why));
  CHECK(!worker.offload(server.token(), special_values(100)));  // 400 bytes: below the limit
  CHECK(!worker.offload(12345, special_values(1000)));           // no connection to that peer
  auto push = special_values(1 << 20);
  auto named = worker.offload(server.token(), push);
  REQUIRE(named);
  CHECK(named->ticket != 0);
  CHECK(!named->storage);
  CHECK(named->origin == worker.token());
  CHECK(same_bits(server.claim(*named), push));
  // The connection the worker opened carries the server's answers back; its hello came
  // before the payload just claimed, so the server knows it by now.
  auto pull = special_values(300000);
  auto answer = server.offload(worker.token(), pull);
  REQUIRE(answer);
  CHECK(same_bits(worker.claim(*answer), pull));
  CHECK(worker.bytes_sent() == push.size * sizeof(float));
  CHECK(worker.bytes_received() == pull.size * sizeof(float));
  // A block that holds its values is its own claim.
  CHECK(same_bits(server.claim(push), push));
}

TEST_CASE("data plane: an expected answer is read straight into the places named for it") {
  data_plane worker("127.0.0.1", 1024, 10s, 10s);
  data_plane server("127.0.0.1", 1024, 10s, 10s);
  std::string why;
  REQUIRE(worker.connect(server.token(), "127.0.0.1", server.port(), &why));
  // The server learns the worker's token from its hello, which precedes this payload.
  auto hello_done = worker.offload(server.token(), special_values(1024));
  REQUIRE(hello_done);
  server.claim(*hello_done);
  // The server's answer lies in two pieces; the worker wants it in two places of its
  // buffer, in another split.
  auto a = special_values(3000), b = special_values(5000);
  std::span<const float> parts[] = {{a.data(), a.size}, {b.data(), b.size}};
  auto dest = std::make_shared<std::vector<float>>(10000, 42.0f);
  worker.expect(server.token(), 7, {{dest->data(), 6000}, {dest->data() + 6500, 2000}}, dest);
  auto named = server.offload(worker.token(), parts, 8000, 7, nullptr);
  REQUIRE(named);
  CHECK(named->ticket == 7);
  auto got = worker.claim(*named);
  CHECK(!got.storage);  // it landed in place
  CHECK(got.size == 8000);
  std::vector<float> sent(a.data(), a.data() + a.size);
  sent.insert(sent.end(), b.data(), b.data() + b.size);
  CHECK(std::memcmp(dest->data(), sent.data(), 6000 * sizeof(float)) == 0);
  CHECK(std::memcmp(dest->data() + 6500, sent.data() + 6000, 2000 * sizeof(float)) == 0);
  CHECK((*dest)[6000] == 42.0f);  // the gap is untouched
  // Withdrawn, or of another size: the payload goes to a buffer of its own.
  worker.expect(server.token(), 8, {{dest->data(), 8000}}, dest);
  worker.forget(server.token(), 8);
  auto again = server.offload(worker.token(), parts, 8000, 8, nullptr);
  REQUIRE(again);
  auto own = worker.claim(*again);
  REQUIRE(own.storage);
  CHECK(std::memcmp(own.data(), sent.data(), 8000 * sizeof(float)) == 0);
  worker.expect(server.token(), 9, {{dest->data(), 10}}, dest);
  auto third = server.offload(worker.token(), parts, 8000, 9, nullptr);
  REQUIRE(third);
  CHECK(worker.claim(*third).storage);
}

TEST_CASE("data plane: a peer that sends garbage is cut off") {
  data_plane server("127.0.0.1", 1024, 10s, 10s);
  int fd = raw_connection(server);
  char garbage[bulk_header_bytes];
  std::memset(garbage, 'x', sizeof(garbage));
  write_bytes(fd, garbage, sizeof(garbage));
  char byte;
  CHECK(::recv(fd, &byte, 1, 0) == 0);  // the plane closed the connection (it logs why)
  ::close(fd);
}

TEST_CASE("data plane: connections that come and go leave no descriptors or threads behind") {
  auto open_fds = [] {
    std::size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  data_plane server("127.0.0.1", 1024, 10s, 10s);
  const auto before = open_fds();
  char garbage[bulk_header_bytes];
  std::memset(garbage, 'x', sizeof(garbage));
  for (int i = 0; i < 300; ++i) {
    // Each is cut off for garbage, so the plane has ended it before the next comes.
    int fd = raw_connection(server);
    write_bytes(fd, garbage, sizeof(garbage));
    char byte;
    REQUIRE(::recv(fd, &byte, 1, 0) == 0);
    ::close(fd);
  }
  const auto after = open_fds();
  // The figure docs/wire-and-caf.md quotes (test_actors -tc='data plane: connections*').
  MESSAGE(before << " descriptors before 300 connections came and went, " << after << " after");
  CHECK(after <= before + 20);  // the last few may not be reaped yet; each accept reaps the ended ones
}

TEST_CASE("data plane: a peer that dies in the middle of a payload fails the claim at once, naming it") {
  data_plane server("127.0.0.1", 1024, 30s, 10s);
  int fd = raw_connection(server);
  const std::uint64_t token = 0x5eed;
  auto hello = encode_bulk_header({bulk_kind::hello, token, 0});
  auto header = encode_bulk_header({bulk_kind::payload, 1, 4000});
  std::vector<float> part(100, 1.0f);
  write_bytes(fd, hello.data(), hello.size());
  write_bytes(fd, header.data(), header.size());
  write_bytes(fd, part.data(), part.size() * sizeof(float));
  ::close(fd);
  float_block named;
  named.size = 1000;
  named.ticket = 1;
  named.origin = token;
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(server.claim(named), doctest::Contains("in the middle of payload 1"), bad_request);
  CHECK(std::chrono::steady_clock::now() - start < 20s);  // the end of the connection, not the 30 s limit
}

TEST_CASE("data plane: with rings on both sides payloads cross through shared memory both ways, bit-exact and "
          "into expected places; a side without rings keeps both ways on TCP") {
  ring_planes planes(1u << 20, 10s, 10s);  // rings smaller than the payloads: they wrap around them
  auto& [worker, server] = planes;     // connect waited for the ring's answer
  auto push = special_values(3 << 20);
  auto named = worker.offload(server.token(), push);
  REQUIRE(named);
  CHECK(same_bits(server.claim(*named), push));
  CHECK(worker.shm_bytes_sent() == push.size * sizeof(float));
  // The server's answer, into two places of the worker's buffer; its ring was answered
  // before the push above came (the same connection, in order).
  auto a = special_values(300000), b = special_values(500000);
  std::span<const float> parts[] = {{a.data(), a.size}, {b.data(), b.size}};
  auto dest = std::make_shared<std::vector<float>>(900000, 42.0f);
  worker.expect(server.token(), 7, {{dest->data(), 600000}, {dest->data() + 650000, 200000}}, dest);
  auto answer = server.offload(worker.token(), parts, 800000, 7, nullptr);
  REQUIRE(answer);
  CHECK(!worker.claim(*answer).storage);  // in place
  CHECK(std::memcmp(dest->data(), a.data(), 300000 * sizeof(float)) == 0);
  CHECK(std::memcmp(dest->data() + 300000, b.data(), 300000 * sizeof(float)) == 0);
  CHECK(std::memcmp(dest->data() + 650000, b.data() + 300000, 200000 * sizeof(float)) == 0);
  CHECK((*dest)[600000] == 42.0f);
  CHECK(server.shm_bytes_sent() == 800000 * sizeof(float));

  data_plane tcp_only("127.0.0.1", 1024, 10s, 10s);  // --ps.shm-ring-bytes=0
  std::string why;
  REQUIRE_MESSAGE(worker.connect(tcp_only.token(), "127.0.0.1", tcp_only.port(), &why), why);
  auto before = worker.shm_bytes_sent();
  auto over_tcp = worker.offload(tcp_only.token(), push);
  REQUIRE(over_tcp);
  CHECK(same_bits(tcp_only.claim(*over_tcp), push));
  CHECK(worker.shm_bytes_sent() == before);
  CHECK(worker.bytes_sent() == before + push.size * sizeof(float));
}

TEST_CASE("data plane: an answer above 2 MiB streams behind its header; pushes, small answers and "
          "answers of a plane told not to go in before it") {
  ring_planes planes(8u << 20, 10s, 10s);  // room for every payload here
  auto& [worker, server] = planes;
  auto push = special_values(1 << 20);  // 4 MiB under a ticket of the plane's own
  auto named = worker.offload(server.token(), push);
  REQUIRE(named);
  CHECK(same_bits(server.claim(*named), push));
  CHECK(worker.streamed_payloads() == 0);
  CHECK(worker.shm_bytes_sent() == push.size * sizeof(float));

  // One answer of `count` floats under `ticket`, checked bit-exact in place; true when it
  // streamed.
  auto answer_streamed = [&](std::uint64_t count, std::uint64_t ticket) {
    auto answer = special_values(count);
    std::span<const float> whole{answer.data(), answer.size};
    auto dest = std::make_shared<std::vector<float>>(count, 42.0f);
    const auto before = server.streamed_payloads();
    worker.expect(server.token(), ticket, {{dest->data(), count}}, dest);
    auto sent = server.offload(worker.token(), std::span(&whole, 1), count, ticket, nullptr);
    REQUIRE(sent);
    CHECK(!worker.claim(*sent).storage);  // into place
    CHECK(std::memcmp(dest->data(), answer.data(), count * sizeof(float)) == 0);
    return server.streamed_payloads() == before + 1;
  };
  const std::uint64_t streams = data_plane::default_streamed_above / sizeof(float) + 1;
  for (std::uint64_t count : {std::uint64_t{1} << 20, std::uint64_t{32} << 10, streams, streams - 1})  // 4 MiB, 128 KiB
    CHECK(answer_streamed(count, count) == (count >= streams));
  server.stream_answers_above(~std::uint64_t{0});
  CHECK_FALSE(answer_streamed(streams, 99));
}

TEST_CASE("data plane: a lending plane's ring payload is lent in place to a claimer that asks; ones nobody claimed "
          "are copied out when the ring's writer needs their room; a plane not lending copies on arrival") {
  constexpr std::size_t ring = 256u << 10;  // payloads of 100 kB: two fit, the third waits for room
  // A 2 s stall limit: a writer left waiting on lent payloads fails its connection, and
  // every claim below with it.
  ring_planes planes(ring, 10s, 2s);
  auto& [worker, server] = planes;
  server.lend_ring_payloads();  // before any payload comes
  auto landed = [&](const float_block& named) {
    std::promise<void> ready;
    server.when_claimable(named, [&] { ready.set_value(); });
    ready.get_future().wait();
  };

  auto first = special_values(25000);
  auto named = worker.offload(server.token(), first);
  REQUIRE(named);
  landed(*named);
  auto in_place = server.try_claim(*named, true);
  REQUIRE(in_place);
  CHECK(in_place->lent);
  CHECK(!in_place->storage);
  CHECK(same_bits(*in_place, first));
  in_place.reset();  // back to the ring

  std::vector<float_block> sent, names;
  for (int i = 0; i < 6; ++i) {
    sent.push_back(special_values(25000));
    std::vector<float> v(sent.back().data(), sent.back().data() + 25000);
    v[7] = static_cast<float>(i);
    sent.back() = float_block::own(std::move(v));
    auto n = worker.offload(server.token(), sent.back());
    REQUIRE(n);
    names.push_back(*n);
  }
  for (int i = 5; i >= 0; --i) {  // the last first: all six landed before any claim
    auto got = server.claim(names[i]);
    CHECK(got.storage);  // copied out: by the reader to make room, or by claim (no lent_ok)
    CHECK(same_bits(got, sent[i]));
  }
  CHECK(worker.shm_bytes_sent() == 7 * 100000u);

  // The worker's plane was not asked to lend: its ring payloads are copied out on arrival.
  auto answer = server.offload(worker.token(), first);
  REQUIRE(answer);
  std::promise<void> ready;
  worker.when_claimable(*answer, [&] { ready.set_value(); });
  ready.get_future().wait();
  auto copied = worker.try_claim(*answer, true);
  REQUIRE(copied);
  CHECK(!copied->lent);
  CHECK(same_bits(*copied, first));
}

TEST_CASE("data plane: ring payloads sent while a write batch is open are written by the sending thread when the "
          "ring has room for them; a larger one streams from the writer thread") {
  ring_planes planes(1u << 20, 10s, 10s);
  auto& [worker, server] = planes;
  const auto handed_over = worker.writer_thread_writes();
  std::vector<float_block> sent;
  std::vector<float_block> named;
  write_batch batch;
  {
    write_batch::scope open(batch);
    for (std::size_t i = 0; i < 3; ++i) {  // 256 KiB each: all three fit in the ring
      sent.push_back(special_values((64u << 10) + i));
      auto n = worker.offload(server.token(), sent.back());
      REQUIRE(n);
      named.push_back(*n);
    }
  }
  batch.release();
  for (std::size_t i = 0; i < sent.size(); ++i) CHECK(same_bits(server.claim(named[i]), sent[i]));
  CHECK(worker.writer_thread_writes() == handed_over);  // no wake-up of the writer thread
  CHECK(worker.shm_bytes_sent() == 3 * (64u << 10) * sizeof(float) + 3 * sizeof(float));

  auto large = special_values(3u << 20);  // 12 MiB through a 1 MiB ring
  {
    write_batch::scope open(batch);
    auto n = worker.offload(server.token(), large);
    REQUIRE(n);
    named.push_back(*n);
  }
  batch.release();
  CHECK(same_bits(server.claim(named.back()), large));
  CHECK(worker.writer_thread_writes() == handed_over + 1);
}

TEST_CASE("data plane: a batch's flush leaves what is left to the writer thread once that thread took a frame; "
          "payloads never go out from two threads at once") {
  ring_planes planes(4u << 20, 5s, 5s);
  auto& [worker, server] = planes;
  // Each round a batch holds 30 payloads (each under hold_bytes: held until release). Its
  // flush writes the first; that one's `keep` goes without the connection's lock and
  // sends one more, which wakes the writer thread, and waits until that thread took the
  // next. A flush that wrote on would then write beside it: into the ring at once
  // (refused there: the connection ends) or in another order than its headers (payloads
  // swapped). The writer thread may still be busy with the round before when a batch is
  // released; then it writes the first payload itself and the round does not count.
  struct round_hook {
    std::atomic<bool> armed{false};  // only while this thread releases the batch
    std::thread::id releaser = std::this_thread::get_id();
    std::optional<float_block> woke_with;
    bool writer_took_one = false;
  };
  constexpr std::size_t floats = 15000;  // 60 kB
  constexpr int held = 30;
  int counted = 0;
  for (int round = 0; round < 200 && counted < 20; ++round) {
    std::vector<float_block> sent;
    for (int i = 0; i <= held; ++i) {
      std::vector<float> v(floats, static_cast<float>(round));
      v[0] = static_cast<float>(i);
      sent.push_back(float_block::own(std::move(v)));
    }
    auto hook = std::make_shared<round_hook>();
    const float_block& extra = sent[held];
    auto wake_writer = [&worker, &server, &extra, hook](const void*) {
      if (!hook->armed.exchange(false) || std::this_thread::get_id() != hook->releaser) return;
      const auto before = worker.writer_thread_writes();
      hook->woke_with = worker.offload(server.token(), extra);
      const auto until = std::chrono::steady_clock::now() + 2s;
      while (!(hook->writer_took_one = worker.writer_thread_writes() > before) &&
             std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
    };
    std::vector<float_block> names;
    write_batch batch;
    {
      write_batch::scope open(batch);
      std::span<const float> first(sent[0].data(), floats);
      auto n = worker.offload(server.token(), std::span<const std::span<const float>>(&first, 1), floats,
                              std::shared_ptr<const void>(nullptr, wake_writer));
      REQUIRE(n);
      names.push_back(*n);
      for (int i = 1; i < held; ++i) {
        n = worker.offload(server.token(), sent[i]);
        REQUIRE(n);
        names.push_back(*n);
      }
    }
    hook->armed = true;
    batch.release();
    hook->armed = false;
    if (hook->woke_with) {
      ++counted;
      names.push_back(*hook->woke_with);
      CHECK(hook->writer_took_one);
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      INFO("round ", round, ", payload ", i);
      REQUIRE(same_bits(server.claim(names[i]), sent[i]));
    }
  }
  CHECK(counted == 20);
}

TEST_CASE("data plane: a peer that dies in the middle of a payload through its ring fails the claim, naming it") {
  data_plane server("127.0.0.1", 1024, 30s, 10s, std::nullopt, 1u << 20);
  SUBCASE("a plane that copies ring payloads out") {}
  SUBCASE("a plane that lends them") { server.lend_ring_payloads(); }
  int fd = raw_connection(server);
  const std::uint64_t token = 0x5eed, nonce = 0xfeed;
  auto ring = shm_ring::create(nonce, 1u << 20);
  auto hello = encode_bulk_header({bulk_kind::hello, token, 0});
  auto offer = encode_bulk_header({bulk_kind::ring, nonce, static_cast<std::uint64_t>(::getpid())});
  write_bytes(fd, hello.data(), hello.size());
  write_bytes(fd, offer.data(), offer.size());
  // The server offers its own ring, then answers ours: mapped.
  std::array<std::byte, bulk_header_bytes> raw;
  for (bool answered = false; !answered;) {
    REQUIRE(::recv(fd, raw.data(), raw.size(), MSG_WAITALL) == static_cast<ssize_t>(raw.size()));
    auto h = decode_bulk_header(raw);
    answered = h.kind == bulk_kind::ring_ok;
    if (answered) CHECK(h.bytes == 1);
  }
  auto header = encode_bulk_header({bulk_kind::ring_payload, 1, 4000});
  write_bytes(fd, header.data(), header.size());
  std::vector<std::byte> part(400, std::byte{1});
  std::span<const std::byte> pieces[] = {part};
  std::string why;
  REQUIRE(ring->write(pieces, {}, 1s, &why));
  ::close(fd);  // dies with 3600 bytes still to come
  float_block named;
  named.size = 1000;
  named.ticket = 1;
  named.origin = token;
  auto start = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH_AS(server.claim(named), doctest::Contains("in the middle of payload 1: the data connection from"),
                       bad_request);
  CHECK(std::chrono::steady_clock::now() - start < 5s);  // the end of the connection, not the 10 s stall limit
}

TEST_CASE("data plane: a payload is queued for the connection's writer, not written by the caller; a stalled write "
          "ends the connection") {
  // A peer that accepts nothing and reads nothing: the kernel takes the connection and a
  // few MiB of it, no more.
  int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  socklen_t len = sizeof(addr);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&addr), len) == 0);
  REQUIRE(::listen(listener, 1) == 0);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  data_plane worker("127.0.0.1", 1024, 10s, 200ms);
  std::string why;
  REQUIRE(worker.connect(99, "127.0.0.1", ntohs(addr.sin_port), &why));
  // 64 MiB cannot be written to this peer: a caller that wrote it would be held for the
  // stall timeout and then get nothing. Queued, it is named at once.
  auto big = float_block::own(std::vector<float>(16u << 20, 1.0f));
  auto named = worker.offload(99, big);
  REQUIRE(named);
  CHECK(named->size == big.size);
  CHECK(named->origin == worker.token());
  // The writer's stall ends the connection. Waiting on it: a claim of anything from that
  // peer fails once its connection ends (within the 10 s claim timeout otherwise),
  // naming the connection and why; later blocks then go back to their callers.
  float_block from_peer;
  from_peer.size = 1;
  from_peer.ticket = 1;
  from_peer.origin = 99;
  CHECK_THROWS_WITH_AS(worker.claim(from_peer), doctest::Contains("no progress for 200 ms"), bad_request);
  CHECK_FALSE(worker.offload(99, special_values(1000)));
  ::close(listener);
}

TEST_CASE("data plane: a claim whose payload never comes fails at the claim timeout") {
  data_plane server("127.0.0.1", 1024, 50ms, 10s);
  float_block named;
  named.size = 10;
  named.ticket = 3;
  named.origin = 99;
  CHECK_THROWS_WITH_AS(server.claim(named), doctest::Contains("did not arrive within 50 ms"), bad_request);
}

TEST_CASE("data plane: a host it cannot listen on is refused, naming it") {
  CHECK_THROWS_WITH_AS(data_plane("no-such-host.invalid", 1024, 1s, 1s), doctest::Contains("'no-such-host.invalid'"),
                       bad_request);
}

namespace {

// A claim the claimer has surely taken in: a second request (answered at once) comes
// back only after the claimer handled the first one (one mailbox, in order).
void synced(caf::scoped_actor& self, const payload_claimer_actor& claimer) {
  self->request(claimer, 10s, claim_atom::value, float_block::own({1.0f})).receive([](float_block&) {},
                                                                                  [](caf::error&) { FAIL("sync"); });
}

}  // namespace

TEST_CASE("data plane: both ends of a connection use their plane's congestion control, or the host's for 'system'") {
  std::string host_default;
  std::ifstream("/proc/sys/net/ipv4/tcp_congestion_control") >> host_default;
  REQUIRE_FALSE(host_default.empty());
  // reno: built into every Linux kernel, and neither this host's default nor the flag's.
  auto server = std::make_shared<data_plane>("127.0.0.1", 1024, 10s, 10s, std::nullopt, 0, 0us, "reno");
  auto worker = std::make_shared<data_plane>("127.0.0.1", 1024, 10s, 10s, std::nullopt, 0, 0us, "reno");
  auto plain = std::make_shared<data_plane>("127.0.0.1", 1024, 10s, 10s, std::nullopt, 0, 0us, host_tcp_congestion);
  std::string why;
  REQUIRE(worker->connect(server->token(), "127.0.0.1", server->port(), &why));
  REQUIRE(plain->connect(server->token(), "127.0.0.1", server->port(), &why));
  // The accepting side adds its ends once it read their hellos; bounded, not a hope.
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (server->congestion_controls(true).size() < 2 && std::chrono::steady_clock::now() < until)
    std::this_thread::yield();
  CHECK(server->congestion_controls(true) == std::vector<std::string>{"reno", "reno"});
  CHECK(worker->congestion_controls(false) == std::vector<std::string>{"reno"});
  CHECK(plain->congestion_controls(false) == std::vector<std::string>{host_default});
}

TEST_CASE("tcp congestion: each algorithm the kernel offers can be set and read back; an unknown one is named") {
  const auto offered = available_tcp_congestion();
  REQUIRE_FALSE(offered.empty());
  for (const auto& name : offered) {
    CHECK(check_tcp_congestion(name).empty());
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    CHECK(set_tcp_congestion(fd, name).empty());
    char got[32] = {};
    socklen_t len = sizeof got;
    REQUIRE(::getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, got, &len) == 0);
    CHECK(std::string(got) == name);
    ::close(fd);
  }
  CHECK(check_tcp_congestion(host_tcp_congestion).empty());
  const auto wrong = check_tcp_congestion("no-such-cc");
  CHECK(wrong.find("'no-such-cc'") != std::string::npos);
  CHECK(wrong.find(offered.front()) != std::string::npos);  // what to pick instead
}

TEST_CASE("payload claimer: a claim made before its payload is answered when it lands, without blocking the actor") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto worker = std::make_shared<data_plane>("127.0.0.1", 1024, 10s, 10s);
  auto server = std::make_shared<data_plane>("127.0.0.1", 1024, 10s, 10s);
  std::string why;
  REQUIRE(worker->connect(server->token(), "127.0.0.1", server->port(), &why));
  auto claimer = sys.spawn(payload_claimer, server, false);
  auto push = special_values(1 << 16);
  float_block named;  // what the push message will say, known before the payload goes
  named.size = push.size;
  named.ticket = 77;
  named.origin = worker->token();
  auto pending = self->request(claimer, 10s, claim_atom::value, named);
  synced(self, claimer);  // the claim is waiting now: the payload has not been sent
  std::span<const float> whole(push.data(), push.size);
  REQUIRE(worker->offload(server->token(), std::span(&whole, 1), push.size, 77, push.storage));
  std::move(pending).receive([&](float_block& got) { CHECK(same_bits(got, push)); },
                             [](caf::error& err) { FAIL(describe(err)); });
  caf::anon_send_exit(claimer, caf::exit_reason::user_shutdown);
}

TEST_CASE("payload claimer: a waiting claim fails when its connection ends, or at the claim timeout, naming the payload") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto server = std::make_shared<data_plane>("127.0.0.1", 1024, 60s, 10s);
  auto claimer = sys.spawn(payload_claimer, server, false);
  int fd = raw_connection(*server);
  const std::uint64_t token = 0x7e57;
  auto hello = encode_bulk_header({bulk_kind::hello, token, 0});
  write_bytes(fd, hello.data(), hello.size());
  float_block named;
  named.size = 10;
  named.ticket = 5;
  named.origin = token;
  auto pending = self->request(claimer, 30s, claim_atom::value, named);
  synced(self, claimer);
  ::close(fd);  // no payload ever: the end of the connection answers the claim, long before 60 s
  std::move(pending).receive([](float_block&) { FAIL("a payload that never came was claimed"); },
                             [](caf::error& err) { CHECK(describe(err).find("payload 5 (10 floats)") != std::string::npos); });
  auto quick = std::make_shared<data_plane>("127.0.0.1", 1024, 50ms, 10s);
  auto impatient = sys.spawn(payload_claimer, quick, false);
  named.origin = 99;  // nobody: only the timeout can answer
  self->request(impatient, 10s, claim_atom::value, named)
    .receive([](float_block&) { FAIL("claimed"); },
             [](caf::error& err) { CHECK(describe(err).find("did not arrive within 50 ms") != std::string::npos); });
  caf::anon_send_exit(claimer, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(impatient, caf::exit_reason::user_shutdown);
}

TEST_CASE("data plane: a connection to an address that never answers gives up at the stall timeout, naming it") {
  data_plane worker("127.0.0.1", 1024, 10s, 200ms);
  std::string why;
  auto start = std::chrono::steady_clock::now();
  // TEST-NET-1 (RFC 5737): nothing answers there (no route: at once; else the SYNs go unanswered).
  CHECK_FALSE(worker.connect(7, "192.0.2.1", 9, &why));
  CHECK(std::chrono::steady_clock::now() - start < 5s);  // not the kernel's two minutes of SYN retries
  CHECK(why.find("data connection to 192.0.2.1:9") != std::string::npos);
}

TEST_CASE("payload claimer: it ends with its owner, also when the owner ends normally with a claim still waiting") {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  auto plane = std::make_shared<data_plane>("127.0.0.1", 1024, 60s, 10s);
  auto claimer_of = std::make_shared<payload_claimer_actor>();
  float_block named;
  named.size = 10;
  named.ticket = 1;
  named.origin = 42;  // never comes: the claim waits (60 s claim timeout)
  auto owner = sys.spawn([=](caf::event_based_actor* me) -> caf::behavior {
    *claimer_of = me->spawn<caf::linked>(payload_claimer, plane, false);
    return {[=](caf::ok_atom) {
      caf::anon_send(*claimer_of, claim_atom::value, named);
      me->quit();  // a normal end, like a shard's after a completed job
    }};
  });
  self->monitor(owner);
  caf::anon_send(owner, caf::ok_atom::value);
  self->receive([](caf::down_msg&) {});
  REQUIRE(*claimer_of);
  self->monitor(*claimer_of);
  bool ended = false;
  self->receive([&](caf::down_msg&) { ended = true; }, caf::after(20s) >> [] {});
  CHECK(ended);  // at once, not after the claim timeout
}
