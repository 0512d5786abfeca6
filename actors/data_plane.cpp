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
#include "libps/busy_poll.hpp"
#include "libps/done_signal.hpp"
#include "libps/codec.hpp"
#include "libps/log.hpp"
#include "libps/shm_ring.hpp"

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

struct data_plane::connection {
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

namespace {

std::string errno_text() { return std::strerror(errno); }

constexpr std::size_t iov_max = 1024;  // IOV_MAX on Linux

std::string address_of(const sockaddr_in& a) {
  char buf[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof(buf));
  return std::string(buf) + ":" + std::to_string(ntohs(a.sin_port));
}

void tune(int fd, std::chrono::milliseconds stall) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  timeval tv{static_cast<time_t>(stall.count() / 1000), static_cast<suseconds_t>((stall.count() % 1000) * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));  // a frame stalled midway ends
}

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

// Writes what the socket takes now of iov (modified), without waiting: the bytes
// written, or -1 on an error other than a full socket.
std::int64_t write_now(int fd, iovec* iov, std::size_t n) {
  std::int64_t total = 0;
  while (n > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min(n, iov_max);
    auto k = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return total;
    if (k <= 0) return -1;
    total += k;
    consume(iov, n, static_cast<std::size_t>(k));
  }
  return total;
}

// Writes all of iov (modified); false on error or a stall past SO_SNDTIMEO.
bool write_all(int fd, iovec* iov, int n) {
  while (n > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<std::size_t>(n);
    auto k = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    consume(iov, n, static_cast<std::size_t>(k));
  }
  return true;
}

// The plane whose reader or writer this thread is (data_plane::shared).
thread_local const data_plane* own_plane = nullptr;

// Why a reader ended when its peer closed the connection between frames (the usual end).
constexpr const char* closed_by_peer = "closed by the peer";

// Whether the socket's peer is a process on this host: its address is a loopback one, or
// this end's own (a connection to one's own address stays inside the host).
bool peer_on_this_host(int fd) {
  sockaddr_in mine{}, theirs{};
  socklen_t mine_len = sizeof mine, theirs_len = sizeof theirs;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_len) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_len) != 0 || theirs.sin_family != AF_INET)
    return false;
  return (ntohl(theirs.sin_addr.s_addr) >> 24) == 127 || theirs.sin_addr.s_addr == mine.sin_addr.s_addr;
}

// Fills all of iov (modified): false on end of stream, error or a receive timeout in the
// middle (why says which). idle_ok: a timeout before the first byte means "no frame yet".
bool read_all(int fd, iovec* iov, std::size_t n, std::string* why, bool idle_ok = false) {
  bool started = false;
  while (n > 0) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = std::min(n, iov_max);
    auto k = ::recvmsg(fd, &msg, MSG_WAITALL);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (idle_ok && !started) continue;
      *why = "the peer went silent (receive timeout)";
      return false;
    }
    if (k == 0) {
      *why = closed_by_peer;
      return false;
    }
    if (k < 0) {
      *why = errno_text();
      return false;
    }
    started = true;
    consume(iov, n, static_cast<std::size_t>(k));
  }
  return true;
}


// Why a write_all failed: its stall (SO_SNDTIMEO) or the socket's error.
std::string stall_or_error(std::chrono::milliseconds stall) {
  return errno == EAGAIN || errno == EWOULDBLOCK ? "no progress for " + std::to_string(stall.count()) + " ms"
                                                 : errno_text();
}

}  // namespace

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
  // wait only while a CPU is free (libps/cpu_room.hpp).
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

namespace {

std::uint64_t random_token() {
  std::random_device rd;
  std::uint64_t t = 0;
  while (t == 0) t = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return t;
}

}  // namespace

data_plane::data_plane(const data_plane_address& at, std::uint64_t min_bytes, std::chrono::milliseconds claim_timeout,
                       std::chrono::milliseconds stall_timeout, std::optional<shared_secret> secret,
                       std::size_t ring_bytes, std::chrono::microseconds busy_poll, std::string tcp_congestion)
    : host_(at.advertised_host), token_(random_token()), min_bytes_(min_bytes), claim_timeout_(claim_timeout),
      stall_timeout_(stall_timeout), ring_bytes_(ring_bytes), store_(claim_timeout * 2),
      buffers_(buffer_pool::make(512ull << 20)), secret_(std::move(secret)), link_(std::make_shared<plane_link>()),
      busy_poll_(busy_poll), tcp_congestion_(std::move(tcp_congestion)), cpus_(host_cpus()),
      poll_budget_(std::make_shared<std::atomic<std::int64_t>>(poll_budget(busy_poll, 0, cpus_).count())) {
  link_->plane = this;
  if (ring_bytes_ > 0) remove_stale_rings();
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) throw bad_request("data plane: socket: " + errno_text());
  const auto& host = at.bind_host;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(at.port);
  int one = 1;  // a fixed port binds again at once after a restart
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  set_congestion(listen_fd_);
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {  // a name: resolve it
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res); rc != 0) {
      ::close(listen_fd_);
      throw bad_request("data plane: cannot resolve host '" + host + "': " + gai_strerror(rc));
    }
    addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  socklen_t len = sizeof(addr);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) < 0 || ::listen(listen_fd_, 64) < 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len) < 0) {
    auto why = errno_text();
    ::close(listen_fd_);
    throw bad_request("data plane: cannot listen on " + host + ":" + std::to_string(at.port) + ": " + why);
  }
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { accept_loop(); });
}

data_plane::~data_plane() {
  {
    std::unique_lock<std::shared_mutex> cut(link_->mtx);  // waits for sends under way
    link_->plane = nullptr;
  }
  stopping_ = true;
  ::shutdown(listen_fd_, SHUT_RDWR);  // wakes accept
  acceptor_.join();
  ::close(listen_fd_);
  std::vector<std::shared_ptr<connection>> all;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    for (auto& c : conns_) {
      ::shutdown(c->fd, SHUT_RDWR);  // wakes the readers
      std::lock_guard<std::mutex> out_guard(c->out_mtx);
      c->out_ready.notify_all();  // and the writers (stopping_)
    }
    all = conns_;
    all.insert(all.end(), dead_.begin(), dead_.end());
  }
  for (auto& c : all) {  // without mtx_: an ending thread takes it in drop()
    if (c->reader.joinable()) c->reader.join();
    if (c->writer.joinable()) c->writer.join();
  }
  std::lock_guard<std::mutex> guard(mtx_);
  for (auto& c : all) ::close(c->fd);
  conns_.clear();
  dead_.clear();
  proxies_.clear();
}

// Before the connection is made: BBR, once it ran on a socket, leaves it paced by a kernel
// timer after a switch to another algorithm (sk_pacing_status stays set), so a listener's
// accepted sockets inherit the algorithm and a connecting socket gets it before connect.
void data_plane::set_congestion(int fd) {
  if (auto why = set_tcp_congestion(fd, tcp_congestion_); !why.empty() && !congestion_warned_.exchange(true))
    log_line(log_level::warning, "data plane: TCP congestion control '" + tcp_congestion_ + "' refused (" + why +
                                     "): connections keep the host's default");
}

std::shared_ptr<data_plane> data_plane::shared(std::unique_ptr<data_plane> plane) {
  return std::shared_ptr<data_plane>(plane.release(), [](data_plane* p) {
    if (own_plane == p)
      std::thread([p] { delete p; }).detach();  // this thread ends once p's destructor shut its socket
    else
      delete p;
  });
}

