#pragma once
// A byte ring in POSIX shared memory between two processes on one host: one writer (the
// process that made it), one reader (the peer that opened it by name). The data plane
// moves payloads through it instead of through loopback TCP (docs/wire-and-caf.md): a payload is
// copied in by the writer and out by the reader, in slices, so both copies run at once,
// and no byte goes through the kernel. A record that fits in half the ring may instead be
// lent to the reader's user in place (a shard adds a push straight from the ring: one pass
// over the bytes fewer), the writer getting its room back when the record is returned.
//
// Waits are on process-shared POSIX semaphores in the ring itself, in slices of a few
// milliseconds, and between slices the caller's `alive` check runs (the data plane asks
// whether the TCP connection beside the ring still stands): a peer that dies mid-transfer
// leaves the survivor an error, not a wait forever, and the ring is simply let go (it
// holds nothing anyone claims). The name is removed from /dev/shm as soon as the reader
// has mapped it (unlink), so nothing is left behind when either process dies; rings whose
// creator died before that are removed by remove_stale_rings.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "libps/net/busy_poll.hpp"

namespace ps {

struct shm_ring_control;  // the shared header (shm_ring.cpp)

class shm_ring {
 public:
  // Makes a ring of `capacity` bytes (rounded up to pages) named after this process and
  // `nonce`. Throws bad_request naming the name when shared memory cannot be had.
  static std::unique_ptr<shm_ring> create(std::uint64_t nonce, std::size_t capacity);
  // Opens the ring a peer made (its pid and nonce name it) and removes its name. Nothing,
  // with *why, when there is no such ring here (the peer is on another host or in another
  // /dev/shm) or it is not one of ours (a wrong nonce or size).
  static std::unique_ptr<shm_ring> open(std::uint32_t pid, std::uint64_t nonce, std::string* why);
  ~shm_ring();
  shm_ring(const shm_ring&) = delete;
  shm_ring& operator=(const shm_ring&) = delete;

  // The ring's name in /dev/shm ("/actorps-ring-<pid>-<nonce>").
  static std::string name_of(std::uint32_t pid, std::uint64_t nonce);
  const std::string& name() const { return name_; }
  std::size_t capacity() const { return capacity_; }
  // Removes the name (the mappings stay): after the peer opened it, or when it never will.
  void unlink();

  // Returns "" while the peer may still come, else why it will not (checked between waits).
  using alive_check = std::function<std::string()>;
  // A record is what one write() copies in. One of at most capacity/2 bytes is kept in
  // one piece (the writer skips to the ring's start when it would wrap, and the reader,
  // told its size by skip_to_record, skips the same), so the reader may lend it in place.
  // Copies the pieces in, in order, as one record, waiting for room as the reader frees
  // it. False, with *why, when `alive` says the peer is gone or the reader made no room
  // for `stall`, or when another thread is writing meanwhile: the ring has one writer, and
  // two at once would copy to the same place (the second is refused, naming it).
  bool write(std::span<const std::span<const std::byte>> pieces, const alive_check& alive,
             std::chrono::milliseconds stall, std::string* why);
  // Whether a record of `bytes` fits in the ring's room now (its skip included).
  bool fits_now(std::size_t bytes) const;

  // The reader's side. A record of `bytes` comes next: skips what the writer skipped
  // before it. Called once per record, before read or lend. False, with *why, as write.
  bool skip_to_record(std::size_t bytes, const alive_check& alive, std::chrono::milliseconds stall, std::string* why);
  // Fills the pieces, in order, with the next bytes, waiting for them as the writer adds
  // them. False, with *why, as write.
  bool read(std::span<const std::span<std::byte>> into, const alive_check& alive, std::chrono::milliseconds stall,
            std::string* why);
  // Whether a record of `bytes` can be lent (it never wraps).
  bool lendable(std::size_t bytes) const { return bytes > 0 && bytes <= capacity_ / 2; }
  // The next record (lendable, after skip_to_record), in place, once all of it is in: its
  // bytes stay the writer's to keep off until the last copy of the pointer goes (which may
  // be on any thread, and may outlive this object). Records after it may be read or lent
  // meanwhile; the writer gets room back in order, as the earliest lent record returns.
  // Null, with *why, as write.
  std::shared_ptr<const std::byte> lend(std::size_t bytes, const alive_check& alive, std::chrono::milliseconds stall,
                                        std::string* why);
  // Whether the writer can add nothing until a lent record returns (the ring is full and
  // the reader has taken all of it).
  bool held_by_lent() const;
  // Called on the reader's thread when it has waited 1 ms while held_by_lent: the owner
  // of lent records nobody uses yet can copy them out and return them, rather than let
  // the writer wait for whoever will use them.
  void when_held_by_lent(std::function<void()> f) { on_held_ = std::move(f); }
  // Bytes written and read through the ring so far (the peer's side included): consumed
  // counts what the writer may use again, so a lent record counts once it returned.
  std::uint64_t written() const;
  std::uint64_t consumed() const;
  // Before a wait on the other side, this side polls for it as long as `budget` says then
  // (none, the default: it sleeps at once; libps/net/busy_poll.hpp). A side asleep on an idle
  // vCPU took about 50 us to wake here, a tenth of a 1 MiB payload's copy; polling keeps
  // slices moving while both sides copy.
  void poll_before_waiting(shared_poll_budget budget) { poll_ = std::move(budget); }
  // Bytes the writer may copy in now without waiting.
  std::size_t room() const { return capacity_ - static_cast<std::size_t>(written() - consumed()); }

 private:
  struct lending;  // the mapping, the reader's position and the records it lent (shm_ring.cpp)
  shm_ring(std::string name, shm_ring_control* control, std::size_t mapped, bool owner);
  std::size_t pad_before(std::uint64_t at, std::size_t bytes) const;
  std::uint64_t available(std::uint64_t cursor, std::uint64_t head);
  template <class Piece, class Copy>
  bool reader_pass(std::span<const Piece> pieces, std::uint64_t at, Copy copy, bool frees, const alive_check& alive,
                   std::chrono::milliseconds stall, std::string* why);
  std::string name_;
  shm_ring_control* control_;
  std::byte* data_;
  std::size_t capacity_;
  std::shared_ptr<lending> lending_;
  std::function<void()> on_held_;
  std::optional<std::chrono::steady_clock::time_point> held_since_;  // the reader's: when the hold began
  std::atomic<bool> writing_{false};  // a write() is under way (there is one writer)
  bool owner_;
  bool linked_;
  shared_poll_budget poll_;
};

// Removes the rings in /dev/shm made by processes no longer running (a creator that died
// before its peer opened the ring). Returns how many.
std::size_t remove_stale_rings();

}  // namespace ps
