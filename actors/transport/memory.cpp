// The in-memory transport: fabrics of members in one process, payloads copied on offload.
#include "actors/transport/memory.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>

#include "libps/net/bulk.hpp"

namespace ps {

namespace {

class memory_transport;

// The members that can reach each other, by token (numbered from 1 in creation order).
struct memory_fabric {
  std::mutex mtx;
  std::uint64_t next_token = 1;
  std::map<std::uint64_t, std::weak_ptr<memory_transport>> members;
};

std::shared_ptr<memory_fabric> fabric_named(const std::string& name) {
  static std::mutex mtx;
  static std::map<std::string, std::weak_ptr<memory_fabric>> fabrics;
  std::lock_guard<std::mutex> guard(mtx);
  auto& slot = fabrics[name];
  auto fabric = slot.lock();
  if (!fabric) slot = fabric = std::make_shared<memory_fabric>();
  return fabric;
}

class memory_transport final : public transport {
 public:
  // Payloads nobody claimed (their message was dropped) stay until the member ends: a
  // wall-clock expiry would let a slow run of a deterministic schedule differ.
  static constexpr std::chrono::hours unclaimed_kept{24 * 365};
  memory_transport(std::shared_ptr<memory_fabric> fabric, std::uint64_t token, const transport_settings& s)
      : fabric_(std::move(fabric)), token_(token), host_(s.advertised_host), min_bytes_(s.min_bytes),
        claim_timeout_(s.claim_timeout), store_(unclaimed_kept), buffers_(buffer_pool::make(64ull << 20)) {}
  ~memory_transport() override {
    std::lock_guard<std::mutex> guard(fabric_->mtx);
    fabric_->members.erase(token_);
  }

  std::uint64_t token() const override { return token_; }
  const std::string& host() const override { return host_; }
  // The token is the port: nonzero, and what connect looks the member up by.
  std::uint16_t port() const override { return static_cast<std::uint16_t>(token_); }
  std::uint64_t min_bytes() const override { return min_bytes_; }
  bool connect_blocks() const override { return false; }

  bool connect(std::uint64_t peer, const std::string& host, std::uint16_t port, std::string* why) override {
    auto other = host == host_ && port == static_cast<std::uint16_t>(peer) ? member(peer) : nullptr;
    if (!other) {
      *why = "memory transport: no member " + std::to_string(peer) + " at " + host + ":" + std::to_string(port) +
             " in fabric '" + host_ + "'";
      return false;
    }
    link(peer);
    other->link(token_);  // both ways, as a connection is
    return true;
  }

  std::optional<float_block> offload(std::uint64_t peer, const float_block& block) override {
    if (block.ticket != 0 || !block.storage) return std::nullopt;
    std::span<const float> whole(block.data(), block.size);
    return offload(peer, std::span<const std::span<const float>>(&whole, 1), block.size, block.storage);
  }
  std::optional<float_block> offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                     std::uint64_t count, std::shared_ptr<const void> keep) override {
    return offload(peer, parts, count, next_ticket_++, std::move(keep));
  }
  // `keep` goes when this returns: the values are copied by then.
  std::optional<float_block> offload(std::uint64_t peer, std::span<const std::span<const float>> parts,
                                     std::uint64_t count, std::uint64_t ticket, std::shared_ptr<const void>) override {
    if (count * sizeof(float) < min_bytes_ || peer == 0 || ticket == 0 || !in_pieces(parts.size(), count))
      return std::nullopt;
    auto to = linked(peer) ? member(peer) : nullptr;
    if (!to) return std::nullopt;
    to->land(token_, ticket, parts, count);
    bytes_sent_ += count * sizeof(float);
    return named_payload(token_, ticket, count);
  }

  std::shared_ptr<std::vector<float>> buffer(std::size_t n) override { return buffers_->get(n); }
  std::shared_ptr<std::vector<float>> copied(const float* from, std::size_t n) override {
    return buffers_->copy_of(from, n);
  }

  void expect(std::uint64_t peer, std::uint64_t ticket, std::vector<std::span<float>> into,
              std::shared_ptr<const void> keep) override {
    std::lock_guard<std::mutex> guard(mtx_);
    expected_[{peer, ticket}] = expectation{std::move(into), std::move(keep)};
  }
  // A landing holds mtx_ while it copies into expected memory, so this waits for it.
  void forget(std::uint64_t peer, std::uint64_t ticket) override {
    std::lock_guard<std::mutex> guard(mtx_);
    expected_.erase({peer, ticket});
  }

