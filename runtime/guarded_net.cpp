#include "runtime/guarded_net.hpp"

#include <caf/detail/socket_guard.hpp>
#include <caf/io/basp_broker.hpp>
#include <caf/io/middleman_actor_impl.hpp>
#include <caf/io/network/default_multiplexer.hpp>
#include <caf/io/network/doorman_impl.hpp>
#include <caf/io/network/interfaces.hpp>
#include <caf/io/network/stream_impl.hpp>
#include <caf/policy/tcp.hpp>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "actors/messages.hpp"
#include "libps/net/basp_guard.hpp"
#include "libps/observe/log.hpp"
#include "runtime/node.hpp"

namespace ps {

namespace {

using caf::io::network::native_socket;
using caf::io::network::rw_state;
using default_mpx = caf::io::network::default_multiplexer;

std::string peer_of(native_socket fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    ::getnameinfo(reinterpret_cast<sockaddr*>(&a), len, host, sizeof(host), port, sizeof(port),
                  NI_NUMERICHOST | NI_NUMERICSERV);
  std::string h = host;
  if (h.rfind("::ffff:", 0) == 0) h = h.substr(7);  // an IPv4 peer on a dual-stack socket
  return h + ":" + port;
}

struct connection_state;

// Cuts off connections whose peer has not finished its handshake in time: an idle
// stranger would otherwise hold a socket and a CAF scribe for good.
class handshake_reaper {
 public:
  explicit handshake_reaper(std::chrono::milliseconds limit) : limit_(limit), thread_([this] { run(); }) {}
  ~handshake_reaper() {
    {
      std::lock_guard<std::mutex> guard(mtx_);
      stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  void watch(connection_state* c);
  void forget(connection_state* c) {
    std::lock_guard<std::mutex> guard(mtx_);
    for (auto it = due_.begin(); it != due_.end(); ++it)
      if (it->second == c) {
        due_.erase(it);
        return;
      }
  }

 private:
  void run();

  std::chrono::milliseconds limit_;
  std::mutex mtx_;
  std::condition_variable wake_;
  std::multimap<std::chrono::steady_clock::time_point, connection_state*> due_;
  bool stopping_ = false;
  std::thread thread_;
};

struct guard_shared {
  net_guard_options options;
  handshake_reaper reaper{options.handshake_timeout};
  explicit guard_shared(net_guard_options o) : options(std::move(o)) {}

  // Why our last connection to an address was closed by its checks: CAF reports only
  // "disconnect_during_handshake" to the caller of remote_actor.
  void note_refusal(const std::string& address, const std::string& why) {
    std::lock_guard<std::mutex> guard(mtx);
    refusals[address] = why;
  }
  std::string take_refusal(const std::string& address) {
    std::lock_guard<std::mutex> guard(mtx);
    auto it = refusals.find(address);
    if (it == refusals.end()) return "";
    auto why = std::move(it->second);
    refusals.erase(it);
    return why;
  }
  std::mutex mtx;
  std::map<std::string, std::string> refusals;
};

// One connection's checks: the shared secret first (when configured), then TLS (when
// configured), then every BASP header. Bytes CAF writes before both are through wait in
// `held`.
struct connection_state {
  native_socket fd;
  std::string peer;
  bool accepted;
  std::shared_ptr<guard_shared> shared;  // outlives the system's registry entry if need be
  basp_frame_guard frames;
  std::optional<secret_challenge> challenge;  // accepted side, until proven
  std::unique_ptr<tls_stream> tls;
  bool tls_ready = false;
  std::vector<char> held;
  bool watched = false;

  // tls: the connecting side's session, its handshake done.
  connection_state(native_socket s, bool acc, std::shared_ptr<guard_shared> g, std::string dialed = "",
                   std::unique_ptr<tls_stream> ready = nullptr)
      : fd(s),
        peer(dialed.empty() ? peer_of(s) : std::move(dialed)),
        accepted(acc),
        shared(std::move(g)),
        frames(acc, shared->options.max_message_bytes),
        tls(std::move(ready)),
        tls_ready(tls != nullptr) {
    if (accepted && shared->options.tls) tls = std::make_unique<tls_stream>(*shared->options.tls, fd, true);
    if (accepted && shared->options.secret) {
      challenge.emplace(*shared->options.secret);
      // A fresh socket's buffer takes these 36 bytes at once.
      ::send(fd, challenge->challenge().data(), challenge->challenge().size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    watched = true;
    shared->reaper.watch(this);
    if (logs(log_level::debug))
      log_line(log_level::debug, "network: connection " + std::string(accepted ? "from " : "to ") + peer +
                                     (shared->options.secret ? ", secret" : "") + (shared->options.tls ? ", TLS" : ""));
  }
  ~connection_state() {
    if (watched) shared->reaper.forget(this);
  }
  bool holding() const { return challenge || (tls && !tls_ready); }
  void refuse(const std::string& why) const {
    if (!accepted) shared->note_refusal(peer, why);
    log_line(log_level::warning,
             "network: closed the connection " + std::string(accepted ? "from " : "to ") + peer + ": " + why);
  }
  void settled() {
    if (watched) shared->reaper.forget(this);
    watched = false;
  }
  rw_state prove(size_t& result);
  rw_state start_tls(size_t& result);
  bool send_all(const char* p, std::size_t n, bool raw);
};

void handshake_reaper::watch(connection_state* c) {
  std::lock_guard<std::mutex> guard(mtx_);
  due_.emplace(std::chrono::steady_clock::now() + limit_, c);
  wake_.notify_all();
}

void handshake_reaper::run() {
  std::unique_lock<std::mutex> lock(mtx_);
  while (!stopping_) {
    if (due_.empty()) {
      wake_.wait(lock);
      continue;
    }
    auto first = due_.begin();
    if (std::chrono::steady_clock::now() < first->first) {
      wake_.wait_until(lock, first->first);
      continue;
    }
    // Under the lock: the connection cannot end (and its descriptor be reused) meanwhile.
    first->second->refuse("no handshake within " + std::to_string(limit_.count()) + " ms");
    ::shutdown(first->second->fd, SHUT_RDWR);  // CAF reads the end of the stream and closes it
    due_.erase(first);
  }
}

// Reads the peer's answer to our challenge; on a proof, confirms (before TLS, if any).
rw_state connection_state::prove(size_t& result) {
  result = 0;
  std::uint8_t buf[answer_bytes];
  auto k = ::recv(fd, buf, challenge->missing(), MSG_DONTWAIT);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return rw_state::success;
  if (k <= 0) {
    refuse("it did not prove the shared secret (does it run without --secret-file?)");
    return rw_state::failure;
  }
  switch (challenge->feed(buf, static_cast<std::size_t>(k))) {
    case secret_challenge::state::waiting:
      return rw_state::success;
    case secret_challenge::state::refused:
      refuse("wrong proof of the shared secret (is its --secret-file the same as ours?)");
      return rw_state::failure;
    case secret_challenge::state::proven:
      break;
  }
  auto confirm = challenge->confirm();
  challenge.reset();
  if (!send_all(reinterpret_cast<const char*>(confirm.data()), confirm.size(), true)) return rw_state::failure;
  return holding() || send_all(held.data(), held.size(), false) ? rw_state::success : rw_state::failure;
}

// The accepting side's TLS handshake, a step per read event; then what CAF wrote meanwhile.
rw_state connection_state::start_tls(size_t& result) {
  result = 0;
  switch (tls->handshake()) {
    case tls_stream::step::again:
      return rw_state::success;
    case tls_stream::step::failed:
      refuse(tls->error());
      return rw_state::failure;
    case tls_stream::step::done:
      break;
  }
  tls_ready = true;
  return send_all(held.data(), held.size(), false) ? rw_state::success : rw_state::failure;
}

// Writes bytes that waited (a confirmation, CAF's handshake: small), raw or through TLS,
// with a short wait for the socket; `held` is emptied once it went.
bool connection_state::send_all(const char* p, std::size_t n, bool raw) {
  std::size_t done = 0;
  while (done < n) {
    std::size_t put = 0;
    bool again = false;
    if (raw || !tls) {
      auto k = ::send(fd, p + done, n - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      put = k > 0 ? static_cast<std::size_t>(k) : 0;
      again = k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
      if (k <= 0 && !again) break;
    } else {
      auto s = tls->write(p + done, n - done, put);
      again = s == tls_stream::step::again;
      if (s == tls_stream::step::failed) break;
    }
    done += put;
    pollfd wait_out{fd, POLLOUT, 0};
    if (again && ::poll(&wait_out, 1, 1000) <= 0) break;
  }
  if (done < n) {
    refuse("cannot write to it");
    return false;
  }
  if (p == held.data()) held.clear();
  return true;
}

struct guarded_policy {
  std::unique_ptr<connection_state> st;

  rw_state read_some(size_t& result, native_socket fd, void* buf, size_t len) {
    if (st->challenge) return st->prove(result);
    if (st->tls && !st->tls_ready) return st->start_tls(result);
    auto res = rw_state::success;
    if (st->tls) {
      auto s = st->tls->read(buf, len, result);
      if (s == tls_stream::step::failed) {
        if (!st->tls->closed()) st->refuse(st->tls->error());
        return rw_state::failure;
      }
    } else {
      res = caf::policy::tcp::read_some(result, fd, buf, len);
    }
    if (res != rw_state::success || result == 0) return res;
    if (auto why = st->frames.feed(static_cast<const std::uint8_t*>(buf), result)) {
      st->refuse(*why);
      return rw_state::failure;
    }
    if (st->watched && st->frames.handshake_seen()) st->settled();
    return res;
  }

  rw_state write_some(size_t& result, native_socket fd, const void* buf, size_t len) {
    if (st->holding()) {  // CAF's handshake waits until the peer has proved the secret and TLS is up
      auto p = static_cast<const char*>(buf);
      st->held.insert(st->held.end(), p, p + len);
      result = len;
      return rw_state::success;
    }
    if (!st->tls) return caf::policy::tcp::write_some(result, fd, buf, len);
    if (st->tls->write(buf, len, result) != tls_stream::step::failed) return rw_state::success;
    if (!st->tls->closed()) st->refuse(st->tls->error());
    return rw_state::failure;
  }

  bool try_accept(native_socket& result, native_socket fd) { return caf::policy::tcp::try_accept(result, fd); }
  // Decrypted bytes inside OpenSSL raise no socket event: read them now.
  bool must_read_more(native_socket, size_t) { return st->tls && st->tls_ready && st->tls->pending(); }
};

class guarded_scribe : public caf::io::scribe {
 public:
  // dialed: the HOST:PORT we connected to ("": an accepted connection).
  guarded_scribe(default_mpx& mpx, native_socket fd, std::shared_ptr<guard_shared> shared, std::string dialed = "",
                 std::unique_ptr<tls_stream> tls = nullptr)
      : scribe(caf::io::network::conn_hdl_from_socket(fd)),
        stream_(mpx, fd,
                guarded_policy{std::make_unique<connection_state>(fd, dialed.empty(), std::move(shared), dialed,
                                                                  std::move(tls))}) {}

  void configure_read(caf::io::receive_policy::config config) override {
    stream_.configure_read(config);
    if (!launched_) {
      launched_ = true;
      stream_.start(this);
    }
  }
  void ack_writes(bool enable) override { stream_.ack_writes(enable); }
  std::vector<char>& wr_buf() override { return stream_.wr_buf(); }
  std::vector<char>& rd_buf() override { return stream_.rd_buf(); }
  void graceful_shutdown() override {
    stream_.graceful_shutdown();
    detach(&stream_.backend(), false);
  }
  void flush() override { stream_.flush(this); }
  std::string addr() const override {
    auto x = caf::io::network::remote_addr_of_fd(stream_.fd());
    return x ? *x : "";
  }
  std::uint16_t port() const override {
    auto x = caf::io::network::remote_port_of_fd(stream_.fd());
    return x ? *x : 0;
  }
  void add_to_loop() override { stream_.activate(this); }
  void remove_from_loop() override { stream_.passivate(); }

 private:
  bool launched_ = false;
  caf::io::network::stream_impl<guarded_policy> stream_;
};

class guarded_doorman : public caf::io::network::doorman_impl {
 public:
  guarded_doorman(default_mpx& mpx, native_socket fd, std::shared_ptr<guard_shared> shared)
      : doorman_impl(mpx, fd), shared_(std::move(shared)) {}

  bool new_connection() override {
    if (detached()) return false;  // the broker let go while the socket was still polled
    auto& mpx = acceptor_.backend();
    auto fd = acceptor_.accepted_socket();
    caf::detail::socket_guard guard{fd};
    caf::io::network::nonblocking(fd, true);
    auto scribe = caf::make_counted<guarded_scribe>(mpx, fd, shared_);
    guard.release();
    auto hdl = scribe->hdl();
    parent()->add_scribe(std::move(scribe));
    return doorman::new_connection(&mpx, hdl);
  }

 private:
  std::shared_ptr<guard_shared> shared_;
};

class guarded_middleman : public caf::io::middleman_actor_impl {
 public:
  guarded_middleman(caf::actor_config& cfg, caf::actor broker, std::shared_ptr<guard_shared> shared)
      : middleman_actor_impl(cfg, std::move(broker)), shared_(std::move(shared)) {}

  const char* name() const override { return "ps.guarded_middleman"; }

 protected:
  caf::expected<caf::io::scribe_ptr> connect(const std::string& host, std::uint16_t port) override {
    auto fd = caf::io::network::new_tcp_connection(host, port);
    if (!fd) return std::move(fd.error());
    caf::detail::socket_guard guard{*fd};
    const auto address = host + ":" + std::to_string(port);
    const auto& o = shared_->options;
    std::string why;
    if (o.secret && !answer_challenge(*fd, *o.secret, o.handshake_timeout, &why)) {
      shared_->note_refusal(address, why);  // guarded_connect tells the caller
      return caf::make_error(caf::sec::cannot_connect_to_node);
    }
    caf::io::network::nonblocking(*fd, true);
    std::unique_ptr<tls_stream> tls;
    if (o.tls) {
      tls = std::make_unique<tls_stream>(*o.tls, *fd, false);
      if (!tls->handshake_within(o.handshake_timeout, &why)) {
        shared_->note_refusal(address, why);
        return caf::make_error(caf::sec::cannot_connect_to_node);
      }
    }
    auto scribe = caf::make_counted<guarded_scribe>(mpx(), *fd, shared_, address, std::move(tls));
    guard.release();
    return scribe;
  }

  caf::expected<caf::io::doorman_ptr> open(std::uint16_t port, const char* addr, bool reuse) override {
    auto fd = caf::io::network::new_tcp_acceptor_impl(port, addr, reuse);
    if (!fd) return std::move(fd.error());
    return caf::make_counted<guarded_doorman>(mpx(), *fd, shared_);
  }

 private:
  default_mpx& mpx() { return static_cast<default_mpx&>(system().middleman().backend()); }
  std::shared_ptr<guard_shared> shared_;
};

// Each actor system's guarded middleman (tests run several systems in one process).
struct guard_entry {
  std::optional<net_guard_options> options;
  caf::actor gate;
  std::shared_ptr<guard_shared> shared;
};
std::mutex registry_mtx;
std::map<caf::actor_system*, guard_entry> registry;

net_guard_options options_of(const caf::actor_system& sys) {
  net_guard_options o;
  if (auto* cfg = dynamic_cast<const node_config*>(&sys.config())) {
    if (!cfg->secret_file.empty()) o.secret = read_secret_file(cfg->secret_file);
    if (!cfg->tls_cert.empty()) o.tls = std::make_shared<tls_context>(cfg->tls_cert, cfg->tls_key, cfg->tls_ca);
    o.max_message_bytes = cfg->max_message_bytes;
    o.handshake_timeout = std::chrono::milliseconds(cfg->failure_timeout_ms);
  }
  return o;
}

guard_entry gate_of(caf::actor_system& sys) {
  std::lock_guard<std::mutex> lock(registry_mtx);
  auto& entry = registry[&sys];
  if (entry.gate) return entry;
  entry.shared = std::make_shared<guard_shared>(entry.options ? *entry.options : options_of(sys));
  auto broker = sys.middleman().named_broker<caf::io::basp_broker>(caf::atom("BASP"));
  entry.gate =
      caf::actor_cast<caf::actor>(sys.spawn<guarded_middleman, caf::detached + caf::hidden>(broker, entry.shared));
  // The middleman ends its broker when the system stops; the gate (a detached actor the
  // system would wait for) ends with it.
  broker->attach_functor([gate = entry.gate, sys_ptr = &sys] {
    {
      std::lock_guard<std::mutex> lock(registry_mtx);
      registry.erase(sys_ptr);
    }
    caf::anon_send_exit(gate, caf::exit_reason::kill);
  });
  return entry;
}

}  // namespace

void configure_net_guard(caf::actor_system& sys, net_guard_options options) {
  std::lock_guard<std::mutex> lock(registry_mtx);
  registry[&sys].options = std::move(options);
}

caf::expected<std::uint16_t> guarded_publish(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                                             std::set<std::string> interface, std::uint16_t port,
                                             const std::string& bind_host, bool reuse) {
  auto f = caf::make_function_view(caf::actor_cast<caf::io::middleman_actor>(gate_of(sys).gate));
  return f(caf::publish_atom::value, port, whom, std::move(interface), bind_host, reuse);
}

caf::expected<caf::strong_actor_ptr> guarded_connect(caf::actor_system& sys, const std::set<std::string>& interface,
                                                     const std::string& host, std::uint16_t port) {
  auto entry = gate_of(sys);
  auto f = caf::make_function_view(caf::actor_cast<caf::io::middleman_actor>(entry.gate));
  auto x = f(caf::connect_atom::value, host, port);
  if (!x) {
    auto why = entry.shared->take_refusal(host + ":" + std::to_string(port));
    if (!why.empty()) return make_error(errc::refused, host + ":" + std::to_string(port) + ": " + why);
    if (x.error() == caf::sec::disconnect_during_handshake)  // it closed on us before a word
      return make_error(errc::refused, host + ":" + std::to_string(port) +
                                           ": it closed the connection before CAF's handshake (does it run with "
                                           "--secret-file or --tls-*, and this process not?)");
    return std::move(x.error());
  }
  auto& ptr = std::get<1>(*x);
  if (!ptr) return caf::make_error(caf::sec::no_actor_published_at_port);
  if (!sys.assignable(std::get<2>(*x), interface)) return caf::make_error(caf::sec::unexpected_actor_messaging_interface);
  return std::move(ptr);
}

}  // namespace ps
