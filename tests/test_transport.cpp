// The transport seam: the registry by name, --ps.transport's checks, and the in-memory
// transport's contract (what the socket transport's tests check of data_plane): named
// blocks, claims, landing in place, a gone origin, and who can reach whom.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "actors/transport.hpp"
#include "actors/transport/memory.hpp"
#include "libps/net/bulk.hpp"
#include "runtime/node.hpp"
#include "tests/actor_fixture.hpp"

using namespace ps;

namespace {

transport_settings in_fabric(const std::string& name, std::uint64_t min_bytes = 16) {
  transport_settings s;
  s.bind_host = s.advertised_host = name;
  s.min_bytes = min_bytes;
  s.claim_timeout = std::chrono::milliseconds(200);
  return s;
}

// Two members of one fabric, connected (a connection goes both ways).
struct pair_of_members {
  std::shared_ptr<transport> a, b;
  explicit pair_of_members(const std::string& fabric)
      : a(make_memory_transport(in_fabric(fabric))), b(make_memory_transport(in_fabric(fabric))) {
    std::string why;
    REQUIRE(a->connect(b->token(), b->host(), b->port(), &why));
  }
};

std::vector<float> iota_values(std::size_t n, float from) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

}  // namespace

TEST_CASE("the transports are known by name, and a bad name is refused naming the known ones") {
  CHECK(transport_kind_named("shm").between_processes);
  CHECK(transport_kind_named("tcp").between_processes);
  CHECK_FALSE(transport_kind_named("memory").between_processes);
  try {
    transport_kind_named("udp");
    FAIL("an unknown transport was accepted");
  } catch (const bad_request& e) {
    CHECK(std::string(e.what()).find("unknown transport 'udp' (known: shm, tcp, memory)") != std::string::npos);
  }
}

TEST_CASE("--ps.transport: psnode's roles take a transport between processes only") {
  node_config cfg;
  cfg.transport = "tcp";
  CHECK_NOTHROW(cfg.validate_wire());
  cfg.transport = "memory";
  CHECK_THROWS_WITH_AS(cfg.validate_wire(), doctest::Contains("connects members of one process only"), bad_request);
  cfg.transport = "udp";
  CHECK_THROWS_WITH_AS(cfg.validate_wire(), doctest::Contains("--ps.transport: unknown transport 'udp'"), bad_request);
}

TEST_CASE("memory transport: tokens in creation order, and only members of the fabric connect") {
  auto a = make_memory_transport(in_fabric("t-order"));
  auto b = make_memory_transport(in_fabric("t-order"));
  auto stranger = make_memory_transport(in_fabric("t-elsewhere"));
  CHECK(a->token() == 1);
  CHECK(b->token() == 2);
  CHECK(stranger->token() == 1);  // each fabric counts its own
  CHECK_FALSE(a->connect_blocks());
  std::string why;
  CHECK_FALSE(a->connect(stranger->token(), stranger->host(), stranger->port(), &why));
  CHECK(why.find("no member 1 at t-elsewhere:1 in fabric 't-order'") != std::string::npos);
  CHECK_FALSE(a->connect(7, a->host(), 7, &why));
  CHECK(a->connect(b->token(), b->host(), b->port(), &why));
}

TEST_CASE("memory transport: a block is named, claimed once with its values, and counted") {
  pair_of_members m("t-claim");
  auto values = iota_values(64, 1.0f);
  auto named = m.a->offload(m.b->token(), float_block::own(values));
  REQUIRE(named);
  CHECK(named->storage == nullptr);
  CHECK(named->origin == m.a->token());
  CHECK(named->size == 64);
  auto claimed = claim_values(m.b.get(), *named);
  REQUIRE(claimed);
  CHECK(std::vector<float>(claimed->data(), claimed->data() + 64) == values);
  CHECK_FALSE(m.b->try_claim(*named));  // taken: a second claim waits for another payload
  CHECK(m.a->counters().bytes_sent == 64 * sizeof(float));
  CHECK(m.b->counters().bytes_received == 64 * sizeof(float));
}

TEST_CASE("memory transport: small blocks, strangers and named blocks stay with the caller") {
  pair_of_members m("t-small");
  auto outsider = make_memory_transport(in_fabric("t-small"));  // same fabric, never connected
  CHECK_FALSE(m.a->offload(m.b->token(), float_block::own({1.0f, 2.0f})));  // 8 bytes < 16
  CHECK_FALSE(m.a->offload(outsider->token(), float_block::own(iota_values(64, 0.0f))));
  CHECK_FALSE(m.a->offload(0, float_block::own(iota_values(64, 0.0f))));
  auto named = m.a->offload(m.b->token(), float_block::own(iota_values(64, 0.0f)));
  REQUIRE(named);
  CHECK_FALSE(m.a->offload(m.b->token(), *named));  // it names a payload already
}

