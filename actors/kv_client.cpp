#include "actors/kv_client.hpp"

#include <deque>
#include <map>
#include <unordered_map>

namespace ps {

// ---- kv_op_state / kv_future -------------------------------------------------------

bool kv_op_state::done_flag() {
  std::lock_guard<std::mutex> guard(mtx);
  return done;
}

void kv_op_state::finish(std::string err) {
  std::function<void()> next;
  {
    std::lock_guard<std::mutex> guard(mtx);
    if (done) return;
    done = true;
    error = std::move(err);
    next = std::move(continuation);
  }
  cv.notify_all();
  if (next) next();
}

bool kv_future::ready() const {
  std::lock_guard<std::mutex> guard(st_->mtx);
  return st_->done;
}

void kv_future::wait() const {
  std::unique_lock<std::mutex> guard(st_->mtx);
  st_->cv.wait(guard, [&] { return st_->done; });
}

bool kv_future::wait_for(std::chrono::milliseconds d) const {
  std::unique_lock<std::mutex> guard(st_->mtx);
  return st_->cv.wait_for(guard, d, [&] { return st_->done; });
}

std::string kv_future::error() const {
  wait();
  return st_->error;
}

std::vector<float> kv_future::get() {
  wait();
  if (!st_->error.empty()) throw kv_error(st_->error);
  return std::move(st_->values);
}

void kv_future::then(std::function<void(kv_future)> f) {
  auto self = *this;
  {
    std::lock_guard<std::mutex> guard(st_->mtx);
    if (!st_->done) {
      st_->continuation = [f = std::move(f), self] { f(self); };
      return;
    }
  }
  f(self);
}

// ---- the client actor -----------------------------------------------------------

namespace detail {

// One op, planned by the caller's thread, executed by the client actor (local only).
struct op_request {
  op_kind kind;
  request_header hdr;
  std::vector<chunk> chunks;
  std::vector<float_block> blocks;  // per chunk (push/init)
  std::vector<encoded_block> encoded;  // per chunk, instead of blocks: a compressed push
  std::shared_ptr<kv_op_state> op;
};

}  // namespace detail
}  // namespace ps

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<ps::detail::op_request>)

