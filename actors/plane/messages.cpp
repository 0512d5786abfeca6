// Messages between actors over data connections: the proxy that stands for a peer's
// actor, and messages sent, delivered and failed.
#include "actors/plane/plane_internal.hpp"

namespace ps {

using namespace plane_internal;

// ---- Messages between actors over data connections ----

namespace {

// A request that could not go (no connection) or whose connection ended before its
// answer: its sender hears so as the answer, and may send it again through CAF.
void answer_unsent(const caf::strong_actor_ptr& sender, caf::message_id mid, const std::string& why) {
  if (!sender || !mid.is_request()) return;
  sender->enqueue(caf::make_mailbox_element(nullptr, mid.response_id(), {}, make_error(errc::unsent, why)), nullptr);
}

// This process's stand-in for an actor of a peer process: what is enqueued to it is
// written on the data connection to that process.
class plane_proxy final : public caf::actor_proxy {
 public:
  plane_proxy(caf::actor_config& cfg, std::shared_ptr<plane_link> link, std::uint64_t peer)
      : caf::actor_proxy(cfg), link_(std::move(link)), peer_(peer) {}

  void enqueue(caf::mailbox_element_ptr x, caf::execution_unit*) override {
    bool sent = false;
    {
      std::shared_lock<std::shared_mutex> guard(link_->mtx);
      if (link_->plane) sent = link_->plane->send_message(peer_, id(), *x);
    }
    if (!sent) answer_unsent(x->sender, x->mid, "no data connection to the process of actor " + std::to_string(id()));
  }
  bool add_backlink(caf::abstract_actor*) override { return false; }
  bool remove_backlink(caf::abstract_actor*) override { return false; }
  void kill_proxy(caf::execution_unit* ctx, caf::error reason) override { cleanup(std::move(reason), ctx); }

