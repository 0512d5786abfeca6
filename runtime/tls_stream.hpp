// TLS on one connection with OpenSSL, certificates required and checked on both sides
// (--tls-cert, --tls-key, --tls-ca). Ours rather than CAF's OpenSSL module: that one lost
// the end of a job's messages in 3 of 4 runs of a 2x2 Fashion-MNIST job here (servers saw
// the coordinator's connection break before its last message), and it cannot sit under the
// BASP checks and the shared secret of runtime/guarded_net.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

struct ssl_ctx_st;
struct ssl_st;

namespace ps {

// What every connection of a process shares: its certificate, key and trusted authority.
class tls_context {
 public:
  // Throws bad_request naming the file that cannot be used and why.
  tls_context(const std::string& cert, const std::string& key, const std::string& ca);
  ~tls_context();
  tls_context(const tls_context&) = delete;
  tls_context& operator=(const tls_context&) = delete;
  ssl_ctx_st* get() const { return ctx_; }

 private:
  ssl_ctx_st* ctx_ = nullptr;
};

// One connection's TLS over a non-blocking socket. Each call does what it can now.
class tls_stream {
 public:
  enum class step { done, again, failed };
  tls_stream(const tls_context& ctx, int fd, bool accepting);
  ~tls_stream();
  tls_stream(const tls_stream&) = delete;
  tls_stream& operator=(const tls_stream&) = delete;

  step handshake();
  // The connecting side's handshake, waiting for the socket up to `limit`.
  bool handshake_within(std::chrono::milliseconds limit, std::string* why);
  step read(void* buf, std::size_t len, std::size_t& got);
  step write(const void* buf, std::size_t len, std::size_t& put);
  bool pending() const;      // decrypted bytes wait inside OpenSSL (no socket event will come)
  std::string error() const;  // why the last call failed
  bool closed() const { return closed_; }  // it failed because the peer closed the connection

 private:
  step result_of(int ret);
  int fd_;
  ssl_st* ssl_ = nullptr;
  std::string error_;
  bool closed_ = false;
};

}  // namespace ps
