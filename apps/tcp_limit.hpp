#pragma once
// The physical limit for bench_kv: request/response over plain loopback TCP sockets
// (TCP_NODELAY), the same shape as a push (payload out, 8-byte ack back), with a window
// of requests in flight. No CAF, no copies beyond the kernel's. Both ends use the TCP
// congestion control named (libps/net/tcp_congestion.hpp), as data connections do.
#include <cstdint>
#include <string>

namespace ps {

struct tcp_limit_result {
  double gbps = 0;  // 1e9 bytes of payload per second
  std::uint64_t ops = 0;
  double seconds = 0;
};

// Throws std::runtime_error on a socket error.
tcp_limit_result measure_tcp_loopback(std::uint64_t message_bytes, int window, double seconds,
                                      const std::string& congestion);

// The limit for small requests: `window` requests of request_bytes in flight over plain
// loopback TCP, each answered with 8 bytes, one thread a side. Each side takes all the
// socket has in one read and answers (or refills the window) for all of it in one write,
// and sleeps in recv when nothing came: the coalescing a framework can do at best, with
// no polling. p50_us: from a request's write to its answer's read.
struct request_limit_result {
  double per_s = 0;
  double p50_us = 0;
  std::uint64_t ops = 0;
};
request_limit_result measure_tcp_requests(std::uint64_t request_bytes, int window, double seconds,
                                          const std::string& congestion);

// One thread's memcpy of message_bytes from one warm buffer to another, for `seconds`:
// the limit of any transport that copies the bytes once more than the kernel does
// (shared memory between processes).
tcp_limit_result measure_memcpy(std::uint64_t message_bytes, double seconds);

}  // namespace ps
