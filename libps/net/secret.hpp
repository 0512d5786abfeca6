// The shared secret that makes a process a member (--secret-file), and the mutual proof of
// it that every connection starts with: the accepting side sends a challenge, the
// connecting side answers with its proof and a challenge of its own, the accepting side
// confirms with its proof. Proofs are HMAC-SHA256 over a random nonce with a label per
// side, so neither side can replay the other's proof, and the secret never travels.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace ps {

struct shared_secret {
  std::string key;   // the file's bytes, without trailing white space
  std::string file;  // where it came from, for messages
};

// Reads --secret-file; throws bad_request naming the file when it cannot be read, is
// shorter than 16 bytes, or can be read by other users than its owner.
shared_secret read_secret_file(const std::string& path);

using nonce = std::array<std::uint8_t, 32>;
using proof = std::array<std::uint8_t, 32>;
enum class proof_side { accepting, connecting };

nonce random_nonce();
proof prove(const shared_secret& secret, proof_side side, const nonce& n);
bool same_proof(const proof& a, const proof& b);  // in constant time

// Wire sizes: challenge = magic + nonce; answer = proof + nonce; confirm = proof.
constexpr std::size_t challenge_bytes = 4 + 32, answer_bytes = 64, confirm_bytes = 32;
constexpr std::array<std::uint8_t, 4> challenge_magic{'A', 'P', 'S', '1'};

// The accepting side's part, fed with whatever bytes have arrived (non-blocking callers).
class secret_challenge {
 public:
  explicit secret_challenge(const shared_secret& secret);
  const std::array<std::uint8_t, challenge_bytes>& challenge() const { return challenge_; }
  enum class state { waiting, proven, refused };
  // Takes at most missing() bytes of the peer's answer.
  state feed(const std::uint8_t* bytes, std::size_t n);
  std::size_t missing() const { return answer_bytes - have_; }
  // After proven: what to send back.
  const proof& confirm() const { return confirm_; }

 private:
  const shared_secret& secret_;
  nonce mine_;
  std::array<std::uint8_t, challenge_bytes> challenge_{};
  std::array<std::uint8_t, answer_bytes> answer_{};
  std::size_t have_ = 0;
  proof confirm_{};
};

// Both sides over a blocking socket, each step within `limit`: true when the peer proved
// the secret; else false and *why in plain words.
bool challenge_peer(int fd, const shared_secret& secret, std::chrono::milliseconds limit, std::string* why);
bool answer_challenge(int fd, const shared_secret& secret, std::chrono::milliseconds limit, std::string* why);

}  // namespace ps
