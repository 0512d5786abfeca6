#include "runtime/tls_stream.hpp"

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <poll.h>

#include <algorithm>
#include <csignal>

#include "libps/keys/keys.hpp"

namespace ps {

namespace {

std::string openssl_errors() {
  std::string text;
  while (auto e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    text += (text.empty() ? "" : "; ") + std::string(buf);
  }
  return text.empty() ? "no detail from OpenSSL" : text;
}

}  // namespace

tls_context::tls_context(const std::string& cert, const std::string& key, const std::string& ca) {
  // OpenSSL writes with write(2): a peer gone mid-write would end this process by SIGPIPE
  // instead of failing that connection (plain sockets here write with MSG_NOSIGNAL).
  std::signal(SIGPIPE, SIG_IGN);
  ctx_ = SSL_CTX_new(TLS_method());
  if (!ctx_) throw bad_request("TLS: cannot make a context: " + openssl_errors());
  auto refuse = [&](const std::string& flag, const std::string& file) {
    auto why = openssl_errors();
    SSL_CTX_free(ctx_);
    throw bad_request(flag + "=" + file + " cannot be used: " + why);
  };
  SSL_CTX_set_min_proto_version(ctx_, TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx_, cert.c_str()) != 1) refuse("--tls-cert", cert);
  if (SSL_CTX_use_PrivateKey_file(ctx_, key.c_str(), SSL_FILETYPE_PEM) != 1) refuse("--tls-key", key);
  if (SSL_CTX_check_private_key(ctx_) != 1) refuse("--tls-key", key + " (not the key of --tls-cert)");
  if (SSL_CTX_load_verify_locations(ctx_, ca.c_str(), nullptr) != 1) refuse("--tls-ca", ca);
  // Both sides show a certificate signed by --tls-ca, or the handshake fails.
  SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // CAF hands a write the rest of its buffer, which may have moved since the last try.
  SSL_CTX_set_mode(ctx_, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
}

tls_context::~tls_context() { SSL_CTX_free(ctx_); }

tls_stream::tls_stream(const tls_context& ctx, int fd, bool accepting) : fd_(fd), ssl_(SSL_new(ctx.get())) {
  if (!ssl_) throw bad_request("TLS: cannot make a session: " + openssl_errors());
  SSL_set_fd(ssl_, fd);
  if (accepting)
    SSL_set_accept_state(ssl_);
  else
    SSL_set_connect_state(ssl_);
}

tls_stream::~tls_stream() { SSL_free(ssl_); }

tls_stream::step tls_stream::result_of(int ret) {
  switch (SSL_get_error(ssl_, ret)) {
    case SSL_ERROR_WANT_READ:
    case SSL_ERROR_WANT_WRITE:
      return step::again;
    case SSL_ERROR_ZERO_RETURN:
    case SSL_ERROR_SYSCALL:
      error_ = "the connection closed";
      closed_ = true;
      ERR_clear_error();
      return step::failed;
    default:
      // A process that exits closes its sockets without TLS's goodbye: a close, not an attack.
      auto reason = ERR_GET_REASON(ERR_peek_error());
      closed_ = reason == SSL_R_UNEXPECTED_EOF_WHILE_READING;
      error_ = closed_ ? "the connection closed"
               : reason == SSL_R_TLSV1_ALERT_UNKNOWN_CA
                   ? "TLS: the peer refused our certificate (is it signed by the peer's --tls-ca?)"
                   : "TLS: " + openssl_errors();
      ERR_clear_error();
      return step::failed;
  }
}

tls_stream::step tls_stream::handshake() {
  ERR_clear_error();
  int ret = SSL_do_handshake(ssl_);
  if (ret == 1) return step::done;
  auto s = result_of(ret);
  if (s == step::failed) {
    auto verdict = SSL_get_verify_result(ssl_);
    if (verdict != X509_V_OK) error_ += " (peer certificate: " + std::string(X509_verify_cert_error_string(verdict)) + ")";
    if (error_.rfind("TLS: ", 0) == 0) error_.erase(0, 5);
    error_ = "TLS handshake failed: " + error_;
  }
  return s;
}

bool tls_stream::handshake_within(std::chrono::milliseconds limit, std::string* why) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    auto s = handshake();
    if (s == step::done) return true;
    if (s == step::failed) return *why = error_, false;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    short events = SSL_want_write(ssl_) ? POLLOUT : POLLIN;
    pollfd p{fd_, events, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) == 0)
      return *why = "no TLS handshake within " + std::to_string(limit.count()) + " ms", false;
  }
}

tls_stream::step tls_stream::read(void* buf, std::size_t len, std::size_t& got) {
  ERR_clear_error();
  got = 0;
  int ret = SSL_read(ssl_, buf, static_cast<int>(std::min<std::size_t>(len, 1u << 30)));
  if (ret > 0) {
    got = static_cast<std::size_t>(ret);
    return step::done;
  }
  return result_of(ret);
}

tls_stream::step tls_stream::write(const void* buf, std::size_t len, std::size_t& put) {
  ERR_clear_error();
  put = 0;
  if (len == 0) return step::done;
  int ret = SSL_write(ssl_, buf, static_cast<int>(std::min<std::size_t>(len, 1u << 30)));
  if (ret > 0) {
    put = static_cast<std::size_t>(ret);
    return step::done;
  }
  return result_of(ret);
}

bool tls_stream::pending() const { return SSL_pending(ssl_) > 0; }

std::string tls_stream::error() const { return error_; }

}  // namespace ps
