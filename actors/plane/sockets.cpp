// Socket helpers of the data plane: addresses, tuning, whole reads and writes, tokens.
#include "actors/plane/plane_internal.hpp"

namespace ps::plane_internal {

thread_local const data_plane* own_plane = nullptr;

std::string errno_text() { return std::strerror(errno); }

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
bool read_all(int fd, iovec* iov, std::size_t n, std::string* why, bool idle_ok) {
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

std::uint64_t random_token() {
  std::random_device rd;
  std::uint64_t t = 0;
  while (t == 0) t = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return t;
}

}  // namespace ps::plane_internal
