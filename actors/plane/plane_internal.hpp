#pragma once
// The data plane's inside, shared by its files (actors/plane/): the frame and connection
// records, socket helpers, and each connection's buffered reader. Not part of the public API.
#include "actors/data_plane.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <random>
#include <shared_mutex>

#include <caf/actor_proxy.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/make_actor.hpp>

#include "actors/inline_runner.hpp"
#include "libps/net/busy_poll.hpp"
#include "libps/net/done_signal.hpp"
#include "libps/core/codec.hpp"
#include "libps/observe/log.hpp"
#include "libps/net/shm_ring.hpp"

namespace ps {

// A payload on its way out; `keep` holds its parts alive and unchanged until written.
struct data_plane_frame {
  std::array<std::byte, bulk_header_bytes> header;
  std::vector<std::span<const float>> parts;
  std::shared_ptr<const void> keep;
  std::uint64_t ticket = 0;
  std::uint64_t bytes = 0;  // header and parts
  std::uint64_t done = 0;   // of those, written already
  std::size_t ring_header_done = 0;  // through the ring: bytes of its ring_payload header written
  bool floats_in_ring = false;       // through the ring: its floats are there (the header is what is left)
  bool request = false;              // a message frame that asks for an answer
  bool streams = false;              // through the ring: header first, floats behind it
};

// How proxies reach their plane: cut (plane null) when the plane goes, so a proxy that
// outlives it answers requests as unsent instead of touching freed memory.
struct plane_link {
  std::shared_mutex mtx;
  data_plane* plane = nullptr;
};

class socket_reader;  // the reader thread's buffered reads (below)

struct plane_connection {
  int fd = -1;
  std::atomic<std::uint64_t> peer{0};  // its token; 0 until its hello (accepted connections)
  std::string name;        // "data connection to 127.0.0.1:40001" / "from 127.0.0.1:51234"
  bool accepted = false;   // it connected to us (so it proves the secret, if there is one)
  std::atomic<bool> broken{false};
  std::mutex out_mtx;
  std::condition_variable out_ready;
  std::deque<data_plane_frame> outbox;  // under out_mtx; written in order
  bool writing = false;         // under out_mtx: a thread is writing to fd
  int holds = 0;                // under out_mtx: write_batches holding the queue (none writes it meanwhile)
  bool lingers = false;         // under out_mtx: one of the holds is a lingering batch's (write_batch)
  // The reader thread is not waiting for bytes. Set by it alone; it clears it, under
  // out_mtx, just before it waits, so a lingering batch that sees it set under out_mtx
  // is sure the reader will write what lingers before it sleeps.
  std::atomic<bool> reader_awake{false};
  std::thread reader, writer;
  std::atomic<int> loops_ended{0};  // 2: both threads are done, so they join at once
  bool peer_here = false;           // its peer is a process on this host (peer_on_this_host)
  // Shared memory (same host): our ring for payloads to the peer, usable once the peer
  // said it mapped it (ring_ready), and the peer's ring its ring payloads come through
  // (the reader thread's alone).
  std::unique_ptr<shm_ring> out_ring;
  std::uint64_t out_nonce = 0;
  std::atomic<bool> ring_ready{false};
  bool ring_answered = false;  // under the plane's mtx_: the peer answered our offer
  std::unique_ptr<shm_ring> in_ring;
  // Messages: whether the peer said it takes them, and the requests sent on this
  // connection not yet answered, by (sender, request id), with their senders.
  std::atomic<bool> peer_takes_messages{false};
  std::mutex asked_mtx;
  struct asker {
    caf::strong_actor_ptr sender;
    caf::message_id request;
  };
  std::map<std::pair<caf::actor_id, std::uint64_t>, asker> asked;  // by (sender, request number)
  std::vector<char> message_body;  // the reader thread's
  std::unique_ptr<socket_reader> in;  // the reader thread's reads of fd
};

namespace plane_internal {

constexpr std::size_t iov_max = 1024;  // IOV_MAX on Linux

// Why a reader ended when its peer closed the connection between frames (the usual end).
constexpr const char* closed_by_peer = "closed by the peer";

// The plane whose reader or writer this thread is (data_plane::shared).
extern thread_local const data_plane* own_plane;

std::string errno_text();
std::string address_of(const sockaddr_in& a);
void tune(int fd, std::chrono::milliseconds stall);
std::int64_t write_now(int fd, iovec* iov, std::size_t n);
bool write_all(int fd, iovec* iov, int n);
bool peer_on_this_host(int fd);
bool read_all(int fd, iovec* iov, std::size_t n, std::string* why, bool idle_ok = false);
std::string stall_or_error(std::chrono::milliseconds stall);
std::uint64_t random_token();

// Moves iov (n pieces) past the first k bytes, which went out or came in.
template <class Count>
void consume(iovec*& iov, Count& n, std::size_t k) {
  while (n > 0 && k >= iov->iov_len) {
    k -= iov->iov_len;
    ++iov;
    --n;
  }
  if (n > 0) {
    iov->iov_base = static_cast<char*>(iov->iov_base) + k;
    iov->iov_len -= k;
  }
}

}  // namespace plane_internal

// The socket helpers the reader uses.
using plane_internal::closed_by_peer;
using plane_internal::consume;
using plane_internal::errno_text;
using plane_internal::read_all;

// A connection's bytes for its reader thread. Small reads (frame headers, messages) come
// out of a buffer filled with as much as the socket has, so a burst of small frames costs
// one recv instead of two per frame; large ones (payloads) go straight to where they
// belong once the buffer is drained. Before the buffer's recv sleeps, it polls for `poll`
// (data_plane's busy_poll), counting in `polled` the refills that polling found. Before a
// read that may sleep it calls before_wait; `awake` is set once bytes came (lingering
// write batches watch it: data_plane::reader_waits).
class socket_reader {
 public:
  socket_reader(int fd, shared_poll_budget poll, std::atomic<std::uint64_t>& polled, std::function<void()> before_wait,
                std::atomic<bool>& awake)
      : fd_(fd), buf_(64u << 10), poll_(std::move(poll)), polled_(polled), before_wait_(std::move(before_wait)),
        awake_(awake) {}

