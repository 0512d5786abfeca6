#include "libps/net/secret.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "libps/keys/keys.hpp"

namespace ps {

shared_secret read_secret_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw bad_request("--secret-file=" + path + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw bad_request("--secret-file=" + path + " is not a regular file");
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    throw bad_request("--secret-file=" + path + " can be read by other users (chmod 600 " + path + ")");
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  if (!in) throw bad_request("--secret-file=" + path + ": cannot be read");
  auto key = bytes.str();
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  if (key.size() < 16)
    throw bad_request("--secret-file=" + path + " holds " + std::to_string(key.size()) +
                      " bytes; a secret needs at least 16 (e.g. head -c 32 /dev/urandom | base64 > " + path + ")");
  return {std::move(key), path};
}

nonce random_nonce() {
  nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1) throw std::runtime_error("no random bytes from OpenSSL");
  return n;
}

proof prove(const shared_secret& secret, proof_side side, const nonce& n) {
  // The label binds a proof to its side: an accepting proof is no connecting one.
  std::string text = side == proof_side::accepting ? "actorps accepting " : "actorps connecting ";
  text.append(reinterpret_cast<const char*>(n.data()), n.size());
  proof p{};
  unsigned len = 0;
  HMAC(EVP_sha256(), secret.key.data(), static_cast<int>(secret.key.size()),
       reinterpret_cast<const unsigned char*>(text.data()), text.size(), p.data(), &len);
  return p;
}

bool same_proof(const proof& a, const proof& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

secret_challenge::secret_challenge(const shared_secret& secret) : secret_(secret), mine_(random_nonce()) {
  std::memcpy(challenge_.data(), challenge_magic.data(), challenge_magic.size());
  std::memcpy(challenge_.data() + challenge_magic.size(), mine_.data(), mine_.size());
}

secret_challenge::state secret_challenge::feed(const std::uint8_t* bytes, std::size_t n) {
  n = std::min(n, missing());
  std::memcpy(answer_.data() + have_, bytes, n);
  have_ += n;
  if (have_ < answer_bytes) return state::waiting;
  proof theirs{};
  nonce their_nonce{};
  std::memcpy(theirs.data(), answer_.data(), theirs.size());
  std::memcpy(their_nonce.data(), answer_.data() + theirs.size(), their_nonce.size());
  if (!same_proof(theirs, prove(secret_, proof_side::connecting, mine_))) return state::refused;
  confirm_ = prove(secret_, proof_side::accepting, their_nonce);
  return state::proven;
}

namespace {

// Waits for fd to be ready for `events` until `deadline`.
bool ready(int fd, short events, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<std::int64_t>(left.count(), 0)));
    if (n < 0 && errno == EINTR) continue;
    return n > 0;
  }
}

bool send_exact(int fd, const std::uint8_t* p, std::size_t n, std::chrono::steady_clock::time_point deadline,
                std::string* why) {
  while (n > 0) {
    if (!ready(fd, POLLOUT, deadline)) return *why = "it took no bytes in time", false;
    auto k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k <= 0) return *why = std::strerror(errno), false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

bool recv_exact(int fd, std::uint8_t* p, std::size_t n, std::chrono::steady_clock::time_point deadline,
                std::string* why) {
  while (n > 0) {
    if (!ready(fd, POLLIN, deadline)) return *why = "it sent nothing in time", false;
    auto k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (k == 0) return *why = "it closed the connection", false;
    if (k < 0) return *why = std::strerror(errno), false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

}  // namespace

bool challenge_peer(int fd, const shared_secret& secret, std::chrono::milliseconds limit, std::string* why) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  secret_challenge ch(secret);
  std::array<std::uint8_t, answer_bytes> answer{};
  if (!send_exact(fd, ch.challenge().data(), challenge_bytes, deadline, why) ||
      !recv_exact(fd, answer.data(), answer.size(), deadline, why)) {
    *why = "no proof of the shared secret: " + *why;
    return false;
  }
  if (ch.feed(answer.data(), answer.size()) != secret_challenge::state::proven) {
    *why = "wrong proof of the shared secret (is its --secret-file the same as ours?)";
    return false;
  }
  return send_exact(fd, ch.confirm().data(), confirm_bytes, deadline, why);
}

bool answer_challenge(int fd, const shared_secret& secret, std::chrono::milliseconds limit, std::string* why) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  std::array<std::uint8_t, challenge_bytes> challenge{};
  if (!recv_exact(fd, challenge.data(), challenge.size(), deadline, why)) {
    *why = "no challenge for the shared secret: " + *why + " (does it run without --secret-file?)";
    return false;
  }
  if (std::memcmp(challenge.data(), challenge_magic.data(), challenge_magic.size()) != 0) {
    *why = "it sent no challenge for the shared secret (does it run without --secret-file?)";
    return false;
  }
  nonce theirs{}, mine = random_nonce();
  std::memcpy(theirs.data(), challenge.data() + challenge_magic.size(), theirs.size());
  auto answer = prove(secret, proof_side::connecting, theirs);
  std::array<std::uint8_t, answer_bytes> out{};
  std::memcpy(out.data(), answer.data(), answer.size());
  std::memcpy(out.data() + answer.size(), mine.data(), mine.size());
  proof confirm{};
  if (!send_exact(fd, out.data(), out.size(), deadline, why) ||
      !recv_exact(fd, confirm.data(), confirm.size(), deadline, why)) {
    *why = "it refused our proof of the shared secret (is --secret-file the same on every member?): " + *why;
    return false;
  }
  if (!same_proof(confirm, prove(secret, proof_side::accepting, mine))) {
    *why = "it does not know the shared secret (its proof is wrong)";
    return false;
  }
  return true;
}

}  // namespace ps