TEST_CASE("memory transport: an expected answer lands in place; a wrong size or a forgotten one does not") {
  pair_of_members m("t-expect");
  std::vector<float> first(40), second(24);
  m.b->expect(m.a->token(), 9, {std::span<float>(first), std::span<float>(second)}, nullptr);
  auto values = iota_values(64, 100.0f);
  std::span<const float> whole(values);
  auto named = m.a->offload(m.b->token(), std::span<const std::span<const float>>(&whole, 1), 64, 9, nullptr);
  REQUIRE(named);
  CHECK(named->ticket == 9);
  CHECK(first.front() == 100.0f);
  CHECK(second.back() == 163.0f);
  auto claimed = m.b->try_claim(*named);
  REQUIRE(claimed);
  CHECK(claimed->storage == nullptr);  // its values are where the caller said
  CHECK(claimed->size == 64);

  std::vector<float> small(10, -1.0f);
  m.b->expect(m.a->token(), 10, {std::span<float>(small)}, nullptr);
  auto other = m.a->offload(m.b->token(), std::span<const std::span<const float>>(&whole, 1), 64, 10, nullptr);
  REQUIRE(other);
  CHECK(small.front() == -1.0f);  // 64 floats do not fit 10: a buffer of their own
  auto got = m.b->try_claim(*other);
  REQUIRE(got);
  REQUIRE(got->storage);
  CHECK(got->data()[63] == 163.0f);

  m.b->expect(m.a->token(), 11, {std::span<float>(first)}, nullptr);
  m.b->forget(m.a->token(), 11);
  std::fill(first.begin(), first.end(), 0.0f);
  std::span<const float> forty(values.data(), 40);
  REQUIRE(m.a->offload(m.b->token(), std::span<const std::span<const float>>(&forty, 1), 40, 11, nullptr));
  CHECK(first.front() == 0.0f);  // forgotten: the memory is left alone
}

TEST_CASE("memory transport: a payload of an origin that is gone fails its claim with why; wait and timeout") {
  pair_of_members m("t-gone");
  float_block never;
  never.size = 8;
  never.ticket = 77;
  never.origin = m.a->token();
  bool told = false;
  m.b->when_claimable(never, [&] { told = true; });
  CHECK_FALSE(m.b->try_claim(never));
  CHECK_THROWS_WITH_AS(m.b->claim(never), doctest::Contains("did not"), payload_lost);  // 200 ms claim timeout
  m.b->origin_gone(m.a->token(), "its shard went down");
  CHECK(told);
  CHECK_THROWS_WITH_AS(m.b->try_claim(never), doctest::Contains("its shard went down"), payload_lost);
  CHECK_THROWS_WITH_AS(claim_values(nullptr, never), doctest::Contains("no data plane"), bad_request);
}

TEST_CASE("memory transport: a member that ends leaves its fabric; requests are not carried") {
  auto a = make_memory_transport(in_fabric("t-end"));
  auto b = make_memory_transport(in_fabric("t-end"));
  auto token = b->token();
  auto port = b->port();
  b.reset();
  std::string why;
  CHECK_FALSE(a->connect(token, a->host(), port, &why));
  CHECK_FALSE(a->messages_enabled());
  CHECK(a->proxy(token, 1, caf::node_id{}) == nullptr);
}

TEST_CASE_FIXTURE(ps::test::two_shard_cluster, "protocol over the in-memory transport: pushes and pulls go as named payloads") {
  start({}, 1);
  auto& kv = *clients[0];
  auto before = kv.options().plane->counters();
  std::vector<float> ones(num_keys, 1.0f);
  settle(kv.push(keys, ones));
  auto after_push = kv.options().plane->counters();
  CHECK(after_push.bytes_sent - before.bytes_sent == num_keys * sizeof(float));  // both shards' halves
  auto values = settle(kv.pull(keys));
  CHECK(values == ones);
  auto after_pull = kv.options().plane->counters();
  CHECK(after_pull.bytes_received - after_push.bytes_received == num_keys * sizeof(float));  // the answers
}

TEST_CASE_FIXTURE(ps::test::two_shard_cluster, "keys outside the job's tensors are refused before anything is sent") {
  start({}, 1);
  kv_client_options opts{0, default_chunk_bytes, std::chrono::milliseconds(60000)};
  opts.tensors = {{"weights", {0, num_keys}, {num_keys}}};
  kv_client kv(sys, view, links_of(view), opts);
  CHECK_THROWS_WITH_AS(kv.push(key_set::single({60, 70}), std::vector<float>(10, 1.0f)),
                       doctest::Contains("keys [64, 70) are outside every declared tensor (nearest: weights [0, 64))"),
                       bad_request);
  CHECK_THROWS_WITH_AS(kv.pull(key_set::single({100, 101})), doctest::Contains("keys [100, 101) are outside"),
                       bad_request);
  CHECK(settle(kv.pull(keys)) == std::vector<float>(num_keys, 0.0f));  // inside: as before
}