  float_block claim(const float_block& block) override {
    if (block.ticket == 0) return block;
    return {store_.take(block.origin, block.ticket, block.size, claim_timeout_, origin_name(block.origin)).owned, 0,
            block.size};
  }
  std::optional<float_block> try_claim(const float_block& block, bool) override {
    if (block.ticket == 0) return block;
    auto values = store_.try_take(block.origin, block.ticket, block.size, origin_name(block.origin));
    if (!values) return std::nullopt;
    return float_block{std::move(values->owned), 0, block.size};  // no storage: it landed in place
  }
  void when_claimable(const float_block& block, std::function<void()> ready) override {
    store_.on_ready(block.origin, block.ticket, std::move(ready));
  }
  void lend_ring_payloads() override {}  // nothing is lent: payloads are copies already
  std::chrono::milliseconds claim_timeout() const override { return claim_timeout_; }
  std::string origin_name(std::uint64_t origin) const override {
    return "member " + std::to_string(origin) + " of memory fabric '" + host_ + "'";
  }
  void origin_gone(std::uint64_t origin, const std::string& why) override { store_.close_origin(origin, why); }

  bool messages_enabled() const override { return false; }
  void serve(const caf::strong_actor_ptr&, message_filter) override {}
  caf::strong_actor_ptr proxy(std::uint64_t, caf::actor_id, const caf::node_id&) override { return nullptr; }

  bool host_crowded() const override { return false; }
  bool sends_by_ring(std::uint64_t) const override { return false; }
  bool sends_by_ring_to_all() const override { return false; }
  void quiet() override {}
  transport_counters counters() const override {
    transport_counters c;
    c.bytes_sent = bytes_sent_;
    c.bytes_received = bytes_received_;
    return c;
  }

  // A payload from origin: into the memory expected for it when its size fits, else a buffer.
  void land(std::uint64_t origin, std::uint64_t ticket, std::span<const std::span<const float>> parts,
            std::uint64_t count) {
    landed_values values;
    {
      std::lock_guard<std::mutex> guard(mtx_);
      auto it = expected_.find({origin, ticket});
      if (it != expected_.end() && fits(it->second.into, count)) {
        copy_into(parts, it->second.into);
        expected_.erase(it);
      } else {
        values.owned = buffers_->get(count);
        copy_into(parts, {std::span<float>(*values.owned)});
      }
      bytes_received_ += count * sizeof(float);
    }
    store_.put(origin, ticket, std::move(values), count);  // outside mtx_: it may call a waiter
  }

 private:
  struct expectation {
    std::vector<std::span<float>> into;
    std::shared_ptr<const void> keep;
  };

  static bool fits(const std::vector<std::span<float>>& into, std::uint64_t count) {
    std::uint64_t room = 0;
    for (auto s : into) room += s.size();
    return room == count;
  }
  // Copies the parts, in order, across the pieces of `into` (as many floats in all).
  static void copy_into(std::span<const std::span<const float>> parts, const std::vector<std::span<float>>& into) {
    std::size_t piece = 0, at = 0;
    for (auto part : parts)
      for (std::size_t done = 0; done < part.size();) {
        auto n = std::min(part.size() - done, into[piece].size() - at);
        std::copy_n(part.data() + done, n, into[piece].data() + at);
        done += n;
        at += n;
        if (at == into[piece].size()) ++piece, at = 0;
      }
  }

  std::shared_ptr<memory_transport> member(std::uint64_t token) const {
    std::lock_guard<std::mutex> guard(fabric_->mtx);
    auto it = fabric_->members.find(token);
    return it == fabric_->members.end() ? nullptr : it->second.lock();
  }
  void link(std::uint64_t peer) {
    std::lock_guard<std::mutex> guard(mtx_);
    linked_.insert(peer);
  }
  bool linked(std::uint64_t peer) const {
    std::lock_guard<std::mutex> guard(mtx_);
    return linked_.count(peer) != 0;
  }

  std::shared_ptr<memory_fabric> fabric_;
  std::uint64_t token_;
  std::string host_;
  std::uint64_t min_bytes_;
  std::chrono::milliseconds claim_timeout_;
  payload_store store_;
  std::shared_ptr<buffer_pool> buffers_;
  mutable std::mutex mtx_;
  std::map<std::pair<std::uint64_t, std::uint64_t>, expectation> expected_;  // by (peer, ticket)
  std::set<std::uint64_t> linked_;
  std::atomic<std::uint64_t> next_ticket_{1}, bytes_sent_{0}, bytes_received_{0};
};

}  // namespace

std::shared_ptr<transport> make_memory_transport(const transport_settings& settings) {
  auto fabric = fabric_named(settings.advertised_host);
  std::lock_guard<std::mutex> guard(fabric->mtx);
  auto token = fabric->next_token++;
  if (token > 0xffff) throw bad_request("memory transport: fabric '" + settings.advertised_host + "' is full");
  auto member = std::make_shared<memory_transport>(fabric, token, settings);
  fabric->members[token] = member;
  return member;
}

}  // namespace ps