void data_plane::add(std::shared_ptr<connection> c) {
  reap();
  std::lock_guard<std::mutex> guard(mtx_);
  conns_.push_back(c);
  c->peer_here = peer_on_this_host(c->fd);
  count_peer_here(*c, +1);
  c->reader = std::thread([this, c] {
    read_loop(c);
    ++c->loops_ended;
  });
  c->writer = std::thread([this, c] {
    write_loop(c);
    ++c->loops_ended;
  });
}

void data_plane::count_peer_here(connection& c, int delta) {
  if (!c.peer_here) return;
  peers_here_ += delta;
  poll_budget_->store(poll_budget(busy_poll_, peers_here_, cpus_).count());
  crowded_.store(ps::host_crowded(peers_here_, cpus_), std::memory_order_relaxed);
}

void data_plane::reap() {
  std::vector<std::shared_ptr<connection>> done;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    auto ended = std::partition(dead_.begin(), dead_.end(), [](const auto& c) { return c->loops_ended < 2; });
    done.assign(ended, dead_.end());
    dead_.erase(ended, dead_.end());
  }
  for (auto& c : done) {
    c->reader.join();
    c->writer.join();
    ::close(c->fd);
  }
}

void data_plane::drop(const std::shared_ptr<connection>& c, const std::string& why) {
  if (c->broken.exchange(true)) return;
  // A peer that closes between frames is the usual end; anything else is said: the claims
  // it fails name it too, but later blocks to that peer go through CAF instead, slower,
  // and nothing else would tell why.
  if (!stopping_ && !quiet_ && why != closed_by_peer)
    log_line(log_level::warning, c->name + ": " + why + "; closing it (what was queued on it is lost, its claims fail)");
  ::shutdown(c->fd, SHUT_RDWR);  // the reader ends; the fd is closed with the plane
  {
    std::lock_guard<std::mutex> guard(c->out_mtx);  // the writer ends; what it had queued is let go
    c->outbox.clear();
    c->out_ready.notify_all();
  }
  if (c->peer != 0) store_.close_origin(c->peer, "the " + c->name + " ended (" + why + ")");
  fail_unanswered(*c, why);
  std::lock_guard<std::mutex> guard(mtx_);
  std::erase_if(proxies_, [&](const auto& p) { return p.first.first == c->peer; });  // holders keep theirs
  std::erase(conns_, c);
  count_peer_here(*c, -1);
  dead_.push_back(c);
  std::erase_if(expected_, [&](const auto& e) { return e.first.first == c->peer; });  // it will not answer
}

void data_plane::accept_loop() {
  while (!stopping_) {
    sockaddr_in from{};
    socklen_t len = sizeof(from);
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;  // shut down
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: say so, let ended connections go, and go on.
      std::fprintf(stderr, "data plane on %s:%u: accept failed: %s; accepting again\n", host_.c_str(), port_,
                   errno_text().c_str());
      reap();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // no event says descriptors are free again
      continue;
    }
    tune(fd, stall_timeout_);
    auto c = std::make_shared<connection>();
    c->fd = fd;
    c->name = "data connection from " + address_of(from);
    c->accepted = true;
    add(std::move(c));
  }
}

// A payload that lands in a buffer of ours. One that is large grows its buffer with the
// bytes that come, not with what its header announced: four peers announcing 256 MiB
// each and sending nothing held 1 GB.
bool data_plane::read_payload(const payload_source& from, std::uint64_t bytes,
                              std::shared_ptr<std::vector<float>>& values, std::string* why) {
  constexpr std::uint64_t step = 16u << 20;
  if (bytes <= step) {
    values = buffers_->get(bytes / sizeof(float));
    iovec iov{values->data(), bytes};
    return from(&iov, 1, why);
  }
  values = buffers_->get(0);
  values->reserve(bytes / sizeof(float));  // address space only, until written
  for (std::uint64_t have = 0; have < bytes; have += step) {
    auto n = std::min(step, bytes - have);
    values->resize((have + n) / sizeof(float));
    iovec iov{reinterpret_cast<char*>(values->data()) + have, n};
    if (!from(&iov, 1, why)) return false;
  }
  return true;
}

