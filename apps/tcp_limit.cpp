#include "apps/tcp_limit.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
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
    auto k = ::write(fd, c, n);
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

void nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

tcp_limit_result measure_tcp_loopback(std::uint64_t message_bytes, int window, double seconds) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (lfd < 0) fail("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) fail("bind");
  socklen_t len = sizeof(addr);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  if (::listen(lfd, 1) < 0) fail("listen");
  // Server: read a length-prefixed message, answer with an 8-byte ack.
  std::thread server([lfd, message_bytes] {
    int fd = ::accept(lfd, nullptr, nullptr);
    if (fd < 0) return;
    nodelay(fd);
    std::vector<char> buf(message_bytes);
    std::uint64_t n = 0;
    while (read_all(fd, &n, sizeof(n)) && n <= buf.size() && read_all(fd, buf.data(), n))
      write_all(fd, &n, sizeof(n));
    ::close(fd);
  });
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) < 0) fail("connect");
  nodelay(fd);
  std::vector<char> payload(message_bytes, 1);
  // The client writes ahead by `window` requests: a writer thread and the acks read here.
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
  ::close(fd);
  server.join();
  ::close(lfd);
  res.gbps = static_cast<double>(res.ops) * static_cast<double>(message_bytes) / res.seconds / 1e9;
  return res;
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