namespace ps {
namespace {

using detail::op_request;

const char* names_of(op_kind k) {
  static const char* names[] = {"push", "init", "pull", "clock"};
  return names[static_cast<int>(k)];
}

std::string describe_keys(const key_range& first, const key_range& last, std::size_t n) {
  std::string s = "keys " + to_string(first);
  if (n > 1) s += " .. " + to_string(last) + " (" + std::to_string(n) + " ranges)";
  return s;
}

std::string describe_keys(const chunk& c) {
  return describe_keys(c.pieces.front().keys, c.pieces.back().keys, c.pieces.size());
}

struct client_state {
  std::vector<shard_link> shards;
  std::map<std::uint32_t, std::size_t> index;  // shard id -> position in shards
  std::vector<std::string> down;               // non-empty: why that shard is gone
  // Per shard: ops with chunks not yet answered, and how many.
  std::vector<std::unordered_map<kv_op_state*, std::pair<std::shared_ptr<kv_op_state>, std::size_t>>>
    outstanding;
  std::chrono::milliseconds timeout;
  // Flow control per shard: CAF's broker buffers every queued message in one growing
  // buffer and shifts it after each partial write, so hundreds of MB queued on one
  // connection cost quadratic copying (window 8 x 16 MiB ran 4x slower than window 1).
  // Chunks beyond inflight_limit bytes wait here instead.
  std::uint64_t inflight_limit = 0;
  std::vector<std::uint64_t> inflight_bytes;
  std::vector<std::deque<std::pair<std::uint64_t, std::function<void()>>>> queued;
  static inline const char* name = "kv_client";
};

using client_ptr = caf::stateful_actor<client_state>*;

// Sends now if the shard's in-flight budget allows (always when nothing is in flight).
void send_or_queue(client_ptr self, std::size_t idx, std::uint64_t bytes, std::function<void()> fire) {
  auto& st = self->state;
  // Behind anything already queued, whatever its size: requests to a shard leave in the
  // order they were made (read-my-writes and clock ticks depend on it).
  if (!st.queued[idx].empty() ||
      (st.inflight_bytes[idx] > 0 && st.inflight_bytes[idx] + bytes > st.inflight_limit)) {
    st.queued[idx].emplace_back(bytes, std::move(fire));
    return;
  }
  st.inflight_bytes[idx] += bytes;
  fire();
}

void release(client_ptr self, std::size_t idx, std::uint64_t bytes) {
  auto& st = self->state;
  st.inflight_bytes[idx] -= bytes;
  while (!st.queued[idx].empty()) {
    auto& [next_bytes, fire] = st.queued[idx].front();
    if (st.inflight_bytes[idx] > 0 && st.inflight_bytes[idx] + next_bytes > st.inflight_limit) return;
    st.inflight_bytes[idx] += next_bytes;
    auto f = std::move(fire);
    st.queued[idx].pop_front();
    f();
  }
}

void chunk_answered(client_ptr self, std::size_t idx, kv_op_state* op) {
  auto& out = self->state.outstanding[idx];
  auto it = out.find(op);
  if (it == out.end()) return;  // already failed by a down message
  auto keep = it->second.first;
  if (--it->second.second == 0) out.erase(it);
  if (--op->pending == 0) op->finish({});
}

// Counts one more request of op to shard idx; false (and op failed) if the shard is down.
bool track(client_ptr self, std::size_t idx, const std::shared_ptr<kv_op_state>& op) {
  auto& st = self->state;
  if (!st.down[idx].empty()) {
    op->finish(op->what + " failed: " + st.down[idx]);
    return false;
  }
  auto& entry = st.outstanding[idx][op.get()];
  entry.first = op;
  ++entry.second;
  return true;
}

std::string why_failed(client_ptr self, const shard_link& link, const caf::error& err) {
  return err == caf::sec::request_timeout
           ? "no reply from " + link.name + " within " + std::to_string(self->state.timeout.count()) + " ms"
           : describe(err);
}

caf::behavior kv_client_actor(client_ptr self, std::vector<shard_link> shards,
                              std::chrono::milliseconds timeout, std::uint64_t inflight_limit) {
  auto& st = self->state;
  st.shards = std::move(shards);
  st.timeout = timeout;
  st.inflight_limit = inflight_limit;
  st.inflight_bytes.assign(st.shards.size(), 0);
  st.queued.resize(st.shards.size());
  st.down.resize(st.shards.size());
  st.outstanding.resize(st.shards.size());
  for (std::size_t i = 0; i < st.shards.size(); ++i) {
    st.index[st.shards[i].id] = i;
    self->monitor(st.shards[i].handle);
  }
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    for (std::size_t i = 0; i < st.shards.size(); ++i) {
      if (st.shards[i].handle.address() != dm.source) continue;
      st.down[i] = st.shards[i].name + " is down (" + describe(dm.reason) + ")";
      auto lost = std::move(st.outstanding[i]);
      st.outstanding[i].clear();
      for (auto& [ptr, entry] : lost)
        ptr->finish(entry.first->what + " failed: " + st.down[i]);  // what names the keys
    }
  });
  return {
    // A clock tick goes to every shard, behind this worker's earlier requests to it.
    [=](clock_atom, std::shared_ptr<op_request>& req) {
      auto& st = self->state;
      auto op = req->op;
      op->pending = st.shards.size();
      for (std::size_t idx = 0; idx < st.shards.size(); ++idx) {
        const auto& link = st.shards[idx];
        if (!track(self, idx, op)) return;
        send_or_queue(self, idx, 0, [=] {
          self->request(link.handle, self->state.timeout, clock_atom::value, req->hdr)
            .then([=](std::uint64_t) {
                    release(self, idx, 0);
                    chunk_answered(self, idx, op.get());
                  },
                  [=](caf::error& err) {
                    op->finish(op->what + " failed: " + why_failed(self, link, err));
                    release(self, idx, 0);
                    chunk_answered(self, idx, op.get());
                  });
        });
      }
    },
    [=](dispatch_atom, std::shared_ptr<op_request>& req) {
      auto& st = self->state;
      auto op = req->op;
      op->pending = req->chunks.size();
      if (req->chunks.empty()) {
        op->finish({});
        return;
      }
      for (std::size_t c = 0; c < req->chunks.size(); ++c) {
        const auto& ch = req->chunks[c];
        auto idx = st.index.at(ch.shard);
        const auto& link = st.shards[idx];
        if (!track(self, idx, op)) return;
        auto hdr = req->hdr;
        hdr.seq += c;
        auto bytes = (req->encoded.empty() ? ch.num_values * sizeof(float) : req->encoded[c].bytes->size()) +
                     ch.pieces.size() * range_wire_bytes;
        auto done = [=](bool ok) {  // every chunk ends here exactly once
          release(self, idx, bytes);
          if (ok) chunk_answered(self, idx, op.get());
        };
        auto on_error = [=](caf::error& err) {
          op->finish(std::string(names_of(req->kind)) + " of " + describe_keys(ch) +
                     " failed: " + why_failed(self, link, err));
          chunk_answered(self, idx, op.get());
          done(false);
        };
        send_or_queue(self, idx, bytes, [=]() mutable {
          if (op->done_flag()) {  // failed meanwhile (shard down, another chunk): skip
            done(false);
            return;
          }
          range_list ranges{ch.ranges()};
          if (req->kind == op_kind::pull) {
            self->request(link.handle, self->state.timeout, pull_atom::value, hdr, std::move(ranges))
              .then(
                [=](float_block& values) {
                  if (values.size != ch.num_values) {
                    op->finish("pull of " + describe_keys(ch) + " failed: " + link.name + " sent " +
                               std::to_string(values.size) + " values for " +
                               std::to_string(ch.num_values) + " keys");
                  } else if (req->chunks.size() == 1) {  // the common case: no reassembly
                    if (values.whole())
                      op->values = std::move(*values.storage);
                    else
                      op->values.assign(values.data(), values.data() + values.size);
                  } else {
                    scatter(values.data(), ch, op->values.data());
                  }
                  done(true);
                },
                on_error);
          } else {
            auto handle = [=](std::uint64_t) { done(true); };
            if (!req->encoded.empty()) {
              self->request(link.handle, self->state.timeout, push_atom::value, hdr, std::move(ranges),
                            std::move(req->encoded[c]))
                .then(handle, on_error);
              return;
            }
            auto block = std::move(req->blocks[c]);
            if (req->kind == op_kind::push)
              self->request(link.handle, self->state.timeout, push_atom::value, hdr, std::move(ranges),
                            std::move(block))
                .then(handle, on_error);
            else
              self->request(link.handle, self->state.timeout, init_atom::value, hdr, std::move(ranges),
                            std::move(block))
                .then(handle, on_error);
          }
        });
      }
    },
  };
}

}  // namespace