std::string data_plane::gone(const connection& c) const {
  if (c.broken || stopping_) return "the " + c.name + " ended";
  pollfd p{c.fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
    return "the " + c.name + " ended (" + closed_by_peer + ")";
  return "";
}

bool data_plane::offer_ring(const std::shared_ptr<connection>& c) {
  if (ring_bytes_ == 0) return false;
  try {
    c->out_nonce = random_token();
    c->out_ring = shm_ring::create(c->out_nonce, ring_bytes_);
    c->out_ring->poll_before_waiting(poll_budget_);
  } catch (const bad_request& e) {
    log_line(log_level::warning, c->name + ": no shared memory (" + e.what() + "); payloads go over TCP");
    c->out_ring.reset();
    return false;
  }
  auto pid = static_cast<std::uint64_t>(::getpid());
  return send_or_queue(c, data_plane_frame{encode_bulk_header({bulk_kind::ring, c->out_nonce, pid}), {}, nullptr, 0,
                                           bulk_header_bytes});
}

// A ring the peer offered: mapped when this host has it (then the peer hears ring_ok),
// else its payloads keep coming over TCP.
void data_plane::take_ring(const std::shared_ptr<connection>& c, const bulk_header& h) {
  if (c->in_ring) throw bad_request("a second ring frame");
  std::string why = "this side keeps to TCP (--ps.shm-ring-bytes=0)";
  if (ring_bytes_ > 0) c->in_ring = shm_ring::open(static_cast<std::uint32_t>(h.bytes), h.id, &why);
  if (!c->in_ring) {
    log_line(log_level::debug, c->name + ": " + why + "; payloads come over TCP");
  } else {
    c->in_ring->poll_before_waiting(poll_budget_);
    // Payloads lent from the ring and not claimed yet (their claims may come only after
    // payloads still to come through it) are copied out when the writer needs their room.
    c->in_ring->when_held_by_lent([this, peer = c->peer.load()] {
      store_.own_lent(peer, std::bind_front(&data_plane::copied, this));
    });
  }
  send_or_queue(c, data_plane_frame{encode_bulk_header({bulk_kind::ring_ok, h.id, c->in_ring ? 1u : 0u}), {}, nullptr,
                                    0, bulk_header_bytes});
}

void data_plane::ring_answer(const std::shared_ptr<connection>& c, const bulk_header& h) {
  if (!c->out_ring || h.id != c->out_nonce) throw bad_request("ring_ok for a ring this side did not offer");
  if (h.bytes == 1) c->ring_ready = true;
  else c->out_ring.reset();  // the peer cannot map it (another host): let it go
  {
    std::lock_guard<std::mutex> guard(mtx_);
    c->ring_answered = true;
  }
  landed_.notify_all();
}

// A payload frame: its bytes, from the socket or the peer's ring, go where the claimer
// said (expect) or into a buffer of ours. False, with *why, when they did not all come.
bool data_plane::land(const std::shared_ptr<connection>& c, const bulk_header& h, std::string* why) {
  payload_source from = [&in = *c->in](iovec* iov, std::size_t n, std::string* w) { return in.read(iov, n, w); };
  const bool by_ring = h.kind == bulk_kind::ring_payload;
  if (by_ring) {
    if (!c->in_ring) throw bad_request("a ring payload on a connection without a ring");
    reader_waits(c);  // the ring's waits may sleep (set awake again once it landed)
    if (!c->in_ring->skip_to_record(h.bytes, [&] { return gone(*c); }, stall_timeout_, why)) {
      *why = "before payload " + std::to_string(h.id) + ": " + *why;
      return false;
    }
    from = [this, c](iovec* iov, std::size_t n, std::string* w) {
      std::vector<std::span<std::byte>> into;
      for (std::size_t i = 0; i < n; ++i) into.emplace_back(static_cast<std::byte*>(iov[i].iov_base), iov[i].iov_len);
      return c->in_ring->read(into, [&] { return gone(*c); }, stall_timeout_, w);
    };
  }
  std::optional<expectation> target;
  const auto key = std::make_pair(c->peer.load(), h.id);
  {
    std::lock_guard<std::mutex> guard(mtx_);
    if (auto it = expected_.find(key); it != expected_.end()) {
      target = std::move(it->second);
      expected_.erase(it);
      landing_.insert(key);  // forget() waits until the memory is left alone
    }
  }
  std::uint64_t target_bytes = 0;
  if (target)
    for (auto s : target->into) target_bytes += s.size_bytes();
  landed_values values;
  bool ok = false;
  if (target && target_bytes == h.bytes) {  // straight into place
    std::vector<iovec> iov;
    for (auto s : target->into) iov.push_back({s.data(), s.size_bytes()});
    ok = from(iov.data(), iov.size(), why);
  }
  if (target) {
    {
      std::lock_guard<std::mutex> guard(mtx_);
      landing_.erase(key);
    }
    landed_.notify_all();
  }
  if (!target || target_bytes != h.bytes)
    ok = by_ring ? land_from_ring(c, h, from, values, why) : read_payload(from, h.bytes, values.owned, why);
  if (!ok) {
    *why = "in the middle of payload " + std::to_string(h.id) + ": " + *why;
    return false;
  }
  c->reader_awake = true;
  bytes_received_ += h.bytes;
  store_.put(c->peer, h.id, std::move(values), h.bytes / sizeof(float));
  return true;
}

bool data_plane::land_from_ring(const std::shared_ptr<connection>& c, const bulk_header& h, const payload_source& from,
                                landed_values& values, std::string* why) {
  if (!lend_ || !c->in_ring->lendable(h.bytes) || h.bytes % sizeof(float) != 0)
    return read_payload(from, h.bytes, values.owned, why);
  auto lent = c->in_ring->lend(h.bytes, [&] { return gone(*c); }, stall_timeout_, why);
  if (!lent) return false;
  values.lent = std::shared_ptr<const float>(lent, reinterpret_cast<const float*>(lent.get()));
  return true;
}

void data_plane::read_frames(const std::shared_ptr<connection>& c, std::string* why) {
  // The actors this thread's messages woke run here once it has read all that came,
  // when it would wait for more (inline_runner), payloads included: with nothing more on
  // its way a shard's sum overlaps nothing, and handing it to the scheduler only added a
  // wake-up (BENCHMARKS.md, "A reader sums what nothing follows"). They go to the
  // scheduler instead when more is on its way (the socket has bytes), so that a shard
  // sums one chunk while this thread reads the next.
  std::optional<inline_runner> woken;
  if (sys_) woken.emplace(*sys_);
  for (;;) {
    if (woken && woken->waiting() > 0 && !c->in->buffered()) {
      if (c->in->drained()) {
        reader_runs_ += woken->waiting();  // before: what they send may be answered at once
        done_signal::wake_batch one_wake;  // the ops they complete wake their waiters once, after
        woken->run();
      } else {
        woken->hand_over();
      }
    }
    std::array<std::byte, bulk_header_bytes> raw;
    if (!c->in->read(raw.data(), raw.size(), why, true)) return;
    auto h = decode_bulk_header(raw);
    if (h.kind == bulk_kind::hello) {
      if (c->peer != 0) throw bad_request("a second hello frame");
      if (h.id == 0) throw bad_request("a hello frame without a token");
      store_.open_origin(h.id);
      c->peer = h.id;
      offer_ring(c);  // the peer proved the secret (if any) before its hello was read
      announce_messages(c);
      continue;
    }
    if (c->peer == 0) throw bad_request("a frame before the hello frame");
    if (h.kind == bulk_kind::ring) {
      take_ring(c, h);
    } else if (h.kind == bulk_kind::ring_ok) {
      ring_answer(c, h);
    } else if (h.kind == bulk_kind::message) {
      if (!deliver(c, h, woken ? &*woken : nullptr, why)) return;
    } else {
      if (woken) woken->hand_over();  // they need not wait for the payload's bytes
      c->in->note_payload();
      if (!land(c, h, why)) return;
    }
  }
}

void data_plane::read_loop(std::shared_ptr<connection> c) {
  own_plane = this;
  std::string why;
  c->in = std::make_unique<socket_reader>(c->fd, poll_budget_, polled_reads_, [this, weak = std::weak_ptr<connection>(c)] {
                                            if (auto c = weak.lock()) reader_waits(c);
                                          },
                                          c->reader_awake);
  if (c->accepted && secret_ && !challenge_peer(c->fd, *secret_, stall_timeout_, &why)) {
    drop(c, why);
    return;
  }
  try {
    read_frames(c, &why);
  } catch (const bad_request& e) {
    why = e.what();
  }
  drop(c, why);
}

namespace {

// connect(), but for at most `limit`: a peer whose link is cut would otherwise hold the
// connecting thread for the kernel's SYN retries (about two minutes). errno says why not.
bool connect_within(int fd, const sockaddr* addr, socklen_t len, std::chrono::milliseconds limit) {
  int flags = ::fcntl(fd, F_GETFL, 0);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  bool ok = ::connect(fd, addr, len) == 0;
  if (!ok && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    int n = ::poll(&p, 1, static_cast<int>(limit.count()));
    int err = 0;
    socklen_t err_len = sizeof err;
    if (n == 0) errno = ETIMEDOUT;
    else if (n > 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) == 0) errno = err;
    ok = n > 0 && err == 0;
  }
  ::fcntl(fd, F_SETFL, flags);
  return ok;
}

}  // namespace

bool data_plane::connect(std::uint64_t peer, const std::string& host, std::uint16_t port, std::string* why) {
  {
    std::lock_guard<std::mutex> guard(mtx_);
    for (auto& c : conns_)
      if (c->peer == peer) return true;
  }
  auto name = "data connection to " + host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    *why = name + ": " + gai_strerror(rc);
    return false;
  }
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd >= 0) set_congestion(fd);
  bool ok = fd >= 0 && connect_within(fd, res->ai_addr, res->ai_addrlen, stall_timeout_);
  freeaddrinfo(res);
  if (!ok) {
    *why = name + ": " + errno_text();
    if (fd >= 0) ::close(fd);
    return false;
  }
  tune(fd, stall_timeout_);
  if (std::string refused; secret_ && !answer_challenge(fd, *secret_, stall_timeout_, &refused)) {
    *why = name + ": " + refused;
    ::close(fd);
    return false;
  }
  auto hello = encode_bulk_header({bulk_kind::hello, token_, 0});
  iovec iov{hello.data(), hello.size()};
  if (!write_all(fd, &iov, 1)) {
    *why = name + ": hello: " + errno_text();
    ::close(fd);
    return false;
  }
  auto c = std::make_shared<connection>();
  c->fd = fd;
  c->peer = peer;
  c->name = name;
  store_.open_origin(peer);
  add(c);
  announce_messages(c);
  if (offer_ring(c)) {  // its first payloads go through the ring: wait for the answer (one round trip)
    std::unique_lock<std::mutex> lock(mtx_);
    landed_.wait_for(lock, stall_timeout_, [&] { return c->ring_answered || c->broken; });
  }
  return true;
}

