#pragma once
// Batched writes on the socket transport's connections (actors/data_plane.hpp): frames an
// actor sends during a burst of messages leave in one write. Declared apart so that the
// actors' headers name it without the socket transport's inside.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <caf/invoke_message_result.hpp>
#include <caf/mailbox_element.hpp>

namespace ps {

class data_plane;
struct plane_connection;  // a data connection (actors/plane/plane_internal.hpp)
struct plane_link;        // how proxies reach their plane (actors/plane/plane_internal.hpp)

// Frames an actor sends while it takes messages that were waiting in its mailbox are
// held in their connections' queues and leave together once the mailbox is empty: one
// sendmsg, one wake-up of the peer's reader and one of the receiving actor for a burst
// of small requests or answers instead of one each (on 2 cores those cost more than the
// messages' own work). A lone message goes out when its handler returns, as before.
// Held frames leave at once when they reach hold_bytes or hold_frames, so a busy actor
// cannot keep them back.
//
// A lingering batch (a caller's thread that runs a client actor, kv_client::send) goes
// further: on release, the frames for a connection whose reader thread is awake (reading,
// polling or running what it woke) stay queued until this thread calls flush_lingering
// (before it waits for an answer) or that reader is about to sleep, whichever comes
// first; they linger only while that reader is awake or answers are due on the
// connection (so it will wake), else they are written at once. A caller refilling its
// window then sends the requests it makes between two waits in one write, as the
// scheduler's thread did when it woke late for them.
class write_batch {
 public:
  static constexpr std::uint64_t hold_bytes = 64u << 10;
  static constexpr std::size_t hold_frames = 32;
  write_batch() = default;
  explicit write_batch(bool lingering) : lingering_(lingering) {}
  write_batch(const write_batch&) = delete;
  write_batch& operator=(const write_batch&) = delete;
  ~write_batch() {
    release();
    flush_lingering();
  }
  // The batch open on this thread, if any.
  static write_batch* open();
  // Opens `batch` on this thread for its lifetime (a batch already open stays the one).
  class scope {
   public:
    explicit scope(write_batch& batch);
    ~scope();
    scope(const scope&) = delete;
    scope& operator=(const scope&) = delete;

   private:
    bool opened_;
  };
  // Every connection it holds writes what waits (or, lingering, may keep it a while).
  void release();
  // What lingers from this batch's releases is written.
  void flush_lingering();

 private:
  friend class data_plane;
  struct held {
    std::shared_ptr<plane_link> link;
    std::shared_ptr<plane_connection> conn;
  };
  std::vector<held> held_;
  bool lingering_ = false;
  std::vector<held> lingers_;  // connections this batch left lingering (maybe ended since)
};

// An actor (Base: CAF's stateful_actor of a state) whose frames on data connections
// go out in batches (write_batch). Name it as the actor function's `self` type and
// spawn the function as before.
template <class Base>
class batched_writes : public Base {
 public:
  using Base::Base;

  caf::invoke_message_result consume(caf::mailbox_element& x) override {
    caf::invoke_message_result result;
    {
      write_batch::scope open(batch_);
      result = Base::consume(x);
    }
    // Skipped: the actor awaits a response (`await`) and takes nothing else until it
    // comes, which may need what it holds (a shard awaits its payloads' writes).
    // (Skipped messages wait outside what mailbox().empty() counts.)
    if (this->mailbox().empty() || !this->alive() || result == caf::invoke_message_result::skipped)
      batch_.release();
    return result;
  }

 private:
  write_batch batch_;
};

}  // namespace ps
