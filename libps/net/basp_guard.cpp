#include "libps/net/basp_guard.hpp"

#include <algorithm>
#include <cstring>

namespace ps {

namespace {

constexpr std::uint8_t server_handshake = 0x00, client_handshake = 0x01, last_operation = 0x06;

std::uint32_t big_endian32(const std::uint8_t* p) {
  return std::uint32_t{p[0]} << 24 | std::uint32_t{p[1]} << 16 | std::uint32_t{p[2]} << 8 | p[3];
}

// What a first header that is no CAF handshake most likely is.
std::string first_bytes_are(const std::array<std::uint8_t, basp_header_bytes>& h) {
  auto starts = [&](const char* s) { return std::memcmp(h.data(), s, std::strlen(s)) == 0; };
  if (starts("APS1")) return "a challenge for a shared secret (the peer runs with --secret-file; this process does not)";
  if (starts("GET ") || starts("POST ") || starts("HEAD ")) return "an HTTP request";
  if (h[0] == 0x16 && h[1] == 0x03) return "a TLS handshake";
  return "no CAF handshake (operation " + std::to_string(h[0]) + ")";
}

}  // namespace

std::optional<std::string> basp_frame_guard::check_header() const {
  auto op = header_[0];
  auto len = big_endian32(header_.data() + 4);
  if (messages_ == 0) {
    auto expected = accepted_ ? client_handshake : server_handshake;
    if (op != expected || header_[1] != 0 || header_[2] != 0) return first_bytes_are(header_);
    if (len > basp_handshake_limit)
      return "a handshake announcing " + std::to_string(len) + " bytes (at most " +
             std::to_string(basp_handshake_limit) + ")";
    return std::nullopt;
  }
  if (op > last_operation) return "an unknown operation " + std::to_string(op);
  if (len > max_payload_)
    return "a message announcing " + std::to_string(len) + " bytes (at most " + std::to_string(max_payload_) +
           ", --ps.max-message-bytes)";
  return std::nullopt;
}

std::optional<std::string> basp_frame_guard::feed(const std::uint8_t* bytes, std::size_t n) {
  while (n > 0) {
    if (payload_left_ > 0) {
      auto k = static_cast<std::size_t>(std::min<std::uint64_t>(payload_left_, n));
      payload_left_ -= k;
      bytes += k;
      n -= k;
      continue;
    }
    auto k = std::min(n, basp_header_bytes - header_have_);
    std::memcpy(header_.data() + header_have_, bytes, k);
    header_have_ += k;
    bytes += k;
    n -= k;
    if (header_have_ < basp_header_bytes) break;
    if (auto why = check_header()) return why;
    header_have_ = 0;
    payload_left_ = big_endian32(header_.data() + 4);
    ++messages_;
  }
  return std::nullopt;
}

}  // namespace ps