std::optional<float_block> data_plane::offload(std::uint64_t peer, const float_block& block) {
  if (block.ticket != 0 || !block.storage) return std::nullopt;
  std::span<const float> whole(block.data(), block.size);
  return offload(peer, std::span<const std::span<const float>>(&whole, 1), block.size, block.storage);
}

std::optional<float_block> data_plane::offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                               std::uint64_t count, std::shared_ptr<const void> keep) {
  return offload_frame(peer, parts, count, next_ticket_.fetch_add(1), std::move(keep), false);
}

bool data_plane::in_pieces(std::size_t pieces, std::uint64_t count) {
  // Many small pieces cost more to hand to the kernel one by one than to copy together.
  return pieces <= 64 || count * sizeof(float) / pieces >= 4096;
}

void data_plane::expect(std::uint64_t peer, std::uint64_t ticket, std::vector<std::span<float>> into,
                        std::shared_ptr<const void> keep) {
  std::lock_guard<std::mutex> guard(mtx_);
  expected_[{peer, ticket}] = expectation{std::move(into), std::move(keep)};
}

void data_plane::forget(std::uint64_t peer, std::uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mtx_);
  auto key = std::make_pair(peer, ticket);
  expected_.erase(key);
  // A landing under way ends within the receive timeout (stall_timeout_) at the latest.
  landed_.wait_for(lock, stall_timeout_ + std::chrono::seconds(1), [&] { return !landing_.count(key); });
}

std::optional<float_block> data_plane::offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                               std::uint64_t count, std::uint64_t ticket,
                                               std::shared_ptr<const void> keep) {
  return offload_frame(peer, parts, count, ticket, std::move(keep), true);
}

std::optional<float_block> data_plane::offload_frame(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                                     std::uint64_t count, std::uint64_t ticket,
                                                     std::shared_ptr<const void> keep, bool expected) {
  if (count * sizeof(float) < min_bytes_ || peer == 0 || ticket == 0) return std::nullopt;
  if (!in_pieces(parts.size(), count)) return std::nullopt;
  std::shared_ptr<connection> c;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    for (auto& x : conns_)
      if (x->peer == peer) c = x;
  }
  if (!c) return std::nullopt;
  data_plane_frame frame{encode_bulk_header({bulk_kind::payload, ticket, count * sizeof(float)}),
                         {parts.begin(), parts.end()}, std::move(keep), ticket, bulk_header_bytes + count * sizeof(float)};
  frame.streams = expected && count * sizeof(float) > streamed_above_;
  if (!send_or_queue(c, std::move(frame))) return std::nullopt;
  bytes_sent_ += count * sizeof(float);
  float_block named;
  named.size = count;
  named.ticket = ticket;
  named.origin = token_;
  return named;
}

namespace {

// Appends the frame's header and parts not yet written to iov, as pieces for sendmsg.
void append_pieces_left(const data_plane_frame& frame, std::vector<iovec>& iov) {
  const auto first = iov.size();
  iov.push_back({const_cast<std::byte*>(frame.header.data()), frame.header.size()});
  for (auto p : frame.parts) iov.push_back({const_cast<float*>(p.data()), p.size_bytes()});
  iovec* at = iov.data() + first;
  std::size_t n = iov.size() - first;
  consume(at, n, frame.done);
  iov.erase(iov.begin() + static_cast<std::ptrdiff_t>(first), iov.begin() + (at - iov.data()));
}

// The frames' headers and parts not yet written, in order, as pieces for sendmsg.
std::vector<iovec> pieces_left(std::span<const data_plane_frame> frames) {
  std::vector<iovec> iov;
  for (const auto& f : frames) append_pieces_left(f, iov);
  return iov;
}

// The socket's header of a payload whose floats go through the ring.
auto ring_header(const data_plane_frame& frame) {
  return encode_bulk_header({bulk_kind::ring_payload, frame.ticket, frame.bytes - bulk_header_bytes});
}

// Whether the frame goes on the socket alone (not a payload through the ring).
bool plain(const data_plane_frame& frame, bool ring_ready) {
  return frame.ticket == 0 || frame.done > 0 || !ring_ready;
}

// The plain frames at the front of a queue, taken out for one write: as many as fit in
// iov_max pieces, one at least.
std::vector<data_plane_frame> take_plain_front(std::deque<data_plane_frame>& outbox, bool ring_ready) {
  std::vector<data_plane_frame> frames;
  std::size_t pieces = 0;
  while (!outbox.empty() && plain(outbox.front(), ring_ready)) {
    pieces += outbox.front().parts.size() + 1;
    if (!frames.empty() && pieces > iov_max) break;
    frames.push_back(std::move(outbox.front()));
    outbox.pop_front();
  }
  return frames;
}

// After `written` bytes of frames went out: those not finished go back to the front of
// the queue, in order. True when all went out.
bool put_back_unwritten(std::vector<data_plane_frame>& frames, std::uint64_t written,
                        std::deque<data_plane_frame>& outbox) {
  auto first_left = frames.begin();
  for (; first_left != frames.end(); ++first_left) {
    const auto left = first_left->bytes - first_left->done;
    if (written < left) break;
    written -= left;
  }
  if (first_left != frames.end()) first_left->done += written;
  outbox.insert(outbox.begin(), std::make_move_iterator(first_left), std::make_move_iterator(frames.end()));
  return first_left == frames.end();
}

thread_local write_batch* open_batch = nullptr;

}  // namespace

write_batch* write_batch::open() { return open_batch; }

write_batch::scope::scope(write_batch& batch) : opened_(open_batch == nullptr) {
  if (opened_) open_batch = &batch;
}

write_batch::scope::~scope() {
  if (opened_) open_batch = nullptr;
}

void write_batch::release() {
  auto held = std::move(held_);
  held_.clear();
  for (auto& h : held) {
    std::shared_lock<std::shared_mutex> guard(h.link->mtx);
    if (!h.link->plane) continue;
    if (!lingering_)
      h.link->plane->release(h.conn);
    else if (h.link->plane->linger(h.conn))
      lingers_.push_back(std::move(h));
  }
}

void write_batch::flush_lingering() {
  auto lingers = std::move(lingers_);
  lingers_.clear();
  for (auto& h : lingers) {
    std::shared_lock<std::shared_mutex> guard(h.link->mtx);
    if (h.link->plane) h.link->plane->unlinger(h.conn);
  }
}

bool data_plane::hold_in_batch(write_batch& batch, const std::shared_ptr<connection>& c, data_plane_frame frame) {
  std::unique_lock<std::mutex> lock(c->out_mtx);
  if (c->broken) return false;
  const bool large = frame.bytes >= write_batch::hold_bytes;
  c->outbox.push_back(std::move(frame));
  auto& held = batch.held_;
  if (std::none_of(held.begin(), held.end(), [&](const auto& h) { return h.conn == c; })) {
    held.push_back({link_, c});
    ++c->holds;
  }
  if ((large || c->outbox.size() >= write_batch::hold_frames) && !c->writing) flush_at_once(c, lock);
  return true;  // queued: a failed write drops c, which fails what was queued
}