  // read_all's contract: all of iov, false with *why on end of stream, error or timeout.
  bool read(iovec* iov, std::size_t n, std::string* why, bool idle_ok = false) {
    const bool had = drain(iov, n);
    if (n == 0) return true;
    std::size_t wanted = 0;
    for (std::size_t i = 0; i < n; ++i) wanted += iov[i].iov_len;
    if (wanted > buf_.size() / 2) {
      socket_had_more_ = true;  // not known: as if it had
      before_wait_();
      const bool ok = read_all(fd_, iov, n, why, idle_ok && !had);
      awake_ = true;
      return ok;
    }
    if (!refill(wanted, why, idle_ok && !had)) return false;
    drain(iov, n);
    return true;
  }
  // Whether bytes already read wait here (the next read may not wait for the socket).
  bool buffered() const { return begin_ < end_; }
  // Whether the next read would wait: nothing buffered, and the last recv left nothing in
  // the socket (it filled less than the room it was given). Bytes that came since are
  // read once the woken actors ran: asking the socket again cost a system call a burst.
  bool drained() const { return !buffered() && !socket_had_more_; }
  bool read(void* p, std::size_t n, std::string* why, bool idle_ok = false) {
    iovec iov{p, n};
    return read(&iov, 1, why, idle_ok);
  }
  // A payload landed (see poll_budget_here).
  void note_payload() { payload_since_refill_ = true; }

 private:
  // Buffered bytes into iov; true if there were any.
  bool drain(iovec*& iov, std::size_t& n) {
    bool any = false;
    while (n > 0 && begin_ < end_) {
      auto k = std::min(iov->iov_len, end_ - begin_);
      std::memcpy(iov->iov_base, buf_.data() + begin_, k);
      begin_ += k;
      any = true;
      consume(iov, n, k);
    }
    return any;
  }
  // Asks whether the socket has anything for recv (bytes, its end, an error) without
  // sleeping (poll_while_idle), so that the recv after it need not sleep. It asks with
  // poll(2), which takes no lock: recv does, and asking with it held up the sender's
  // sendmsg on the same connection (TCP 1 MiB at window 1: 0.66-0.72x with recv).
  bool poll_for_bytes() {
    const bool ready = poll_while_idle(poll_budget_here(), [this] {
      pollfd asked{fd_, POLLIN, 0};
      const int n = ::poll(&asked, 1, 0);
      return n != 0 && !(n < 0 && errno == EINTR);
    });
    if (ready) ++polled_;
    return ready;
  }
  // The budget of the poll before a refill. While a payload came since the last one, the
  // next header is on the critical path of a copy or a sum, and a poll's few system calls
  // are cheap beside the wake-up it saves. Between small frames they are not: those polls
  // wait only while a CPU is free (libps/net/cpu_room.hpp).
  std::chrono::microseconds poll_budget_here() {
    const bool payload_came = payload_since_refill_;
    payload_since_refill_ = false;
    return payload_came ? budget_now(poll_) : budget_while_room(poll_);
  }
  // Fills the (drained) buffer with at least `wanted` bytes.
  bool refill(std::size_t wanted, std::string* why, bool idle_ok) {
    begin_ = end_ = 0;
    if (!poll_for_bytes()) before_wait_();
    while (end_ < wanted) {
      const auto room = buf_.size() - end_;
      auto k = ::recv(fd_, buf_.data() + end_, room, 0);
      socket_had_more_ = k == static_cast<ssize_t>(room);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (idle_ok && end_ == 0) continue;
        *why = "the peer went silent (receive timeout)";
        return false;
      }
      if (k <= 0) {
        *why = k == 0 ? std::string(closed_by_peer) : errno_text();
        return false;
      }
      end_ += static_cast<std::size_t>(k);
    }
    awake_ = true;
    return true;
  }

  int fd_;
  std::vector<char> buf_;
  std::size_t begin_ = 0, end_ = 0;
  shared_poll_budget poll_;
  std::atomic<std::uint64_t>& polled_;
  bool payload_since_refill_ = false;
  bool socket_had_more_ = true;  // see drained
  std::function<void()> before_wait_;
  std::atomic<bool>& awake_;
};

}  // namespace ps
