// The shared secret's file and proofs (libps/net/secret) and the checks on CAF's byte stream
// (libps/net/basp_guard), without actors.
#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "libps/net/basp_guard.hpp"
#include "libps/keys/keys.hpp"
#include "libps/net/secret.hpp"

using namespace std::chrono_literals;

namespace {

std::string write_secret(const std::string& name, const std::string& text, int mode = 0600) {
  auto path = (std::filesystem::temp_directory_path() / ("actorps-test-" + std::to_string(::getpid()) + name)).string();
  std::ofstream(path) << text;
  ::chmod(path.c_str(), mode);
  return path;
}

std::string refusal(const std::string& path) {
  try {
    ps::read_secret_file(path);
  } catch (const ps::bad_request& e) {
    return e.what();
  }
  return "";
}

// A BASP header: operation and announced payload length (big-endian at offset 4).
std::array<std::uint8_t, ps::basp_header_bytes> header(std::uint8_t op, std::uint32_t len) {
  std::array<std::uint8_t, ps::basp_header_bytes> h{};
  h[0] = op;
  h[4] = len >> 24;
  h[5] = len >> 16;
  h[6] = len >> 8;
  h[7] = len;
  return h;
}

}  // namespace

TEST_CASE("secret file: read without trailing white space; refused when short, missing or readable by others") {
  auto good = write_secret("good", "0123456789abcdefXYZ\n");
  CHECK(ps::read_secret_file(good).key == "0123456789abcdefXYZ");
  auto shorter = write_secret("short", "tooshort\n");
  CHECK(refusal(shorter).find("at least 16") != std::string::npos);
  auto open_to_all = write_secret("open", "0123456789abcdefXYZ", 0644);
  CHECK(refusal(open_to_all).find("chmod 600") != std::string::npos);
  CHECK(refusal("/nonexistent/secret").find("/nonexistent/secret") != std::string::npos);
  for (const auto& p : {good, shorter, open_to_all}) std::filesystem::remove(p);
}

TEST_CASE("secret proofs: bound to the secret, the nonce and the side") {
  ps::shared_secret a{"0123456789abcdef-a", "a"}, b{"0123456789abcdef-b", "b"};
  auto n = ps::random_nonce(), m = ps::random_nonce();
  CHECK(n != m);
  auto p = ps::prove(a, ps::proof_side::connecting, n);
  CHECK(ps::same_proof(p, ps::prove(a, ps::proof_side::connecting, n)));
  CHECK_FALSE(ps::same_proof(p, ps::prove(b, ps::proof_side::connecting, n)));
  CHECK_FALSE(ps::same_proof(p, ps::prove(a, ps::proof_side::accepting, n)));  // no reflection
  CHECK_FALSE(ps::same_proof(p, ps::prove(a, ps::proof_side::connecting, m)));
}

TEST_CASE("secret challenge: fed in pieces, proven by the right answer, refused by a wrong one") {
  ps::shared_secret s{"0123456789abcdef-s", "s"}, other{"0123456789abcdef-o", "o"};
  for (const auto* answerer : {&s, &other}) {
    ps::secret_challenge ch(s);
    ps::nonce theirs{};
    std::copy(ch.challenge().begin() + 4, ch.challenge().end(), theirs.begin());
    auto proof = ps::prove(*answerer, ps::proof_side::connecting, theirs);
    std::array<std::uint8_t, ps::answer_bytes> answer{};
    std::copy(proof.begin(), proof.end(), answer.begin());
    CHECK(ch.feed(answer.data(), 10) == ps::secret_challenge::state::waiting);
    CHECK(ch.missing() == ps::answer_bytes - 10);
    auto end = ch.feed(answer.data() + 10, answer.size() - 10);
    CHECK(end == (answerer == &s ? ps::secret_challenge::state::proven : ps::secret_challenge::state::refused));
  }
}