void data_plane::flush_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock) {
  bool out = true;
  // Each write lets go of the lock at its end (a frame's `keep` goes without it), and
  // another thread (the writer thread, another batch's flush) may then take the next
  // frames and be writing: this one stops there, or two threads would write to the socket
  // and the ring at once (frames interleaved, payloads overwritten in the ring).
  while (out && !c->outbox.empty() && !c->broken && !c->writing) {
    auto frames = take_plain_front(c->outbox, c->ring_ready);
    out = frames.empty() ? ring_front_at_once(c, lock) : plain_at_once(c, lock, frames);
  }
  if (!c->outbox.empty()) c->out_ready.notify_all();  // what is left is the writer thread's
}

bool data_plane::plain_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock,
                               std::vector<data_plane_frame>& frames) {
  c->writing = true;
  lock.unlock();
  auto iov = pieces_left(frames);
  ++socket_writes_;
  auto k = write_now(c->fd, iov.data(), iov.size());
  const auto error = errno;
  lock.lock();
  c->writing = false;
  if (k < 0) {
    lock.unlock();
    c->out_ready.notify_all();
    drop(c, std::string("writing frames: ") + std::strerror(error));
    lock.lock();
    return false;
  }
  const auto all = put_back_unwritten(frames, static_cast<std::uint64_t>(k), c->outbox);
  lock.unlock();
  frames.clear();  // written: their `keep`s go (a write_signal tells its tracker) without the lock
  lock.lock();
  return all;
}

// The ring payload at the front of c's queue, written by this thread when the ring has
// room for all its floats (as send_or_queue writes one: no hop to the writer thread, which
// cost a wake-up and two context switches per payload sent from a write batch).
bool data_plane::ring_front_at_once(const std::shared_ptr<connection>& c, std::unique_lock<std::mutex>& lock) {
  auto& front = c->outbox.front();
  if (front.floats_in_ring || !c->out_ring->fits_now(front.bytes - bulk_header_bytes)) return false;
  auto frame = std::move(front);
  c->outbox.pop_front();
  auto out = write_front_at_once(c, lock, frame, true);
  if (!out || !*out) return false;
  lock.unlock();
  frame = {};  // written: its `keep` goes without the lock
  lock.lock();
  return true;
}

std::optional<bool> data_plane::write_front_at_once(const std::shared_ptr<connection>& c,
                                                    std::unique_lock<std::mutex>& lock, data_plane_frame& frame,
                                                    bool by_ring) {
  c->writing = true;
  lock.unlock();
  auto out = write_at_once(c, frame, by_ring);
  const auto why = out ? std::string() : errno_text();
  lock.lock();
  c->writing = false;
  if (!out) {
    lock.unlock();
    c->out_ready.notify_all();
    drop(c, "writing payload " + std::to_string(frame.ticket) + ": " + why);
    lock.lock();
    return std::nullopt;
  }
  if (!*out) c->outbox.push_front(std::move(frame));  // its rest, ahead of frames queued meanwhile
  return out;
}

void data_plane::release(const std::shared_ptr<connection>& c) {
  std::unique_lock<std::mutex> lock(c->out_mtx);
  if (--c->holds > 0 || c->broken || c->outbox.empty()) return;
  if (c->writing)
    c->out_ready.notify_all();  // the writer thread goes on with what waits
  else
    flush_at_once(c, lock);
}

bool data_plane::linger(const std::shared_ptr<connection>& c) {
  std::unique_lock<std::mutex> lock(c->out_mtx);
  bool watched = false;  // what waits will be written by a reader or a waiting caller
  if (!c->broken && !c->outbox.empty()) {
    if (c->lingers) {
      watched = true;  // another batch's linger holds it (and now ours)
    } else if (c->holds == 1 && (c->reader_awake || answers_due(*c))) {
      c->lingers = true;  // keeps the batch's hold
      return true;
    }
  }
  lock.unlock();
  release(c);
  return watched;
}

// Called with c's out_mtx held: requests asked on c count from before their write, so
// those still queued are taken off.
bool data_plane::answers_due(connection& c) {
  const auto queued = std::count_if(c.outbox.begin(), c.outbox.end(), [](const auto& f) { return f.request; });
  std::lock_guard<std::mutex> guard(c.asked_mtx);
  return c.asked.size() > static_cast<std::size_t>(queued);
}

void data_plane::unlinger(const std::shared_ptr<connection>& c) {
  {
    std::lock_guard<std::mutex> guard(c->out_mtx);
    if (!c->lingers) return;
    c->lingers = false;
  }
  release(c);
}

void data_plane::reader_waits(const std::shared_ptr<connection>& c) {
  {
    std::lock_guard<std::mutex> guard(c->out_mtx);
    c->reader_awake = false;
  }
  unlinger(c);
}

// What goes at once of a frame nothing is queued before, without waiting: on the socket,
// what it takes; through the ring (which has room for all of it), the floats and what the
// socket takes of the header, the header first when the frame streams. True when the
// frame is out, false when the writer thread must finish it (frame says where it stands),
// nothing on an error.
std::optional<bool> data_plane::write_at_once(const std::shared_ptr<connection>& c, data_plane_frame& frame,
                                              bool by_ring) {
  if (!by_ring) {
    auto iov = pieces_left({&frame, 1});
    ++socket_writes_;
    auto k = write_now(c->fd, iov.data(), iov.size());
    if (k < 0) return std::nullopt;
    frame.done += static_cast<std::uint64_t>(k);
    return frame.done == frame.bytes;
  }
  std::string why;
  auto header = ring_header(frame);
  iovec head{header.data(), header.size()};
  if (!frame.streams && !into_ring(c, frame, {}, &why)) return std::nullopt;  // room was there: no wait
  auto k = write_now(c->fd, &head, 1);
  if (k < 0) return std::nullopt;
  if (frame.streams) {
    ++streamed_payloads_;
    if (!into_ring(c, frame, {}, &why)) return std::nullopt;
  }
  frame.floats_in_ring = true;
  frame.ring_header_done = static_cast<std::size_t>(k);  // the writer thread goes on from there
  return frame.ring_header_done == header.size();
}

// Writes what goes at once when nothing is queued before the frame (most frames: no
// thread hop; a ring payload when the ring has room for all of it), and queues the rest
// for the writer thread. Never waits for the socket. False when the connection is broken
// (the caller sends the block).
bool data_plane::send_or_queue(const std::shared_ptr<connection>& c, data_plane_frame frame) {
  if (auto* batch = write_batch::open()) return hold_in_batch(*batch, c, std::move(frame));
  std::unique_lock<std::mutex> lock(c->out_mtx);
  if (c->broken) return false;
  const bool by_ring = frame.ticket != 0 && c->ring_ready;
  const bool idle = c->outbox.empty() && !c->writing && c->holds == 0;
  if (idle && (!by_ring || c->out_ring->fits_now(frame.bytes - bulk_header_bytes))) {
    if (!write_front_at_once(c, lock, frame, by_ring)) return false;
    // What is queued now (frames queued meanwhile, this one's rest) is the writer's; with
    // nothing, it sleeps on (a wake-up per message cost a thread switch each way).
    if (!c->outbox.empty()) c->out_ready.notify_all();
    return true;
  }
  c->outbox.push_back(std::move(frame));
  c->out_ready.notify_all();
  return true;
}

