#include "libps/net/bulk.hpp"

#include <algorithm>
#include <cstring>

#include "libps/keys/keys.hpp"

namespace ps {

namespace {

constexpr std::uint32_t bulk_magic = 0x44535041;  // "APSD"

// Catches a header that is not one (a stray client, a desynchronised stream) before its
// size is believed.
std::uint64_t check_word(std::uint32_t kind, std::uint64_t id, std::uint64_t bytes) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ kind;
  for (auto v : {id, bytes}) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
  }
  return h;
}

template <class T>
void put_le(std::byte* at, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) at[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}

template <class T>
T get_le(const std::byte* at) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<T>(std::to_integer<std::uint8_t>(at[i])) << (8 * i);
  return v;
}

}  // namespace

std::array<std::byte, bulk_header_bytes> encode_bulk_header(const bulk_header& h) {
  std::array<std::byte, bulk_header_bytes> out{};
  auto kind = static_cast<std::uint32_t>(h.kind);
  put_le<std::uint32_t>(out.data(), bulk_magic);
  put_le<std::uint32_t>(out.data() + 4, kind);
  put_le<std::uint64_t>(out.data() + 8, h.id);
  put_le<std::uint64_t>(out.data() + 16, h.bytes);
  put_le<std::uint64_t>(out.data() + 24, check_word(kind, h.id, h.bytes));
  return out;
}

bulk_header decode_bulk_header(std::span<const std::byte, bulk_header_bytes> in) {
  auto magic = get_le<std::uint32_t>(in.data());
  if (magic != bulk_magic) throw bad_request("not a data-connection frame (bad magic number)");
  auto kind = get_le<std::uint32_t>(in.data() + 4);
  bulk_header h;
  h.id = get_le<std::uint64_t>(in.data() + 8);
  h.bytes = get_le<std::uint64_t>(in.data() + 16);
  if (get_le<std::uint64_t>(in.data() + 24) != check_word(kind, h.id, h.bytes))
    throw bad_request("corrupt data-connection frame header (check word mismatch)");
  if (kind < static_cast<std::uint32_t>(bulk_kind::hello) || kind > static_cast<std::uint32_t>(bulk_kind::message))
    throw bad_request("unknown data-connection frame kind " + std::to_string(kind));
  h.kind = static_cast<bulk_kind>(kind);
  if (h.kind == bulk_kind::ring) {
    if (h.id == 0 || h.bytes == 0 || h.bytes > UINT32_MAX)
      throw bad_request("ring frame with nonce " + std::to_string(h.id) + " and process id " + std::to_string(h.bytes));
    return h;
  }
  if (h.kind == bulk_kind::ring_ok) {
    if (h.bytes > 1) throw bad_request("ring_ok frame with answer " + std::to_string(h.bytes) + " (1: mapped, 0: not)");
    return h;
  }
  if (h.kind == bulk_kind::message && h.id > static_cast<std::uint64_t>(message_body::typed))
    throw bad_request("message frame whose body is of unknown form " + std::to_string(h.id));
  if (h.kind == bulk_kind::hello && h.bytes != 0)
    throw bad_request("hello frame announces a payload of " + std::to_string(h.bytes) + " bytes");
  if (h.bytes % sizeof(float) != 0)
    throw bad_request("payload of " + std::to_string(h.bytes) + " bytes is not a whole number of floats");
  if (h.bytes > bulk_max_payload)
    throw bad_request("payload of " + std::to_string(h.bytes) + " bytes exceeds the limit of " +
                      std::to_string(bulk_max_payload));
  return h;
}

std::shared_ptr<buffer_pool> buffer_pool::make(std::uint64_t max_bytes) {
  return std::shared_ptr<buffer_pool>(new buffer_pool(max_bytes));
}

std::shared_ptr<std::vector<float>> buffer_pool::copy_of(const float* from, std::size_t n) {
  auto to = get(n);
  std::copy_n(from, n, to->data());
  return to;
}

std::shared_ptr<std::vector<float>> buffer_pool::get(std::size_t n) {
  std::unique_ptr<std::vector<float>> v;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    // The same size first (nothing to zero), else one large enough, else a new one; of
    // those, the one given back last: its lines are likeliest still in cache.
    auto pick = free_.rend();
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
      if ((*it)->size() == n) {
        pick = it;
        break;
      }
      if ((*it)->capacity() >= n && pick == free_.rend()) pick = it;
    }
    if (pick != free_.rend()) {
      v = std::move(*pick);
      free_.erase(std::next(pick).base());
      free_bytes_ -= v->capacity() * sizeof(float);
    }
  }
  if (!v) v = std::make_unique<std::vector<float>>();
  v->resize(n);
  std::weak_ptr<buffer_pool> pool = weak_from_this();
  return std::shared_ptr<std::vector<float>>(v.release(), [pool](std::vector<float>* p) {
    if (auto alive = pool.lock())
      alive->give_back(p);
    else
      delete p;
  });
}

