// CAF connections that check what arrives before CAF sees it (libps/net/basp_guard.hpp) and,
// with --secret-file, prove the shared secret first (libps/net/secret.hpp): no byte reaches
// CAF's protocol from a peer that has not. This is a middleman actor of our own, the way
// CAF's OpenSSL module adds TLS: the default middleman's publish and remote_actor would
// bypass it, so every process publishes and connects through the functions here.
#pragma once

#include <caf/io/all.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "libps/net/secret.hpp"
#include "runtime/tls_stream.hpp"

namespace ps {

struct net_guard_options {
  std::optional<shared_secret> secret;     // none: no proof asked or given
  std::shared_ptr<const tls_context> tls;  // none: plain TCP
  std::uint64_t max_message_bytes = 512u << 20;
  std::chrono::milliseconds handshake_timeout{10000};  // a peer silent before its handshake is cut off
};

// Sets the options of sys's guarded connections; before its first publish or connect
// (else the options of sys's node_config apply, or the defaults).
void configure_net_guard(caf::actor_system& sys, net_guard_options options);

caf::expected<std::uint16_t> guarded_publish(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                                             std::set<std::string> interface, std::uint16_t port,
                                             const std::string& bind_host, bool reuse);
caf::expected<caf::strong_actor_ptr> guarded_connect(caf::actor_system& sys, const std::set<std::string>& interface,
                                                     const std::string& host, std::uint16_t port);

template <class Handle>
caf::expected<std::uint16_t> guarded_publish(const Handle& whom, std::uint16_t port, const std::string& bind_host,
                                             bool reuse) {
  auto& sys = whom.home_system();
  return guarded_publish(sys, caf::actor_cast<caf::strong_actor_ptr>(whom), sys.message_types(whom), port,
                         bind_host, reuse);
}

template <class Handle>
caf::expected<Handle> guarded_remote_actor(caf::actor_system& sys, const std::string& host, std::uint16_t port) {
  auto ptr = guarded_connect(sys, sys.message_types<Handle>(), host, port);
  if (!ptr) return std::move(ptr.error());
  return caf::actor_cast<Handle>(std::move(*ptr));
}

}  // namespace ps
