#pragma once
// The bulk data path's pure parts: the frame header of a data connection and the store
// where received payloads wait for the CAF message that refers to them.
//
// Large value blocks bypass CAF's byte path (five copies per byte, docs/wire-and-caf.md):
// the sender writes the floats on a plain TCP connection as one frame, and the CAF
// message carries only (origin, ticket, count). The receiver's reader thread puts the
// payload here; the actor handling the message takes it out, waiting if the message
// overtook its payload.
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "libps/keys/keys.hpp"

namespace ps {

enum class bulk_kind : std::uint32_t {
  hello = 1,    // first frame of a connection: id = the sender's token
  payload = 2,  // id = ticket, bytes = the floats that follow
  // Shared memory between processes on one host (libps/net/shm_ring.hpp):
  ring = 3,          // the sender's ring for its payloads: id = its nonce, bytes = the sender's pid
  ring_ok = 4,       // the answer to ring `id`: bytes = 1, mapped (later payloads may come through it), 0, not
  ring_payload = 5,  // id = ticket, bytes = the floats, which come through the ring
  // A CAF message between actors of the two processes (data_plane::enable_messages):
  // id = how its body is written (message_body), bytes = the body, padded to a multiple
  // of 4 bytes.
  message = 6,
};

enum class message_body : std::uint64_t {
  caf = 0,    // as CAF serializes a message
  typed = 1,  // the fixed layout of actors/message_frames.hpp (the pushes and pulls)
};

struct bulk_header {
  bulk_kind kind = bulk_kind::payload;
  std::uint64_t id = 0;
  std::uint64_t bytes = 0;
};

constexpr std::size_t bulk_header_bytes = 32;
// The largest payload a frame may announce (the largest chunk the options allow).
constexpr std::uint64_t bulk_max_payload = 256ull << 20;

std::array<std::byte, bulk_header_bytes> encode_bulk_header(const bulk_header& h);
// Throws bad_request naming what is wrong: magic, check word, kind, payload size (not a
// whole number of floats, above bulk_max_payload, or a hello with a payload).
bulk_header decode_bulk_header(std::span<const std::byte, bulk_header_bytes> bytes);

// Float buffers for received payloads, reused: a buffer handed out goes back to the pool
// when its last reference goes, so the next payload of the same size lands in memory
// that is already mapped and needs no zeroing. Thread-safe.
class buffer_pool : public std::enable_shared_from_this<buffer_pool> {
 public:
  // Keeps at most max_bytes of free buffers.
  static std::shared_ptr<buffer_pool> make(std::uint64_t max_bytes);
  // A buffer of n floats whose contents are unspecified (a reused one keeps old values).
  std::shared_ptr<std::vector<float>> get(std::size_t n);
  // A buffer holding a copy of from[0, n).
  std::shared_ptr<std::vector<float>> copy_of(const float* from, std::size_t n);
  std::uint64_t free_bytes() const;

 private:
  explicit buffer_pool(std::uint64_t max_bytes) : max_bytes_(max_bytes) {}
  void give_back(std::vector<float>* v);

  std::uint64_t max_bytes_;
  mutable std::mutex mtx_;
  std::vector<std::unique_ptr<std::vector<float>>> free_;
  std::uint64_t free_bytes_ = 0;
};

// A payload's floats as they landed: in a buffer (owned), in place in a shared-memory
// ring (lent: the ring gets its bytes back when the last copy goes), or neither when
// they were read straight into memory the claimer named (data_plane::expect).
struct landed_values {
  landed_values() = default;
  landed_values(std::nullptr_t) {}
  landed_values(std::shared_ptr<std::vector<float>> v) : owned(std::move(v)) {}
  std::shared_ptr<std::vector<float>> owned;
  std::shared_ptr<const float> lent;
};

// Payloads received and not yet claimed, by (origin token, ticket). Thread-safe.
// A payload an answer named that cannot come any more: its connection ended first, or
// the claim timeout passed. Unlike other bad_requests, asking again may get it.
struct payload_lost : bad_request {
  using bad_request::bad_request;
};

class payload_store {
 public:
  // Payloads nobody claimed for this long are dropped (their message was lost).
  explicit payload_store(std::chrono::milliseconds orphan_after);

  // values: the payload's floats, or null when its `count` floats were read straight
  // into memory the claimer named beforehand (data_plane::expect).
  void put(std::uint64_t origin, std::uint64_t ticket, landed_values values, std::uint64_t count);
  // The connection from origin ended: claims of payloads that did not arrive fail at
  // once with this reason (those that arrived can still be claimed).
  void close_origin(std::uint64_t origin, std::string why);
  // A new connection from origin: its claims wait again.
  void open_origin(std::uint64_t origin);
  // The payload's values (null: they landed in place), waiting up to `timeout` for it.
  // Throws payload_lost when it does not come or the origin's connection closed first,
  // bad_request when it holds another number of floats than `count`. from: the origin's name.
  // Blocks: for threads of their own; an actor uses try_take and on_ready.
  landed_values take(std::uint64_t origin, std::uint64_t ticket, std::uint64_t count, std::chrono::milliseconds timeout,
                     const std::string& from);
  // take without waiting: nothing while the payload has not come and its connection is up.
  std::optional<landed_values> try_take(std::uint64_t origin, std::uint64_t ticket, std::uint64_t count,
                                        const std::string& from);
  // Replaces origin's lent payloads that nobody claimed yet by `copy(floats, count)`, so
  // their ring can move on (its writer waits for that room). Returns how many.
  using float_copier = std::function<std::shared_ptr<std::vector<float>>(const float*, std::size_t)>;
  std::size_t own_lent(std::uint64_t origin, const float_copier& copy);
  // Calls ready once (on the thread that puts the payload or closes its connection, or
  // at once when either happened already), so a waiter can try_take again.
  void on_ready(std::uint64_t origin, std::uint64_t ticket, std::function<void()> ready);
  std::size_t waiting() const;

 private:
  struct entry {
    landed_values values;
    std::uint64_t count = 0;
    std::chrono::steady_clock::time_point since;
  };
  void drop_orphans(std::chrono::steady_clock::time_point now);

  std::chrono::milliseconds orphan_after_;
  mutable std::mutex mtx_;
  std::condition_variable cv_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, entry> payloads_;
  std::map<std::uint64_t, std::string> closed_;  // origin -> why
  std::multimap<std::pair<std::uint64_t, std::uint64_t>, std::function<void()>> ready_;  // on_ready's, by key
};

}  // namespace ps