void buffer_pool::give_back(std::vector<float>* v) {
  std::unique_ptr<std::vector<float>> owned(v);
  auto bytes = v->capacity() * sizeof(float);
  if (bytes == 0) return;  // its memory was moved out
  std::lock_guard<std::mutex> guard(mtx_);
  if (free_bytes_ + bytes > max_bytes_) return;
  free_bytes_ += bytes;
  free_.push_back(std::move(owned));
}

std::uint64_t buffer_pool::free_bytes() const {
  std::lock_guard<std::mutex> guard(mtx_);
  return free_bytes_;
}

payload_store::payload_store(std::chrono::milliseconds orphan_after) : orphan_after_(orphan_after) {}

void payload_store::drop_orphans(std::chrono::steady_clock::time_point now) {
  for (auto it = payloads_.begin(); it != payloads_.end();)
    it = now - it->second.since >= orphan_after_ ? payloads_.erase(it) : std::next(it);
}

void payload_store::put(std::uint64_t origin, std::uint64_t ticket, landed_values values, std::uint64_t count) {
  auto now = std::chrono::steady_clock::now();
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    drop_orphans(now);
    payloads_[{origin, ticket}] = entry{std::move(values), count, now};
    auto [from, to] = ready_.equal_range({origin, ticket});
    for (auto it = from; it != to; ++it) ready.push_back(std::move(it->second));
    ready_.erase(from, to);
  }
  cv_.notify_all();
  for (auto& f : ready) f();  // outside the lock: a waiter may take at once
}

void payload_store::close_origin(std::uint64_t origin, std::string why) {
  std::vector<std::function<void()>> ready;
  {
    std::lock_guard<std::mutex> guard(mtx_);
    closed_[origin] = std::move(why);
    auto from = ready_.lower_bound({origin, 0}), to = ready_.upper_bound({origin, UINT64_MAX});
    for (auto it = from; it != to; ++it) ready.push_back(std::move(it->second));
    ready_.erase(from, to);
  }
  cv_.notify_all();
  for (auto& f : ready) f();
}

void payload_store::open_origin(std::uint64_t origin) {
  std::lock_guard<std::mutex> guard(mtx_);
  closed_.erase(origin);
}

std::optional<landed_values> payload_store::try_take(std::uint64_t origin, std::uint64_t ticket, std::uint64_t count,
                                                     const std::string& from) {
  std::lock_guard<std::mutex> guard(mtx_);
  auto what = [&] { return "payload " + std::to_string(ticket) + " (" + std::to_string(count) + " floats) from " + from; };
  auto it = payloads_.find({origin, ticket});
  if (it != payloads_.end()) {
    auto values = std::move(it->second.values);
    auto got = it->second.count;
    payloads_.erase(it);
    if (got != count) throw bad_request(what() + ": the data connection delivered " + std::to_string(got) + " floats");
    return values;
  }
  if (auto c = closed_.find(origin); c != closed_.end()) throw payload_lost(what() + " did not arrive: " + c->second);
  return std::nullopt;
}

landed_values payload_store::take(std::uint64_t origin, std::uint64_t ticket, std::uint64_t count,
                                  std::chrono::milliseconds timeout, const std::string& from) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (auto values = try_take(origin, ticket, count, from)) return *values;
    std::unique_lock<std::mutex> lock(mtx_);
    if (payloads_.count({origin, ticket}) || closed_.count(origin)) continue;
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !payloads_.count({origin, ticket}) &&
        !closed_.count(origin))
      throw payload_lost("payload " + std::to_string(ticket) + " (" + std::to_string(count) + " floats) from " + from +
                         " did not arrive within " + std::to_string(timeout.count()) + " ms");
  }
}

void payload_store::on_ready(std::uint64_t origin, std::uint64_t ticket, std::function<void()> ready) {
  {
    std::lock_guard<std::mutex> guard(mtx_);
    if (!payloads_.count({origin, ticket}) && !closed_.count(origin)) {
      ready_.emplace(std::make_pair(origin, ticket), std::move(ready));
      return;
    }
  }
  ready();
}

std::size_t payload_store::own_lent(std::uint64_t origin, const float_copier& copy) {
  std::lock_guard<std::mutex> guard(mtx_);
  std::size_t copied = 0;
  for (auto it = payloads_.lower_bound({origin, 0}); it != payloads_.end() && it->first.first == origin; ++it) {
    auto& v = it->second.values;
    if (!v.lent) continue;
    v.owned = copy(v.lent.get(), it->second.count);
    v.lent.reset();
    ++copied;
  }
  return copied;
}

std::size_t payload_store::waiting() const {
  std::lock_guard<std::mutex> guard(mtx_);
  return payloads_.size();
}

}  // namespace ps