// A payload through the ring, all of it, and its header on the socket (ring_header_done
// of it may be out already). Floats that fit in the ring's room go in before the header:
// the reader, woken by the header, copies them out at once; woken first, it slept on the
// ring until this copy ended, a second wake-up per payload (2x2 at 64 KiB moved less
// than over TCP). A payload larger than the room, or one that streams (an answer larger
// than stream_answers_above), goes behind its header, the reader copying out as this thread copies
// in. False, with *why, when it could not be written.
bool data_plane::write_ring_payload(const std::shared_ptr<connection>& c, const data_plane_frame& frame,
                                    std::string* why) {
  const auto alive = [&] { return gone(*c); };
  const bool floats_first =
      !frame.floats_in_ring && !frame.streams && c->out_ring->fits_now(frame.bytes - bulk_header_bytes);
  if (floats_first && !into_ring(c, frame, alive, why)) return false;
  if (!floats_first && !frame.floats_in_ring) ++streamed_payloads_;
  auto header = ring_header(frame);
  iovec head{header.data() + frame.ring_header_done, header.size() - frame.ring_header_done};
  if (!write_all(c->fd, &head, 1)) {
    *why = stall_or_error(stall_timeout_);
    return false;
  }
  return frame.floats_in_ring || floats_first || into_ring(c, frame, alive, why);
}

// Plain frames, all of them, in as few sendmsg calls as IOV_MAX allows.
bool data_plane::write_plain(const std::shared_ptr<connection>& c, std::span<const data_plane_frame> frames,
                             std::string* why) {
  auto iov = pieces_left(frames);
  ++socket_writes_;
  bool ok = true;
  for (std::size_t at = 0; ok && at < iov.size(); at += iov_max)
    ok = write_all(c->fd, iov.data() + at, static_cast<int>(std::min(iov_max, iov.size() - at)));
  if (!ok) *why = stall_or_error(stall_timeout_);
  return ok;
}

// A payload's floats into c's ring (after its header went on the socket), counted as sent
// through shared memory before the write: the peer may have read the last byte and its
// claimer returned before this thread is scheduled again (as bytes_sent_ is counted when
// the payload is handed over). A write that fails takes its count back.
bool data_plane::into_ring(const std::shared_ptr<connection>& c, const data_plane_frame& frame,
                           const shm_ring::alive_check& alive, std::string* why) {
  std::vector<std::span<const std::byte>> pieces;
  for (auto p : frame.parts) pieces.push_back(std::as_bytes(p));
  const auto bytes = frame.bytes - bulk_header_bytes;
  shm_bytes_sent_ += bytes;
  if (c->out_ring->write(pieces, alive, stall_timeout_, why)) return true;
  shm_bytes_sent_ -= bytes;
  return false;
}

// The connection's writer thread: writes the queued payloads in order until the
// connection ends or the plane stops. A write that fails ends the connection, so every
// claim of its payloads fails at once at the receiver, naming it.
void data_plane::write_loop(std::shared_ptr<connection> c) {
  own_plane = this;
  for (;;) {
    std::vector<data_plane_frame> frames;  // plain ones together: one sendmsg for a burst of small frames
    bool by_ring = false;
    {
      std::unique_lock<std::mutex> lock(c->out_mtx);
      c->out_ready.wait(lock, [&] {
        return c->broken || stopping_ || (!c->outbox.empty() && !c->writing && c->holds == 0);
      });
      if (c->broken || stopping_) return;
      frames = take_plain_front(c->outbox, c->ring_ready);
      by_ring = frames.empty();  // a payload through the ring is first
      if (by_ring) {
        frames.push_back(std::move(c->outbox.front()));
        c->outbox.pop_front();
      }
      c->writing = true;
    }
    ++writer_thread_writes_;
    std::string why;
    bool ok = by_ring ? write_ring_payload(c, frames.front(), &why) : write_plain(c, frames, &why);
    const auto ticket = frames.front().ticket;
    {
      std::lock_guard<std::mutex> guard(c->out_mtx);
      c->writing = false;
    }
    c->out_ready.notify_all();
    if (ok) continue;
    drop(c, "writing payload " + std::to_string(ticket) + ": " + why);
    return;
  }
}

std::string data_plane::origin_name(std::uint64_t origin) const {
  std::lock_guard<std::mutex> guard(mtx_);
  for (auto& c : conns_)
    if (c->peer == origin) return c->name;
  return "process " + std::to_string(origin);
}

std::shared_ptr<std::vector<float>> data_plane::copied(const float* from, std::size_t n) {
  auto to = buffers_->get(n);
  std::copy_n(from, n, to->data());
  return to;
}

// The claimed values as a block: a lent payload is copied out for a claimer that did
// not ask for it in place (it may keep the block for as long as it likes).
float_block data_plane::as_block(landed_values values, std::uint64_t size, bool lent_ok) {
  float_block b{std::move(values.owned), 0, size};  // neither: it landed in place
  if (values.lent && lent_ok) b.lent = std::move(values.lent);
  else if (values.lent) b.storage = copied(values.lent.get(), size);
  return b;
}

float_block data_plane::claim(const float_block& block) {
  if (block.ticket == 0) return block;
  return as_block(store_.take(block.origin, block.ticket, block.size, claim_timeout_, origin_name(block.origin)),
                  block.size, false);
}

std::optional<float_block> data_plane::try_claim(const float_block& block, bool lent_ok) {
  if (block.ticket == 0) return block;
  auto values = store_.try_take(block.origin, block.ticket, block.size, origin_name(block.origin));
  if (!values) return std::nullopt;
  return as_block(std::move(*values), block.size, lent_ok);
}

void data_plane::when_claimable(const float_block& block, std::function<void()> ready) {
  store_.on_ready(block.origin, block.ticket, std::move(ready));
}

std::optional<float_block> claim_values(data_plane* plane, const float_block& block, bool lent_ok) {
  if (block.encoded) return decoded_values(block);
  if (block.ticket == 0) return block;
  if (!plane) throw bad_request("the block names a data-connection payload, but this process has no data plane");
  return plane->try_claim(block, lent_ok);
}

// ---- Messages between actors over data connections ----

namespace {

// A request that could not go (no connection) or whose connection ended before its
// answer: its sender hears so as the answer, and may send it again through CAF.
void answer_unsent(const caf::strong_actor_ptr& sender, caf::message_id mid, const std::string& why) {
  if (!sender || !mid.is_request()) return;
  sender->enqueue(caf::make_mailbox_element(nullptr, mid.response_id(), {}, make_error(errc::unsent, why)), nullptr);
}

// This process's stand-in for an actor of a peer process: what is enqueued to it is
// written on the data connection to that process.
class plane_proxy final : public caf::actor_proxy {
 public:
  plane_proxy(caf::actor_config& cfg, std::shared_ptr<plane_link> link, std::uint64_t peer)
      : caf::actor_proxy(cfg), link_(std::move(link)), peer_(peer) {}

  void enqueue(caf::mailbox_element_ptr x, caf::execution_unit*) override {
    bool sent = false;
    {
      std::shared_lock<std::shared_mutex> guard(link_->mtx);
      if (link_->plane) sent = link_->plane->send_message(peer_, id(), *x);
    }
    if (!sent) answer_unsent(x->sender, x->mid, "no data connection to the process of actor " + std::to_string(id()));
  }
  bool add_backlink(caf::abstract_actor*) override { return false; }
  bool remove_backlink(caf::abstract_actor*) override { return false; }
  void kill_proxy(caf::execution_unit* ctx, caf::error reason) override { cleanup(std::move(reason), ctx); }

