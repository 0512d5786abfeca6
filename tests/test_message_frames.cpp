// The typed layout of pushes, pulls and their answers on data connections
// (actors/message_frames): each shape round-trips field for field and bit for bit, what
// it does not cover is left to CAF, and a damaged body is refused naming what is wrong.
#include <doctest/doctest.h>

#include <bit>
#include <cstring>
#include <limits>
#include <string>

#include "actors/message_frames.hpp"
#include "actors/messages.hpp"

using namespace ps;

namespace {

// A node as CAF makes one for a process (its id and a host hash); no actor system is
// needed to encode or decode.
caf::node_id sample_node() {
  caf::node_id::default_data::host_id_type host;
  for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<std::uint8_t>(i * 13 + 1);
  return caf::make_node_id(4242, host);
}

message_envelope envelope() { return {7, 9, 0x1234'5678'9abcull, sample_node()}; }

request_header sample_header() {
  request_header h;
  h.epoch = 3, h.worker = 5, h.clock = 11, h.seq = 1ull << 40, h.reply_plane = 0xfeedull, h.pull_codec = 2, h.tick = 12;
  return h;
}

void check_header(const request_header& h) {
  auto want = sample_header();
  CHECK(h.epoch == want.epoch);
  CHECK(h.worker == want.worker);
  CHECK(h.clock == want.clock);
  CHECK(h.seq == want.seq);
  CHECK(h.reply_plane == want.reply_plane);
  CHECK(h.pull_codec == want.pull_codec);
  CHECK(h.tick == want.tick);
}

std::vector<float> special_values() {
  return {0.0f, -0.0f, 1.5f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
          std::bit_cast<float>(0x7fc12345u), 1e-40f};
}

std::vector<char> encoded(const message_envelope& e, const caf::message& m) {
  std::vector<char> body;
  REQUIRE(encode_typed_message(e, m, body));
  return body;
}

std::string refusal(std::span<const char> body) {
  caf::message out;
  try {
    decode_typed_message(body, out);
  } catch (const bad_request& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("typed frames: a push round-trips its envelope, header, ranges and values bit for bit") {
  auto values = special_values();
  range_list ranges{{{0, 3}, {100, 104}}};
  auto body = encoded(envelope(), caf::make_message(push_atom::value, sample_header(), ranges, float_block::own(values)));
  caf::message got;
  auto e = decode_typed_message(body, got);
  CHECK(e.to == 7);
  CHECK(e.from == 9);
  CHECK(e.mid == 0x1234'5678'9abcull);
  CHECK(e.from_node == sample_node());
  REQUIRE(got.match_elements<push_atom, request_header, range_list, float_block>());
  check_header(got.get_as<request_header>(1));
  CHECK(got.get_as<range_list>(2).ranges == ranges.ranges);
  const auto& block = got.get_as<float_block>(3);
  REQUIRE(block.size == values.size());
  CHECK(std::memcmp(block.data(), values.data(), values.size() * sizeof(float)) == 0);
}

TEST_CASE("typed frames: a pull, a count answer and a named payload's answer round-trip") {
  auto pull = encoded(envelope(), caf::make_message(pull_atom::value, sample_header(), range_list{{{5, 9}}}));
  caf::message got;
  decode_typed_message(pull, got);
  REQUIRE(got.match_elements<pull_atom, request_header, range_list>());
  check_header(got.get_as<request_header>(1));
  CHECK(got.get_as<range_list>(2).ranges == std::vector<key_range>{{5, 9}});

  auto count = encoded(envelope(), caf::make_message(std::uint64_t{42}));
  decode_typed_message(count, got);
  REQUIRE(got.match_elements<std::uint64_t>());
  CHECK(got.get_as<std::uint64_t>(0) == 42);

  float_block named;
  named.ticket = 17, named.origin = 0xabcdull, named.size = 1u << 20;
  auto answer = encoded(envelope(), caf::make_message(named));
  decode_typed_message(answer, got);
  REQUIRE(got.match_elements<float_block>());
  const auto& block = got.get_as<float_block>(0);
  CHECK(block.ticket == 17);
  CHECK(block.origin == 0xabcdull);
  CHECK(block.size == 1u << 20);
  CHECK(!block.storage);
}

TEST_CASE("typed frames: a message without a sender crosses with no node; other shapes and "
          "encoded values are left to CAF") {
  caf::message got;
  auto body = encoded({7, 0, 5, caf::node_id{}}, caf::make_message(std::uint64_t{1}));
  CHECK(!decode_typed_message(body, got).from_node);

  std::vector<char> out{'x'};
  CHECK(!encode_typed_message(envelope(), caf::make_message(clock_atom::value, sample_header()), out));
  CHECK(!encode_typed_message(envelope(), caf::make_message(float_block::encode_of({std::byte{1}}, 1)), out));
  CHECK(!encode_typed_message(envelope(), caf::make_message(std::uint64_t{1}, std::uint64_t{2}), out));
  CHECK(out == std::vector<char>{'x'});  // untouched
}

TEST_CASE("typed frames: a damaged body is refused, naming what is wrong") {
  auto values = special_values();
  auto body = encoded(envelope(), caf::make_message(push_atom::value, sample_header(), range_list{{{0, 7}}},
                                                     float_block::own(values)));
  SUBCASE("cut short anywhere") {
    for (std::size_t n = 0; n + 4 <= body.size(); ++n) {  // (the last 3 bytes could be padding)
      // A count is checked against what remains before the elements are read.
      auto why = refusal({body.data(), n});
      CHECK_MESSAGE((why.find("cut short") != std::string::npos || why.find("bytes remain") != std::string::npos), n);
    }
  }
  SUBCASE("an unknown shape") {
    body[0] = 9;
    CHECK(refusal(body).find("unknown shape 9") != std::string::npos);
  }
  SUBCASE("a node of unknown form") {
    body[1] = 2;
    CHECK(refusal(body).find("node of unknown form 2") != std::string::npos);
  }
  SUBCASE("more values announced than the body holds") {
    const std::size_t count_at = body.size() - values.size() * sizeof(float) - sizeof(std::uint64_t);
    const std::uint64_t huge = 1ull << 60;
    std::memcpy(body.data() + count_at, &huge, sizeof huge);
    CHECK(refusal(body).find("announces 1152921504606846976 values") != std::string::npos);
  }
  SUBCASE("a block of unknown form") {
    const std::size_t form_at = body.size() - values.size() * sizeof(float) - sizeof(std::uint64_t) - 1;
    body[form_at] = 5;
    CHECK(refusal(body).find("block of unknown form 5") != std::string::npos);
  }
  SUBCASE("bytes left over") {
    body.insert(body.end(), 4, '\0');
    CHECK(refusal(body).find("4 bytes after its message") != std::string::npos);
  }
}