// ---- kv_client ------------------------------------------------------------------

namespace {

partitioner map_of(const cluster_view& view) {
  std::vector<std::uint32_t> ids;
  for (const auto& s : view.shards) ids.push_back(s.id);
  return partitioner(view.epoch, ids, view.vnodes, view.bucket_bits);
}

}  // namespace

kv_client::kv_client(caf::actor_system& sys, const cluster_view& view,
                     std::vector<shard_link> shards, kv_client_options opts)
    : map_(map_of(view)), opts_(opts) {
  if (shards.size() != view.shards.size())
    throw bad_request("kv_client: " + std::to_string(shards.size()) + " shard links for " +
                      std::to_string(view.shards.size()) + " shards in the map");
  if (opts_.timeout.count() <= 0)
    throw bad_request("kv_client: the request timeout must be positive");
  opts_.compression.validate();
  actor_ = sys.spawn(kv_client_actor, std::move(shards), opts_.timeout, opts_.inflight_bytes);
}

kv_client::~kv_client() {
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

kv_future kv_client::push(const key_set& keys, std::vector<float> values) {
  return send(op_kind::push, keys, std::make_shared<std::vector<float>>(std::move(values)));
}

kv_future kv_client::push(const key_set& keys, std::shared_ptr<std::vector<float>> values) {
  if (!values) throw bad_request("push: no values (null buffer)");
  return send(op_kind::push, keys, std::move(values));
}

kv_future kv_client::push(const key_set& keys, std::shared_ptr<std::vector<float>> values,
                          std::size_t offset) {
  if (!values) throw bad_request("push: no values (null buffer)");
  return send(op_kind::push, keys, std::move(values), offset);
}

kv_future kv_client::advance_clock(std::uint64_t c) {
  clock_ = c;
  auto op = std::make_shared<kv_op_state>();
  op->what = "clock tick to " + std::to_string(c) + " of worker " + std::to_string(opts_.worker);
  auto req = std::make_shared<detail::op_request>();
  req->kind = op_kind::clock;
  req->op = op;
  req->hdr = request_header{map_.epoch(), opts_.worker, c, 0};
  caf::anon_send(actor_, clock_atom::value, std::move(req));
  return kv_future(op);
}

kv_future kv_client::init(const key_set& keys, std::vector<float> values) {
  return send(op_kind::init, keys, std::make_shared<std::vector<float>>(std::move(values)));
}

kv_future kv_client::pull(const key_set& keys) {
  return send(op_kind::pull, keys, nullptr);
}

kv_future kv_client::send(op_kind kind, const key_set& keys, std::shared_ptr<std::vector<float>> whole,
                          std::optional<std::size_t> offset) {
  auto op = std::make_shared<kv_op_state>();
  op->what = names_of(kind);
  if (kind != op_kind::pull && !offset && whole->size() != keys.num_keys())
    throw bad_request(op->what + ": " + std::to_string(whole->size()) + " values for " +
                      std::to_string(keys.num_keys()) + " keys");
  if (kind != op_kind::pull && offset && (*offset > whole->size() || whole->size() - *offset < keys.num_keys()))
    throw bad_request(op->what + ": " + std::to_string(keys.num_keys()) + " keys need values [" +
                      std::to_string(*offset) + ", " + std::to_string(*offset + keys.num_keys()) +
                      ") of a buffer of " + std::to_string(whole->size()));
  if (!keys.ranges().empty())
    op->what += " of " + describe_keys(keys.ranges().front(), keys.ranges().back(), keys.ranges().size());
  auto req = std::make_shared<detail::op_request>();
  req->kind = kind;
  req->op = op;
  req->hdr = request_header{map_.epoch(), opts_.worker, clock_, 0};
  req->chunks = plan_chunks(map_.split(keys), opts_.chunk_bytes);
  // Sequence numbers: one per chunk, unique per client.
  static std::atomic<std::uint64_t> next_seq{1};
  req->hdr.seq = next_seq.fetch_add(req->chunks.size());
  if (kind == op_kind::pull) {
    if (req->chunks.size() > 1) op->values.resize(keys.num_keys());
  } else {
    auto base = offset.value_or(0);
    for (const auto& c : req->chunks) {
      if (c.contiguous()) {  // a view: no copy
        req->blocks.push_back({whole, base + c.first_offset(), c.num_values});
      } else {
        std::vector<float> gathered(c.num_values);
        gather(whole->data() + base, c, gathered.data());
        req->blocks.push_back(float_block::own(std::move(gathered)));
      }
    }
  }
  if (kind == op_kind::push && opts_.compression.kind != codec_kind::none) {
    for (std::size_t c = 0; c < req->chunks.size(); ++c) {
      const auto& b = req->blocks[c];
      auto* residual = &residuals_[{req->chunks[c].pieces.front().keys.begin, c}];
      if (!residual->values().empty() && residual->values().size() != b.size) residual->clear();
      auto bytes = std::make_shared<std::vector<std::byte>>();
      encode(opts_.compression, b.data(), b.size, residual, *bytes);
      req->encoded.push_back({std::move(bytes)});
    }
    req->blocks.clear();
  }
  caf::anon_send(actor_, dispatch_atom::value, std::move(req));
  return kv_future(op);
}

}  // namespace ps