 private:
  std::shared_ptr<plane_link> link_;
  std::uint64_t peer_;
};

}  // namespace

void data_plane::enable_messages(caf::actor_system& sys) { sys_ = &sys; }

void data_plane::serve(const caf::strong_actor_ptr& local, message_filter allowed) {
  if (!local) return;
  std::lock_guard<std::mutex> guard(mtx_);
  served_[local->id()] = served_actor{caf::weak_actor_ptr{local.get()}, std::move(allowed)};
}

std::shared_ptr<data_plane::connection> data_plane::connection_to(std::uint64_t peer) const {
  std::lock_guard<std::mutex> guard(mtx_);
  for (const auto& c : conns_)
    if (c->peer == peer && !c->broken) return c;
  return nullptr;
}

bool data_plane::sends_by_ring(std::uint64_t peer) const {
  auto c = connection_to(peer);
  return c && c->ring_ready;
}

void data_plane::origin_gone(std::uint64_t origin, const std::string& why) {
  if (connection_to(origin)) return;
  store_.close_origin(origin, why);
}

bool data_plane::sends_by_ring_to_all() const {
  std::lock_guard<std::mutex> guard(mtx_);
  bool any = false;
  for (const auto& c : conns_) {
    if (c->broken) continue;
    if (!c->ring_ready) return false;
    any = true;
  }
  return any;
}

caf::strong_actor_ptr data_plane::proxy(std::uint64_t peer, caf::actor_id remote, const caf::node_id& node) {
  if (!sys_ || peer == 0) return nullptr;
  auto c = connection_to(peer);
  if (!c || !c->peer_takes_messages) return nullptr;
  std::lock_guard<std::mutex> guard(mtx_);
  auto& p = proxies_[{peer, remote}];
  if (!p) {
    caf::actor_config cfg;
    p = caf::make_actor<plane_proxy, caf::strong_actor_ptr>(remote, node, sys_, cfg, link_, peer);
  }
  return p;
}

bool data_plane::takes_messages(std::uint64_t peer, std::chrono::milliseconds within) {
  std::unique_lock<std::mutex> lock(mtx_);
  return landed_.wait_for(lock, within, [&] {
    return std::any_of(conns_.begin(), conns_.end(),
                       [&](const auto& c) { return c->peer == peer && !c->broken && c->peer_takes_messages; });
  });
}

void data_plane::announce_messages(const std::shared_ptr<connection>& c) {
  if (sys_)
    send_or_queue(c, data_plane_frame{encode_bulk_header({bulk_kind::message, 0, 0}), {}, nullptr, 0, bulk_header_bytes});
}

bool data_plane::send_message(std::uint64_t peer, caf::actor_id target, caf::mailbox_element& x) {
  auto c = sys_ ? connection_to(peer) : nullptr;
  if (!c || !c->peer_takes_messages) return false;
  // Room for a message like this thread's last one: grown byte by byte, a 4 KiB push's
  // body was copied a dozen times on the way.
  thread_local std::size_t last_body_bytes = 256;
  auto body = std::make_shared<std::vector<char>>();
  body->reserve(last_body_bytes);
  message_envelope envelope{target, x.sender ? x.sender->id() : 0, x.mid.integer_value(),
                            x.sender ? x.sender->node() : caf::node_id{}};
  auto content = x.move_content_to_message();
  const auto form = encode_typed_message(envelope, content, *body) ? message_body::typed : message_body::caf;
  if (form == message_body::caf) {
    caf::binary_serializer sink{*sys_, *body};
    if (auto err = sink(envelope.to, envelope.from, envelope.from_node, envelope.mid, content)) {
      log_line(log_level::warning, c->name + ": a message that does not serialize: " + caf::to_string(err));
      return false;
    }
  }
  body->resize((body->size() + 3) / 4 * 4);  // frames carry whole 4-byte words
  last_body_bytes = body->size();
  const auto key = std::make_pair(static_cast<caf::actor_id>(envelope.from), x.mid.request_id().integer_value());
  if (x.mid.is_request() && x.sender) {  // before the write: its answer may come at once
    std::lock_guard<std::mutex> guard(c->asked_mtx);
    c->asked[key] = connection::asker{x.sender, x.mid};
  }
  std::span<const float> words(reinterpret_cast<const float*>(body->data()), body->size() / 4);
  data_plane_frame frame{encode_bulk_header({bulk_kind::message, static_cast<std::uint64_t>(form), body->size()}), {words}, body, 0,
                         bulk_header_bytes + body->size()};
  frame.request = x.mid.is_request();
  ++messages_sent_;  // before the write: its answer may come, and be counted, before this thread goes on
  if (!send_or_queue(c, std::move(frame))) {
    --messages_sent_;
    std::lock_guard<std::mutex> guard(c->asked_mtx);
    c->asked.erase(key);
    return false;
  }
  return true;
}

std::size_t data_plane::readers_awake() const {
  std::lock_guard<std::mutex> guard(mtx_);
  return static_cast<std::size_t>(std::count_if(conns_.begin(), conns_.end(), [](const auto& c) { return c->reader_awake.load(); }));
}

std::vector<std::string> data_plane::congestion_controls(bool accepted) const {
  std::lock_guard<std::mutex> guard(mtx_);
  std::vector<std::string> names;
  for (const auto& c : conns_) {
    if (c->accepted != accepted) continue;
    char name[32] = {};
    socklen_t len = sizeof name;
    names.push_back(::getsockopt(c->fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0 ? name : "?");
  }
  return names;
}

std::size_t data_plane::requests_unanswered() const {
  std::lock_guard<std::mutex> guard(mtx_);
  std::size_t n = 0;
  for (const auto& c : conns_) {
    std::lock_guard<std::mutex> asked_guard(c->asked_mtx);
    n += c->asked.size();
  }
  return n;
}

void data_plane::fail_unanswered(connection& c, const std::string& why) {
  decltype(c.asked) asked;
  {
    std::lock_guard<std::mutex> guard(c.asked_mtx);
    asked.swap(c.asked);
  }
  for (auto& [key, a] : asked)  // in request order per sender
    answer_unsent(a.sender, a.request, "the " + c.name + " ended (" + why + ")");
}

bool data_plane::deliver(const std::shared_ptr<connection>& c, const bulk_header& h, caf::execution_unit* runner,
                         std::string* why) {
  if (h.bytes == 0) {  // the peer takes messages
    {
      std::lock_guard<std::mutex> guard(mtx_);  // takes_messages waits on it
      c->peer_takes_messages = true;
    }
    landed_.notify_all();
    return true;
  }
  if (!sys_) throw bad_request("a message frame, but this side takes none (--ps.direct-requests=0)");
  auto& body = c->message_body;  // reused: a fresh block of KiBs per message cost malloc_consolidate runs
  body.resize(h.bytes);
  if (!c->in->read(body.data(), body.size(), why)) {
    *why = "in the middle of a message: " + *why;
    return false;
  }
  caf::message content;
  message_envelope envelope;
  if (h.id == static_cast<std::uint64_t>(message_body::typed)) {
    envelope = decode_typed_message(body, content);
  } else {
    caf::binary_deserializer source{*sys_, body};
    if (auto err = source(envelope.to, envelope.from, envelope.from_node, envelope.mid, content))
      throw bad_request("a message frame that does not decode: " + caf::to_string(err));
  }
  deliver_message(c, envelope, std::move(content), runner);
  return true;
}

void data_plane::deliver_message(const std::shared_ptr<connection>& c, const message_envelope& envelope,
                                 caf::message content, caf::execution_unit* runner) {
  const auto to = envelope.to, from = envelope.from;
  const auto& from_node = envelope.from_node;
  ++messages_received_;
  caf::message_id mid{envelope.mid};
  if (mid.is_response()) {
    std::lock_guard<std::mutex> guard(c->asked_mtx);
    c->asked.erase({static_cast<caf::actor_id>(to), mid.request_id().integer_value()});
  }
  caf::strong_actor_ptr target;
  message_filter allowed;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    if (auto it = served_.find(to); it != served_.end()) {
      target = it->second.actor.lock();
      allowed = it->second.allowed;
    }
  }
  auto sender = from != 0 ? proxy(c->peer, from, from_node) : nullptr;
  if (!target || !allowed(mid, content)) {
    auto text = "actor " + std::to_string(to) + (target ? " does not take this message" : " is not served here") +
                " over the " + c->name;
    log_line(log_level::warning, text);
    // An actor not served (any more) has ended, as far as the sender can tell: the error
    // CAF gives for a dead receiver, so a client waits for its shard's failover.
    auto err = target ? make_ps_error(text) : caf::make_error(caf::sec::request_receiver_down);
    if (sender && mid.is_request())
      sender->enqueue(caf::make_mailbox_element(nullptr, mid.response_id(), {}, std::move(err)), nullptr);
    return;
  }
  target->enqueue(caf::make_mailbox_element(std::move(sender), mid, {}, std::move(content)), runner);
}

}  // namespace ps
