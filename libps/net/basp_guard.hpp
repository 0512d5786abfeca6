// Checks the bytes of a CAF (BASP 0.17) connection as they arrive, before CAF sees them:
// CAF allocates whatever a header announces (a 32-byte header claiming 4 GiB made a
// coordinator allocate 4 GiB and stall 25 s), and closes on garbage without a word. The
// guard refuses, naming what was wrong: a first message that is not the expected
// handshake or is larger than handshake_limit, an unknown operation, and a payload larger
// than max_payload.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace ps {

constexpr std::size_t basp_header_bytes = 32;
constexpr std::uint32_t basp_handshake_limit = 64u << 10;

class basp_frame_guard {
 public:
  // accepted: the peer connected to us (its first message is a client handshake);
  // else we connected (the first is the server's handshake).
  basp_frame_guard(bool accepted, std::uint64_t max_payload) : accepted_(accepted), max_payload_(max_payload) {}
  // Bytes in stream order; an error text as soon as they cannot be CAF's protocol.
  std::optional<std::string> feed(const std::uint8_t* bytes, std::size_t n);
  // The peer's handshake header came and passed.
  bool handshake_seen() const { return messages_ > 0; }

 private:
  std::optional<std::string> check_header() const;

  bool accepted_;
  std::uint64_t max_payload_;
  std::array<std::uint8_t, basp_header_bytes> header_{};
  std::size_t header_have_ = 0;
  std::uint64_t payload_left_ = 0;
  std::uint64_t messages_ = 0;
};

}  // namespace ps