 private:
  std::shared_ptr<plane_link> link_;
  std::uint64_t peer_;
};

}  // namespace

void data_plane::enable_messages(caf::actor_system& sys) { sys_ = &sys; }

void data_plane::serve(const caf::strong_actor_ptr& local, message_filter allowed) {
  if (!local) return;
  std::lock_guard<std::mutex> guard(mtx_);
  served_[local->id()] = served_actor{caf::weak_actor_ptr{local.get()}, std::move(allowed)};
}

std::shared_ptr<data_plane::connection> data_plane::connection_to(std::uint64_t peer) const {
  std::lock_guard<std::mutex> guard(mtx_);
  for (const auto& c : conns_)
    if (c->peer == peer && !c->broken) return c;
  return nullptr;
}

bool data_plane::sends_by_ring(std::uint64_t peer) const {
  auto c = connection_to(peer);
  return c && c->ring_ready;
}

void data_plane::origin_gone(std::uint64_t origin, const std::string& why) {
  if (connection_to(origin)) return;
  store_.close_origin(origin, why);
}

bool data_plane::sends_by_ring_to_all() const {
  std::lock_guard<std::mutex> guard(mtx_);
  bool any = false;
  for (const auto& c : conns_) {
    if (c->broken) continue;
    if (!c->ring_ready) return false;
    any = true;
  }
  return any;
}

caf::strong_actor_ptr data_plane::proxy(std::uint64_t peer, caf::actor_id remote, const caf::node_id& node) {
  if (!sys_ || peer == 0) return nullptr;
  auto c = connection_to(peer);
  if (!c || !c->peer_takes_messages) return nullptr;
  std::lock_guard<std::mutex> guard(mtx_);
  auto& p = proxies_[{peer, remote}];
  if (!p) {
    caf::actor_config cfg;
    p = caf::make_actor<plane_proxy, caf::strong_actor_ptr>(remote, node, sys_, cfg, link_, peer);
  }
  return p;
}

bool data_plane::takes_messages(std::uint64_t peer, std::chrono::milliseconds within) {
  std::unique_lock<std::mutex> lock(mtx_);
  return landed_.wait_for(lock, within, [&] {
    return std::any_of(conns_.begin(), conns_.end(),
                       [&](const auto& c) { return c->peer == peer && !c->broken && c->peer_takes_messages; });
  });
}

void data_plane::announce_messages(const std::shared_ptr<connection>& c) {
  if (sys_)
    send_or_queue(c, data_plane_frame{encode_bulk_header({bulk_kind::message, 0, 0}), {}, nullptr, 0, bulk_header_bytes});
}

bool data_plane::send_message(std::uint64_t peer, caf::actor_id target, caf::mailbox_element& x) {
  auto c = sys_ ? connection_to(peer) : nullptr;
  if (!c || !c->peer_takes_messages) return false;
  // Room for a message like this thread's last one: grown byte by byte, a 4 KiB push's
  // body was copied a dozen times on the way.
  thread_local std::size_t last_body_bytes = 256;
  auto body = std::make_shared<std::vector<char>>();
  body->reserve(last_body_bytes);
  message_envelope envelope{target, x.sender ? x.sender->id() : 0, x.mid.integer_value(),
                            x.sender ? x.sender->node() : caf::node_id{}};
  auto content = x.move_content_to_message();
  const auto form = encode_typed_message(envelope, content, *body) ? message_body::typed : message_body::caf;
  if (form == message_body::caf) {
    caf::binary_serializer sink{*sys_, *body};
    if (auto err = sink(envelope.to, envelope.from, envelope.from_node, envelope.mid, content)) {
      log_line(log_level::warning, c->name + ": a message that does not serialize: " + caf::to_string(err));
      return false;
    }
  }
  body->resize((body->size() + 3) / 4 * 4);  // frames carry whole 4-byte words
  last_body_bytes = body->size();
  const auto key = std::make_pair(static_cast<caf::actor_id>(envelope.from), x.mid.request_id().integer_value());
  if (x.mid.is_request() && x.sender) {  // before the write: its answer may come at once
    std::lock_guard<std::mutex> guard(c->asked_mtx);
    c->asked[key] = connection::asker{x.sender, x.mid};
  }
  std::span<const float> words(reinterpret_cast<const float*>(body->data()), body->size() / 4);
  data_plane_frame frame{encode_bulk_header({bulk_kind::message, static_cast<std::uint64_t>(form), body->size()}), {words}, body, 0,
                         bulk_header_bytes + body->size()};
  frame.request = x.mid.is_request();
  ++messages_sent_;  // before the write: its answer may come, and be counted, before this thread goes on
  if (!send_or_queue(c, std::move(frame))) {
    --messages_sent_;
    std::lock_guard<std::mutex> guard(c->asked_mtx);
    c->asked.erase(key);
    return false;
  }
  return true;
}

std::size_t data_plane::readers_awake() const {
  std::lock_guard<std::mutex> guard(mtx_);
  return static_cast<std::size_t>(std::count_if(conns_.begin(), conns_.end(), [](const auto& c) { return c->reader_awake.load(); }));
}

std::vector<std::string> data_plane::congestion_controls(bool accepted) const {
  std::lock_guard<std::mutex> guard(mtx_);
  std::vector<std::string> names;
  for (const auto& c : conns_) {
    if (c->accepted != accepted) continue;
    char name[32] = {};
    socklen_t len = sizeof name;
    names.push_back(::getsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0 ? name : "?");
  }
  return names;
}

std::size_t data_plane::requests_unanswered() const {
  std::lock_guard<std::mutex> guard(mtx_);
  std::size_t n = 0;
  for (const auto& c : conns_) {
    std::lock_guard<std::mutex> asked_guard(c->asked_mtx);
    n += c->asked.size();
  }
  return n;
}

void data_plane::fail_unanswered(connection& c, const std::string& why) {
  decltype(c.asked) asked;
  {
    std::lock_guard<std::mutex> guard(c.asked_mtx);
    asked.swap(c.asked);
  }
  for (auto& [key, a] : asked)  // in request order per sender
    answer_unsent(a.sender, a.request, "the " + c.name + " ended (" + why + ")");
}

bool data_plane::deliver(const std::shared_ptr<connection>& c, const bulk_header& h, caf::execution_unit* runner,
                         std::string* why) {
  if (h.bytes == 0) {  // the peer takes messages
    {
      std::lock_guard<std::mutex> guard(mtx_);  // takes_messages waits on it
      c->peer_takes_messages = true;
    }
    landed_.notify_all();
    return true;
  }
  if (!sys_) throw bad_request("a message frame, but this side takes none (--ps.direct-requests=0)");
  auto& body = c->message_body;  // reused: a fresh block of KiBs per message cost malloc_consolidate runs
  body.resize(h.bytes);
  if (!c->in->read(body.data(), body.size(), why)) {
    *why = "in the middle of a message: " + *why;
    return false;
  }
  caf::message content;
  message_envelope envelope;
  if (h.id == static_cast<std::uint64_t>(message_body::typed)) {
    envelope = decode_typed_message(body, content);
  } else {
    caf::binary_deserializer source{*sys_, body};
    if (auto err = source(envelope.to, envelope.from, envelope.from_node, envelope.mid, content))
      throw bad_request("a message frame that does not decode: " + caf::to_string(err));
  }
  deliver_message(c, envelope, std::move(content), runner);
  return true;
}

