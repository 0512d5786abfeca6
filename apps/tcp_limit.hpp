#pragma once
// The physical limit for bench_kv: request/response over plain loopback TCP sockets
// (TCP_NODELAY), the same shape as a push (payload out, 8-byte ack back), with a window
// of requests in flight. No CAF, no copies beyond the kernel's.
#include <cstdint>

namespace ps {

struct tcp_limit_result {
  double gbps = 0;  // 1e9 bytes of payload per second
  std::uint64_t ops = 0;
  double seconds = 0;
};

// Throws std::runtime_error on a socket error.
tcp_limit_result measure_tcp_loopback(std::uint64_t message_bytes, int window, double seconds);

// One thread's memcpy of message_bytes from one warm buffer to another, for `seconds`:
// the limit of any transport that copies the bytes once more than the kernel does
// (shared memory between processes).
tcp_limit_result measure_memcpy(std::uint64_t message_bytes, double seconds);

}  // namespace ps
