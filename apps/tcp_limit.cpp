#include "apps/tcp_limit.hpp"

#include "libps/net/tcp_congestion.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ps {

namespace {

void fail(const char* what) {
  throw std::runtime_error(std::string("tcp limit: ") + what + ": " + std::strerror(errno));
}

void write_all(int fd, const void* p, std::size_t n) {
  auto c = static_cast<const char*>(p);
  while (n > 0) {
    auto k = ::send(fd, c, n, MSG_NOSIGNAL);  // a closed peer is an error here, not a signal
    if (k <= 0) fail("write");
    c += k;
    n -= static_cast<std::size_t>(k);
  }
}

bool read_all(int fd, void* p, std::size_t n) {
  auto c = static_cast<char*>(p);
  while (n > 0) {
    auto k = ::read(fd, c, n);
    if (k == 0) return false;
    if (k < 0) fail("read");
    c += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

// Before connect or listen, as the data plane sets it (data_plane::set_congestion says why).
void congest(int fd, const std::string& congestion) {
  if (auto why = set_tcp_congestion(fd, congestion); !why.empty())
    throw std::runtime_error("tcp limit: congestion control '" + congestion + "': " + why);
}

void nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// What read() returned; fails on an error.
std::size_t read_some(int fd, char* p, std::size_t n) {
  for (;;) {
    auto k = ::read(fd, p, n);
    if (k >= 0) return static_cast<std::size_t>(k);
    if (errno != EINTR) fail("read");
  }
}

// Answers each whole request of request_bytes with 8 bytes, all of one read's in one write.
void answer_requests(int fd, std::uint64_t request_bytes) {
  std::vector<char> in(std::max<std::uint64_t>(request_bytes * 64, 1 << 16)), acks;
  std::size_t have = 0;
  while (auto k = read_some(fd, in.data() + have, in.size() - have)) {
    have += k;
    const std::size_t whole = have / request_bytes;
    acks.assign(whole * 8, 1);
    if (whole > 0) write_all(fd, acks.data(), acks.size());
    have -= whole * request_bytes;
    std::memmove(in.data(), in.data() + whole * request_bytes, have);
  }
}

// A client connected over loopback to a server thread that runs serve(accepted socket).
// However the client's side ends (an error throws), the connection is shut down, so that
// the server's reads return, and the thread joined before the sockets close. An error on
// the server's side ends its thread; the client then reads the end of the stream.
class loopback_server {
 public:
  template <class Serve>
  loopback_server(const std::string& congestion, Serve serve) {
    listener_.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listener_.fd < 0) fail("socket");
    congest(listener_.fd, congestion);  // accepted sockets inherit it
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (::bind(listener_.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0 ||
        ::getsockname(listener_.fd, reinterpret_cast<sockaddr*>(&addr), &len) < 0 || ::listen(listener_.fd, 1) < 0)
      fail("listen");
    client_.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (client_.fd >= 0) congest(client_.fd, congestion);
    if (client_.fd < 0 || ::connect(client_.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) fail("connect");
    nodelay(client_.fd);
    server_ = std::thread([serve, listener = listener_.fd] {
      int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) return;
      nodelay(fd);
      try {
        serve(fd);
      } catch (const std::exception&) {  // the client sees the stream end
      }
      ::close(fd);
    });
  }
  ~loopback_server() {
    ::shutdown(client_.fd, SHUT_RDWR);
    server_.join();
  }
  loopback_server(const loopback_server&) = delete;
  loopback_server& operator=(const loopback_server&) = delete;
  int client() const { return client_.fd; }

 private:
  struct socket_fd {  // closed with its owner, also when the constructor throws
    int fd = -1;
    ~socket_fd() {
      if (fd >= 0) ::close(fd);
    }
  };
  socket_fd listener_, client_;
  std::thread server_;  // started last: nothing throws after it
};

}  // namespace

tcp_limit_result measure_tcp_loopback(std::uint64_t message_bytes, int window, double seconds,
                                      const std::string& congestion) {
  // Server: read a length-prefixed message, answer with an 8-byte ack.
  loopback_server link(congestion, [message_bytes](int fd) {
    std::vector<char> buf(message_bytes);
    std::uint64_t n = 0;
    while (read_all(fd, &n, sizeof(n)) && n <= buf.size() && read_all(fd, buf.data(), n)) write_all(fd, &n, sizeof(n));
  });
  const int fd = link.client();
  std::vector<char> payload(message_bytes, 1);
  // The client keeps `window` requests written ahead of the acks it reads.
  tcp_limit_result res;
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  std::uint64_t sent = 0, acked = 0;
  auto send_one = [&] {
    std::uint64_t n = message_bytes;
    write_all(fd, &n, sizeof(n));
    write_all(fd, payload.data(), n);
    ++sent;
  };
  // Alternate: keep `window` outstanding; blocking writes are fine since the server reads.
  for (int i = 0; i < window; ++i) send_one();
  while (elapsed() < seconds || acked < 4) {
    std::uint64_t ack = 0;
    if (!read_all(fd, &ack, sizeof(ack))) fail("server closed");
    ++acked;
    send_one();
  }
  res.seconds = elapsed();
  res.ops = acked;
  ::shutdown(fd, SHUT_WR);
  std::uint64_t ack = 0;
  while (acked < sent && read_all(fd, &ack, sizeof(ack))) ++acked;
  res.gbps = static_cast<double>(res.ops) * static_cast<double>(message_bytes) / res.seconds / 1e9;
  return res;
}

request_limit_result measure_tcp_requests(std::uint64_t request_bytes, int window, double seconds,
                                          const std::string& congestion) {
  loopback_server link(congestion, [request_bytes](int fd) { answer_requests(fd, request_bytes); });
  const int fd = link.client();
  using clock = std::chrono::steady_clock;
  std::vector<char> requests(request_bytes * static_cast<std::size_t>(window), 1), acks(1 << 16);
  std::deque<clock::time_point> sent;
  std::vector<double> latencies_us;
  auto issue = [&](std::size_t n) {
    sent.insert(sent.end(), n, clock::now());
    write_all(fd, requests.data(), n * request_bytes);
  };
  const auto start = clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(clock::now() - start).count(); };
  issue(static_cast<std::size_t>(window));
  std::size_t have = 0;  // bytes of an ack read so far
  while (elapsed() < seconds || latencies_us.size() < 4) {
    const auto k = read_some(fd, acks.data(), acks.size() - have % 8);
    if (k == 0) fail("server closed");
    const std::size_t answered = (have % 8 + k) / 8;
    have += k;
    const auto now = clock::now();
    for (std::size_t i = 0; i < answered; ++i, sent.pop_front())
      latencies_us.push_back(std::chrono::duration<double, std::micro>(now - sent.front()).count());
    issue(answered);
  }
  request_limit_result r;
  r.ops = latencies_us.size();
  r.per_s = static_cast<double>(r.ops) / elapsed();
  std::nth_element(latencies_us.begin(), latencies_us.begin() + latencies_us.size() / 2, latencies_us.end());
  r.p50_us = latencies_us[latencies_us.size() / 2];
  ::shutdown(fd, SHUT_WR);
  while (read_some(fd, acks.data(), acks.size()) > 0) {
  }
  return r;
}

tcp_limit_result measure_memcpy(std::uint64_t message_bytes, double seconds) {
  std::vector<char> from(message_bytes, 1), to(message_bytes, 0);  // touched: warm pages
  tcp_limit_result r;
  const auto start = std::chrono::steady_clock::now();
  do {
    std::memcpy(to.data(), from.data(), message_bytes);
    from[r.ops % message_bytes] = static_cast<char>(to[(r.ops * 7) % message_bytes] + 1);  // no copy elided
    ++r.ops;
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (r.seconds < seconds || r.ops < 4);
  r.gbps = static_cast<double>(r.ops * message_bytes) / r.seconds / 1e9;
  return r;
}

}  // namespace ps
