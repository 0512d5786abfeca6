#pragma once
// The client's decisions about its requests to shards, as a plain state machine (the
// shape of shard_core): per shard the requests in flight (by tag, in send order) and those
// waiting; which waiting request may leave now (order, the in-flight budget, a read that
// would overtake a write down a chain, a tick behind lost writes, the fence after a map
// change); a reply settling its request; which requests are overdue; a new map raising
// the fence and the last stale write lifting it. The client actor moves messages in and
// carries out what it is told: it keeps the CAF handles, the payloads' closures and the
// timers. No I/O and no actors: unit tested event by event (tests/test_client_core.cpp)
// with a request type of the test's own.
//
// Request is the caller's type; the core reads its fields bytes, read, write, tick and
// plan_epoch, its sent_at (when its latest sending left), and its timed() (whether an
// answer is awaited under a timeout: false once timed out, or before it left).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace ps {

// Why the next waiting request to a shard does not leave now.
enum class held_by : std::uint8_t {
  nothing,        // it may leave
  empty,          // none is waiting
  down,           // the shard is down (its requests wait for a new map)
  tick_behind,    // with retries, a tick waits until the writes before it are acknowledged
  read_behind,    // down a chain, a read waits for this client's writes before it
  fence,          // a read or tick of the new map waits for writes planned by an older one
  budget,         // the shard's in-flight budget is spent
};

struct flow_limits {
  std::uint64_t inflight = 0;          // bytes in flight per shard (one request always may)
  std::uint64_t crowded_inflight = 0;  // instead, over TCP on a crowded host, when smaller
  bool retries = false;                // lost requests are sent again (--ps.retry-ms)
};

template <class Request>
class client_core {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  // One shard's requests: in flight by tag (send order), then waiting, in order.
  struct flow {
    std::map<std::uint64_t, Request> sent;
    std::deque<Request> queued;
    std::uint64_t inflight_bytes = 0;
    bool idle() const { return sent.empty() && queued.empty(); }
    bool writes_in_flight() const {
      return std::any_of(sent.begin(), sent.end(), [](const auto& kv) { return kv.second.write; });
    }
  };

  explicit client_core(flow_limits limits = {}, std::uint64_t map_epoch = 0) : limits_(limits), map_epoch_(map_epoch) {}

  std::size_t add_flow() {
    flows_.emplace_back();
    return flows_.size() - 1;
  }
  flow& at(std::size_t idx) { return flows_[idx]; }
  const flow& at(std::size_t idx) const { return flows_[idx]; }
  std::uint64_t map_epoch() const { return map_epoch_; }
  bool fenced() const { return fence_; }

  // ---- a request is issued: it waits its turn.
  void submit(std::size_t idx, Request r) { flows_[idx].queued.push_back(std::move(r)); }

  // Why shard idx's next waiting request may not leave now. `up`: the shard is up;
  // `chained()`: its reads go to another copy than its writes; `crowded()`: its payloads go
  // over TCP on a crowded host (the smaller budget). Each is asked only where its answer
  // matters (a read; a request the smaller budget would hold): the client's hot path.
  template <class Chained, class Crowded>
  held_by why_held(std::size_t idx, bool up, Chained&& chained, Crowded&& crowded) const {
    const auto& f = flows_[idx];
    if (f.queued.empty()) return held_by::empty;
    if (!up) return held_by::down;
    const auto& next = f.queued.front();
    if (limits_.retries && next.tick && f.writes_in_flight()) return held_by::tick_behind;
    if (next.read && std::any_of(f.sent.begin(), f.sent.end(), [](const auto& kv) { return !kv.second.read; }) &&
        chained())
      return held_by::read_behind;
    if (held_by_fence(next)) return held_by::fence;
    const auto after = f.inflight_bytes + next.bytes;
    if (f.inflight_bytes > 0 && (after > limits_.inflight || (after > limits_.crowded_inflight && crowded())))
      return held_by::budget;
    return held_by::nothing;
  }

  // The next waiting request, taken out to be sent (why_held said nothing holds it).
  Request take_next(std::size_t idx) {
    auto r = std::move(flows_[idx].queued.front());
    flows_[idx].queued.pop_front();
    return r;
  }

  // A request leaves: it is in flight under a new tag.
  std::uint64_t sent(std::size_t idx, Request r) {
    const auto tag = ++next_tag_;
    flows_[idx].inflight_bytes += r.bytes;
    flows_[idx].sent.emplace(tag, std::move(r));
    return tag;
  }

  // ---- a reply, a failure or a resend takes request `tag` out of flight; none when it
  // is not in flight (a stale reply: sent again since, or failed already).
  std::optional<Request> settle(std::size_t idx, std::uint64_t tag) {
    auto& f = flows_[idx];
    auto it = f.sent.find(tag);
    if (it == f.sent.end()) return std::nullopt;
    auto r = std::move(it->second);
    f.inflight_bytes -= r.bytes;
    f.sent.erase(it);
    return r;
  }

  // Every request of shard idx, in flight (in send order) then waiting, taken out.
  std::deque<Request> take_all(std::size_t idx) {
    auto& f = flows_[idx];
    std::deque<Request> all;
    for (auto& [tag, r] : f.sent) all.push_back(std::move(r));
    for (auto& r : f.queued) all.push_back(std::move(r));
    f.sent.clear();
    f.queued.clear();
    f.inflight_bytes = 0;
    return all;
  }

  // ---- the request timeout: the requests awaiting an answer for `timeout` or longer,
  // as (shard, tag) in send order per shard, and when the next one will be (none: none).
  std::vector<std::pair<std::size_t, std::uint64_t>> overdue(time_point now, std::chrono::milliseconds timeout,
                                                             std::optional<time_point>& next_due) const {
    std::vector<std::pair<std::size_t, std::uint64_t>> late;
    next_due.reset();
    for (std::size_t idx = 0; idx < flows_.size(); ++idx)
      for (const auto& [tag, r] : flows_[idx].sent) {
        if (!r.timed()) continue;
        if (now - r.sent_at >= timeout) late.emplace_back(idx, tag);
        else next_due = std::min(next_due.value_or(r.sent_at + timeout), r.sent_at + timeout);
      }
    return late;
  }

  // ---- a new map: reads and ticks planned by it wait until no write planned by an
  // older one is left unacknowledged (a shard passes their moved part on to the new
  // owner first, so a new owner never counts a clock or answers a read before them).
  void map_changed(std::uint64_t epoch) {
    map_epoch_ = epoch;
    fence_ = true;
  }
  // After a write settled (or requests moved): true when the fence fell now, so every
  // shard's waiting requests may leave.
  bool lift_fence() {
    if (!fence_ || stale_writes_outstanding()) return false;
    fence_ = false;
    return true;
  }

 private:
  bool held_by_fence(const Request& r) const {
    return fence_ && (r.read || r.tick) && r.plan_epoch >= map_epoch_ && stale_writes_outstanding();
  }
  bool stale_writes_outstanding() const {
    auto stale = [&](const Request& r) { return r.write && r.plan_epoch < map_epoch_; };
    for (const auto& f : flows_) {
      for (const auto& [tag, r] : f.sent)
        if (stale(r)) return true;
      if (std::any_of(f.queued.begin(), f.queued.end(), stale)) return true;
    }
    return false;
  }

  flow_limits limits_;
  std::vector<flow> flows_;
  std::uint64_t map_epoch_ = 0;
  std::uint64_t next_tag_ = 0;
  bool fence_ = false;
};

}  // namespace ps
