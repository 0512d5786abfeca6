// The tensor wire type through CAF's own serializer: bit-exact for every float,
// including the special values CAF's per-element encoding corrupts (docs/wire-and-caf.md, "CAF 0.17 facts").
#include <doctest/doctest.h>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "actors/data_plane.hpp"
#include "actors/messages.hpp"
#include "libps/core/codec.hpp"

using namespace ps;

namespace {

struct wire_fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  wire_fixture() : sys(init(cfg)) {}
  static caf::actor_system_config& init(caf::actor_system_config& c) {
    register_types(c);
    return c;
  }
  template <class T>
  T round_trip(T& in, std::size_t* wire_bytes = nullptr) {
    std::vector<char> buf;
    caf::binary_serializer sink{sys, buf};
    REQUIRE(!inspect(sink, in));
    if (wire_bytes) *wire_bytes = buf.size();
    T out;
    caf::binary_deserializer source{sys, buf};
    REQUIRE(!inspect(source, out));
    return out;
  }
};

}  // namespace

TEST_CASE_FIXTURE(wire_fixture, "float_block round trip is bit-exact for special values") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {0.0f, -0.0f, 1.0f, -1.5f, inf, -inf, std::numeric_limits<float>::quiet_NaN(),
                          std::bit_cast<float>(0x7fc12345u),  // NaN with payload
                          1e-40f, -1e-45f,                      // denormals
                          std::numeric_limits<float>::max(), std::numeric_limits<float>::min()};
  auto in = float_block::own(v);
  std::size_t bytes = 0;
  auto out = round_trip(in, &bytes);
  REQUIRE(out.size == v.size());
  CHECK(std::memcmp(out.data(), v.data(), v.size() * sizeof(float)) == 0);
  CHECK(bytes == 2 + v.size() * sizeof(float));  // form byte + varbyte length + raw floats, no per-element cost
}

TEST_CASE_FIXTURE(wire_fixture, "a block whose values went over a data connection crosses as its ticket") {
  float_block named;
  named.size = 1u << 20;
  named.ticket = 42;
  named.origin = 0x1234567890abcdefull;
  std::size_t bytes = 0;
  auto out = round_trip(named, &bytes);
  CHECK(out.ticket == 42);
  CHECK(out.origin == named.origin);
  CHECK(out.size == named.size);
  CHECK(!out.storage);
  CHECK(bytes == 1 + 3 * 8);  // no values on the wire
}

TEST_CASE_FIXTURE(wire_fixture, "an encoded block (a compressed pull answer) crosses as its codec bytes and decodes when claimed") {
  std::vector<float> v(1000);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.25f;  // exact in fp16
  auto in = float_block::encode_of(encode(parse_codec("fp16"), v.data(), v.size()), v.size());
  std::size_t bytes = 0;
  auto out = round_trip(in, &bytes);
  REQUIRE(out.encoded);
  CHECK(out.size == v.size());
  CHECK(!out.storage);
  CHECK(bytes == 1 + 8 + 2 + encoded_size(parse_codec("fp16"), v.size()));  // form, count, length, bytes
  auto claimed = claim_values(nullptr, out);
  REQUIRE(claimed);  // encoded values are there at once
  const auto& values = *claimed;
  REQUIRE(values.size == v.size());
  CHECK(std::vector<float>(values.data(), values.data() + values.size) == v);
  // Bytes that do not decode to the block's size are refused, saying so.
  out.size = 999;
  CHECK_THROWS_WITH_AS(claim_values(nullptr, out), doctest::Contains("claims 999 values"), bad_request);
  // A count far beyond the bytes is refused before anything is allocated for it.
  out.size = std::uint64_t{1} << 40;
  CHECK_THROWS_WITH_AS(claim_values(nullptr, out), doctest::Contains("claims 1099511627776 values"), bad_request);
}

TEST_CASE_FIXTURE(wire_fixture, "a block announcing more values than its message holds is refused before allocating") {
  // Form 0 (values inline), then a count of 2^30 floats (4 GiB), then 8 bytes of values.
  std::vector<char> buf;
  caf::binary_serializer sink{sys, buf};
  std::uint8_t form = 0;
  std::size_t count = std::size_t{1} << 30;
  REQUIRE(!sink(form));
  REQUIRE(!sink.begin_sequence(count));
  buf.resize(buf.size() + 8);
  float_block out;
  caf::binary_deserializer source{sys, buf};
  auto err = inspect(source, out);
  REQUIRE(err);
  INFO(describe(err));
  CHECK(describe(err).find("announces 1073741824 elements of 4 bytes; the message has 8 bytes left") !=
        std::string::npos);
  row_ids ids;
  std::vector<char> ids_buf = {1, 0, 0, 0, char(0xff), 0x7f};  // table 1, then 16383 ids in no bytes
  caf::binary_deserializer ids_source{sys, ids_buf};
  CHECK(inspect(ids_source, ids));
}

TEST_CASE_FIXTURE(wire_fixture, "a float_block of unknown form is refused, naming it") {
  std::vector<char> buf = {7};
  float_block out;
  caf::binary_deserializer source{sys, buf};
  auto err = inspect(source, out);
  REQUIRE(err);
  CHECK(describe(err).find("unknown form 7") != std::string::npos);
}

TEST_CASE_FIXTURE(wire_fixture, "a view into a larger buffer sends only its part") {
  auto storage = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5});
  float_block view{storage, 1, 3};
  auto out = round_trip(view);
  REQUIRE(out.size == 3);
  CHECK(out.whole());
  CHECK((*out.storage == std::vector<float>{2, 3, 4}));
}

TEST_CASE_FIXTURE(wire_fixture, "empty blocks and range lists round trip") {
  float_block empty;
  CHECK(round_trip(empty).size == 0);
  range_list rl{{{0, 5}, {1ull << 40, (1ull << 40) + 7}, {~0ull - 1, ~0ull}}};
  auto out = round_trip(rl);
  CHECK(out.ranges == rl.ranges);
}

TEST_CASE_FIXTURE(wire_fixture, "update rules cross as bit patterns") {
  update_rule r;
  r.kind = "adam";
  r.lr = 0.001f;
  auto back = rule_msg::from(r).to_rule();
  CHECK(back.kind == "adam");
  CHECK(back.lr == 0.001f);
  CHECK(back.beta2 == r.beta2);
  rule_msg bad = rule_msg::from(r);
  bad.kind = "rmsprop";
  CHECK_THROWS_WITH_AS(bad.to_rule(), doctest::Contains("unknown update rule"), bad_request);
}