TEST_CASE("secret handshake over a socket: same secret on both ends passes, a different one fails on both") {
  ps::shared_secret s{"0123456789abcdef-s", "s"}, other{"0123456789abcdef-o", "o"};
  for (const auto* client_secret : {&s, &other}) {
    int fds[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
    std::string server_why, client_why;
    bool server_ok = false;
    std::thread server([&] {
      server_ok = ps::challenge_peer(fds[0], s, 2000ms, &server_why);
      ::close(fds[0]);  // a refused peer sees the end of the stream
    });
    bool client_ok = ps::answer_challenge(fds[1], *client_secret, 2000ms, &client_why);
    server.join();
    ::close(fds[1]);
    CHECK(server_ok == (client_secret == &s));
    CHECK(client_ok == (client_secret == &s));
    if (client_secret != &s) {
      CHECK(server_why.find("wrong proof") != std::string::npos);
      CHECK(client_why.find("--secret-file") != std::string::npos);
    }
  }
}

TEST_CASE("secret handshake: a peer that says nothing is given up on in time, with a reason") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  std::string why;
  ps::shared_secret s{"0123456789abcdef-s", "s"};
  CHECK_FALSE(ps::answer_challenge(fds[1], s, 50ms, &why));
  CHECK(why.find("sent nothing in time") != std::string::npos);
  ::close(fds[0]);
  ::close(fds[1]);
}

TEST_CASE("BASP guard: a handshake then messages pass, in any split") {
  std::vector<std::uint8_t> stream;
  auto add = [&](std::uint8_t op, std::uint32_t len) {
    auto h = header(op, len);
    stream.insert(stream.end(), h.begin(), h.end());
    stream.resize(stream.size() + len, 0x5a);
  };
  add(0x01, 300);      // client handshake
  add(0x02, 100000);   // direct message
  add(0x06, 0);        // heartbeat
  for (std::size_t piece : {std::size_t{1}, std::size_t{7}, std::size_t{32}, stream.size()}) {
    ps::basp_frame_guard guard(true, 1u << 20);
    CHECK_FALSE(guard.handshake_seen());
    std::string refused;
    for (std::size_t at = 0; at < stream.size() && refused.empty(); at += piece)
      refused = guard.feed(stream.data() + at, std::min(piece, stream.size() - at)).value_or("");
    CHECK(refused == "");
    CHECK(guard.handshake_seen());
  }
}

TEST_CASE("BASP guard: refuses what CAF would take on trust, naming it") {
  auto first = [](bool accepted, std::array<std::uint8_t, ps::basp_header_bytes> h) {
    ps::basp_frame_guard guard(accepted, 1u << 20);
    return guard.feed(h.data(), h.size()).value_or("");
  };
  CHECK(first(true, header(0x01, 0xFFFFFF00u)).find("handshake announcing") != std::string::npos);  // the 4 GiB header
  CHECK(first(true, header(0x02, 10)).find("no CAF handshake") != std::string::npos);
  CHECK(first(false, header(0x01, 10)).find("no CAF handshake") != std::string::npos);  // we expect the server's
  std::array<std::uint8_t, ps::basp_header_bytes> http{};
  std::memcpy(http.data(), "GET / HTTP/1.1\r\n", 16);
  CHECK(first(true, http) == "an HTTP request");
  std::array<std::uint8_t, ps::basp_header_bytes> challenge{};
  std::memcpy(challenge.data(), "APS1", 4);
  CHECK(first(false, challenge).find("--secret-file") != std::string::npos);

  ps::basp_frame_guard guard(true, 1u << 20);
  auto hs = header(0x01, 0);
  REQUIRE_FALSE(guard.feed(hs.data(), hs.size()));
  auto big = header(0x02, (1u << 20) + 1);
  CHECK(guard.feed(big.data(), big.size()).value_or("").find("--ps.max-message-bytes") != std::string::npos);
  ps::basp_frame_guard guard2(true, 1u << 20);
  REQUIRE_FALSE(guard2.feed(hs.data(), hs.size()));
  auto unknown = header(0x09, 0);
  CHECK(guard2.feed(unknown.data(), unknown.size()).value_or("").find("unknown operation") != std::string::npos);
}
