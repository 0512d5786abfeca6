// The data plane's connections: the listener, accepting and connecting, peers on this
// host, and connections that end.
#include "actors/plane/plane_internal.hpp"

namespace ps {

using namespace plane_internal;

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

std::shared_ptr<transport> data_plane::make(const transport_settings& s, bool rings) {
  auto plane = shared(std::make_unique<data_plane>(data_plane_address{s.bind_host, s.advertised_host, s.port},
                                                   s.min_bytes, s.claim_timeout, s.stall_timeout, s.secret,
                                                   rings ? s.ring_bytes : 0, s.busy_poll, s.tcp_congestion));
  if (s.messages_in) plane->enable_messages(*s.messages_in);
  return plane;
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
  landed_.notify_all();  // a connect waiting for this connection's ring answer waits no more
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

std::string data_plane::gone(const connection& c) const {
  if (c.broken || stopping_) return "the " + c.name + " ended";
  pollfd p{c.fd, POLLRDHUP, 0};
  if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
    return "the " + c.name + " ended (" + closed_by_peer + ")";
  return "";
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

}  // namespace ps