void data_plane::deliver_message(const std::shared_ptr<connection>& c, const message_envelope& envelope,
                                 caf::message content, caf::execution_unit* runner) {
  const auto to = envelope.to, from = envelope.from;
  const auto& from_node = envelope.from_node;
  ++messages_received_;
  caf::message_id mid{envelope.mid};
  if (mid.is_response()) {
    std::lock_guard<std::mutex> guard(c->asked_mtx);
    c->asked.erase({static_cast<caf::actor_id>(to), mid.request_id().integer_value()});
  }
  caf::strong_actor_ptr target;
  message_filter allowed;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    if (auto it = served_.find(to); it != served_.end()) {
      target = it->second.actor.lock();
      allowed = it->second.allowed;
    }
  }
  auto sender = from != 0 ? proxy(c->peer, from, from_node) : nullptr;
  if (!target || !allowed(mid, content)) {
    auto text = "actor " + std::to_string(to) + (target ? " does not take this message" : " is not served here") +
                " over the " + c->name;
    log_line(log_level::warning, text);
    // An actor not served (any more) has ended, as far as the sender can tell: the error
    // CAF gives for a dead receiver, so a client waits for its shard's failover.
    auto err = target ? make_ps_error(text) : caf::make_error(caf::sec::request_receiver_down);
    if (sender && mid.is_request())
      sender->enqueue(caf::make_mailbox_element(nullptr, mid.response_id(), {}, std::move(err)), nullptr);
    return;
  }
  target->enqueue(caf::make_mailbox_element(std::move(sender), mid, {}, std::move(content)), runner);
}

namespace {

using claimer_ptr = payload_claimer_actor::stateful_pointer<payload_claimer_state>;

// A failed claim's error: errc::payload_lost where asking again may get the payload.
caf::error claim_error(const bad_request& e) {
  if (dynamic_cast<const payload_lost*>(&e)) return make_error(errc::payload_lost, e.what());
  return make_ps_error(e.what());
}

// Answers the waiting claims of (origin, ticket) whose payload can be claimed now.
void answer_claims(claimer_ptr self, data_plane& plane, std::pair<std::uint64_t, std::uint64_t> key) {
  auto& waiting = self->state.waiting;
  for (auto it = waiting.find(key); it != waiting.end() && it->first == key;) {
    auto& claim = it->second;
    try {
      auto values = plane.try_claim(claim.block, self->state.lent_ok);
      if (!values) return;  // not yet (a duplicate claim took it): wait on
      claim.promise.deliver(std::move(*values));
    } catch (const bad_request& e) {
      claim.promise.deliver(claim_error(e));
    }
    it = waiting.erase(it);
  }
}

}  // namespace

plane_connector_actor::behavior_type plane_connector(plane_connector_actor::pointer self,
                                                     std::shared_ptr<data_plane> plane) {
  // It ends with its owner, however that ends (a link ignores a normal exit).
  self->set_exit_handler([self](caf::exit_msg& msg) { self->quit(msg.reason); });
  return {[=](connect_atom, std::uint64_t peer, const std::string& host,
              std::uint16_t port) -> caf::result<std::uint64_t> {
    std::string why;
    if (plane->connect(peer, host, port, &why)) return peer;
    return make_ps_error(why);
  }};
}

payload_claimer_actor::behavior_type payload_claimer(claimer_ptr self, std::shared_ptr<data_plane> plane,
                                                     bool lent_ok) {
  self->state.lent_ok = lent_ok;
  // It ends with its owner, however that ends: a link ignores a normal exit, and a
  // pending expiry would keep it alive for the claim timeout (a shard's process waited
  // 10 s at its end).
  self->set_exit_handler([self](caf::exit_msg& msg) { self->quit(msg.reason); });
  return {
    [=](claim_atom, const float_block& block) -> caf::result<float_block> {
      try {
        if (auto values = plane->try_claim(block, self->state.lent_ok)) return std::move(*values);
      } catch (const bad_request& e) {
        return claim_error(e);
      }
      auto key = std::make_pair(block.origin, block.ticket);
      auto rp = self->make_response_promise<float_block>();
      self->state.waiting.emplace(key, payload_claimer_state::waiting_claim{block, rp, self->clock().now() +
                                                                                          plane->claim_timeout()});
      // Weak: a claimer that ended is not kept alive by a payload that never comes.
      plane->when_claimable(block, [addr = self->address(), key] {
        if (auto me = caf::actor_cast<caf::actor>(addr)) caf::anon_send(me, landed_atom::value, key.first, key.second);
      });
      self->delayed_send(self, plane->claim_timeout(), expire_atom::value, key.first, key.second);
      return rp;
    },
    [=](landed_atom, std::uint64_t origin, std::uint64_t ticket) { answer_claims(self, *plane, {origin, ticket}); },
    [=](expire_atom, std::uint64_t origin, std::uint64_t ticket) {
      auto& waiting = self->state.waiting;
      auto [from, to] = waiting.equal_range({origin, ticket});
      for (auto it = from; it != to;) {
        if (it->second.deadline > self->clock().now()) {  // a later claim of the same payload
          ++it;
          continue;
        }
        it->second.promise.deliver(make_error(errc::payload_lost, "payload " + std::to_string(ticket) + " (" +
                                                 std::to_string(it->second.block.size) + " floats) from " +
                                                 plane->origin_name(origin) + " did not arrive within " +
                                                 std::to_string(plane->claim_timeout().count()) + " ms"));
        it = waiting.erase(it);
      }
    },
  };
}

namespace {

// Answers the waits for at most writes->done payloads; the signals stop telling the
// tracker once none is left.
void answer_drained(write_tracker_state& st, store_writes& writes) {
  auto last = st.waiting.upper_bound(writes.done.load());
  for (auto it = st.waiting.begin(); it != last; ++it) it->second.deliver(caf::ok_atom::value);
  st.waiting.erase(st.waiting.begin(), last);
  if (st.waiting.empty()) writes.awaited = false;
}

}  // namespace

write_tracker_actor::behavior_type write_tracker(write_tracker_actor::stateful_pointer<write_tracker_state> self,
                                                 std::shared_ptr<store_writes> writes) {
  self->set_exit_handler([self](caf::exit_msg& msg) { self->quit(msg.reason); });  // ends with its owner, also normally
  return {
    [=](written_atom) { answer_drained(self->state, *writes); },
    [=](drained_atom, std::uint64_t issued) -> caf::result<caf::ok_atom> {
      if (writes->done >= issued) return caf::ok_atom::value;
      auto rp = self->make_response_promise<caf::ok_atom>();
      self->state.waiting.emplace(issued, rp);
      // Said before done is read again: a signal that comes between either sees it and
      // tells, or its count is in what is read here (both are sequentially consistent).
      writes->awaited = true;
      answer_drained(self->state, *writes);
      return rp;
    },
  };
}

std::shared_ptr<const void> written_signal(const write_tracker_actor& tracker, std::shared_ptr<store_writes> writes) {
  return std::shared_ptr<const void>(nullptr, [tracker, writes](const void*) {
    ++writes->done;
    if (writes->awaited) caf::anon_send(tracker, written_atom::value);
  });
}

}  // namespace ps
