#include "actors/kv_client.hpp"
#include "actors/client/client_state.hpp"
#include "actors/inline_runner.hpp"
#include "libps/observe/log.hpp"

#include "libps/core/consistency.hpp"
#include "libps/sim/faults.hpp"
#include "libps/sim/fault_exit.hpp"

#include <array>
#include <atomic>
#include <unistd.h>

#include <cstdio>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>

namespace ps {

// ---- kv_op_state / kv_future -------------------------------------------------------

bool kv_op_state::done_flag() { return done.is_set(); }

void kv_op_state::finish(std::string err) {
  std::function<void()> next;
  {
    std::lock_guard<std::mutex> guard(mtx);
    if (done.is_set()) return;
    if (latency && err.empty())
      latency->record(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started).count());
    error = std::move(err);
    next = std::move(continuation);
    done.set([this] { return shared_from_this(); });  // under mtx: then() registers a continuation or runs it, never neither
  }
  if (next) next();
}

bool kv_future::ready() const { return st_->done.is_set(); }

namespace {

// The write batch of a thread that runs the client actor for its own requests
// (dispatch_here): what it sends may linger until the thread waits for an answer.
write_batch& callers_batch() {
  static thread_local write_batch batch(true);
  return batch;
}

// This thread is about to block: the requests it made and left lingering go first.
void send_before_blocking() { callers_batch().flush_lingering(); }

}  // namespace

void kv_future::wait() const {
  if (st_->done.is_set()) return;
  send_before_blocking();
  st_->done.wait();
}

bool kv_future::wait_for(std::chrono::milliseconds d) const {
  if (st_->done.is_set()) return true;
  send_before_blocking();
  return st_->done.wait_for(d);
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

std::vector<float> kv_future::take_values() {
  wait();
  return std::move(st_->values);
}

void kv_future::then(std::function<void(kv_future)> f) {
  auto self = *this;
  {
    std::lock_guard<std::mutex> guard(st_->mtx);
    if (!st_->done.is_set()) {
      st_->continuation = [f = std::move(f), self] { f(self); };
      return;
    }
  }
  f(self);
}

using namespace client_internal;

// ---- kv_client ------------------------------------------------------------------

kv_client::kv_client(caf::actor_system& sys, const cluster_view& view,
                     std::vector<shard_link> shards, kv_client_options opts)
    : opts_(opts), sys_(sys), shards_(shards) {
  stats_->map = std::make_shared<const partitioner>(map_of(view));
  std::sort(opts_.tensors.begin(), opts_.tensors.end(),
            [](const tensor_spec& a, const tensor_spec& b) { return a.keys.begin < b.keys.begin; });
  for (const auto& t : view.tables) tables_.push_back(t.to_spec());
  for (std::uint32_t w = 0; w < view.num_workers; ++w) stats_->live_workers.push_back(w);
  if (shards.size() != view.shards.size())
    throw bad_request("kv_client: " + std::to_string(shards.size()) + " shard links for " +
                      std::to_string(view.shards.size()) + " shards in the map");
  if (opts_.timeout.count() <= 0)
    throw bad_request("kv_client: the request timeout must be positive");
  opts_.compression.validate();
  if (opts_.pull_compression.kind == codec_kind::topk)
    throw bad_request("kv_client: pulls take none, fp16 or int8 compression, not top-k (it would drop most parameters)");
  // Message faults act on CAF messages: under them requests stay in CAF, and so do the
  // blocks of a transport that would carry the requests too.
  if (opts_.faults.touches_messages() && opts_.plane && opts_.plane->messages_enabled()) opts_.plane.reset();
  actor_ = caf::actor_cast<client_actor>(
    sys.spawn(kv_client_actor, std::move(shards), view.shards, opts_, view.epoch, stats_));
}

std::vector<shard_link> kv_client::current_shards() const {
  auto links = shards_;
  std::lock_guard<std::mutex> lock(stats_->mtx);
  for (auto& l : links)
    if (auto it = stats_->new_heads.find(l.id); it != stats_->new_heads.end()) l.handle = it->second;
  links.insert(links.end(), stats_->joined.begin(), stats_->joined.end());
  return links;
}

// A compressed push keeps its chunks the same every time: top-k residuals follow them. A
// request that fits a TCP push chunk is one chunk either way: the plane is not asked.
std::uint64_t kv_client::chunk_bytes_now(op_kind kind, std::uint64_t values) const {
  auto bytes = opts_.chunk_bytes_of(kind);
  if (kind == op_kind::pull || opts_.compression.kind != codec_kind::none || !opts_.plane ||
      values * sizeof(float) <= opts_.tcp_push_chunk_bytes)
    return bytes;
  if (opts_.plane->host_crowded() || opts_.plane->sends_by_ring_to_all()) return bytes;
  return std::min(bytes, opts_.tcp_push_chunk_bytes);
}

std::shared_ptr<const partitioner> kv_client::current_map() const {
  std::lock_guard<std::mutex> lock(stats_->mtx);
  return stats_->map;
}

namespace {
// CAF keeps an actor's response handlers in a protected member; a derived name reaches it.
struct response_handlers : caf::scheduled_actor {
  using caf::scheduled_actor::multiplexed_responses_;
};
}  // namespace

std::size_t kv_client::awaited_answers() const {
  auto* actor = dynamic_cast<caf::scheduled_actor*>(caf::actor_cast<caf::abstract_actor*>(actor_));
  return (actor->*(&response_handlers::multiplexed_responses_)).size();
}

std::vector<std::string> kv_client::shard_stats() const {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::vector<std::string> out;
  for (const auto& s : current_shards())
    self->request(s.handle, opts_.timeout, stats_atom::value)
      .receive([&](std::string& json) { out.push_back(std::move(json)); },
               [&](caf::error& e) { throw bad_request(s.name + ": no figures: " + describe(e)); });
  return out;
}

void kv_client::prefetch_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids) {
  table_dim(table);  // an unknown table is refused
  std::map<std::uint32_t, std::vector<std::uint64_t>> by_shard;
  auto map = current_map();
  for (auto id : merge_rows(ids, nullptr, 1).ids) by_shard[map->row_owner(table, id)].push_back(id);
  request_header hdr{map->epoch(), opts_.worker, clock_, 0};
  const auto links = current_shards();
  for (auto& [shard, rows] : by_shard)
    for (const auto& s : links)
      if (s.id == shard) caf::anon_send(s.handle, prefetch_atom::value, hdr, row_ids{table, std::move(rows)});
}

std::uint64_t kv_client::fill_rows(std::uint32_t table, std::uint64_t count) const {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::uint64_t made = 0;
  for (const auto& s : current_shards())
    self->request(s.handle, caf::infinite, fill_atom::value, table, count)
      .receive([&](std::uint64_t rows) { made += rows; },
               [&](caf::error& e) { throw bad_request(s.name + ": filling table " + std::to_string(table) + ": " + describe(e)); });
  return made;
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

void kv_client::barrier(std::chrono::milliseconds timeout) {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::string err;
  // The client answers: with the coordinator's reply, its timeout, or its death.
  self->request(caf::actor_cast<client_impl>(actor_), caf::infinite, barrier_atom::value, opts_.worker,
                static_cast<std::uint64_t>(timeout.count()))
    .receive([](std::uint64_t) {}, [&](caf::error& e) { err = describe(e); });
  if (!err.empty()) throw kv_error("barrier failed: " + err);
}

std::uint64_t kv_client::await_data_connections(std::chrono::milliseconds timeout) {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::uint64_t connected = 0;
  std::string err;
  self->request(caf::actor_cast<client_impl>(actor_), timeout, data_atom::value)
    .receive([&](std::uint64_t n) { connected = n; }, [&](caf::error& e) { err = describe(e); });
  if (!err.empty()) throw kv_error("waiting for the data connections to the shards: " + err);
  return connected;
}

void kv_client::report(std::string text) {
  caf::anon_send(caf::actor_cast<client_impl>(actor_), report_atom::value, std::move(text));
}

void kv_client::finish(worker_result result) {
  send_before_blocking();
  caf::scoped_actor self{sys_};
  std::string err;
  // The client answers: with the coordinator's acknowledgment, or why it cannot come.
  self->request(caf::actor_cast<client_impl>(actor_), caf::infinite, done_atom::value, std::move(result))
    .receive([](caf::ok_atom) {}, [&](caf::error& e) { err = describe(e); });
  if (!err.empty()) throw kv_error("the worker's result did not reach the coordinator: " + err);
}

std::vector<double> kv_client::recovery_times_ms() const {
  std::lock_guard<std::mutex> guard(stats_->mtx);
  return stats_->recoveries_ms;
}

std::vector<std::uint32_t> kv_client::live_workers() const {
  std::lock_guard<std::mutex> guard(stats_->mtx);
  return stats_->live_workers;
}

bool kv_client::await_live_workers(std::size_t n, std::chrono::milliseconds timeout) const {
  send_before_blocking();
  std::unique_lock<std::mutex> lock(stats_->mtx);
  return stats_->changed.wait_for(lock, timeout, [&] { return stats_->live_workers.size() >= n; });
}

bool kv_client::await_map(const std::function<bool(const partitioner&)>& holds, std::chrono::milliseconds timeout) const {
  send_before_blocking();
  std::unique_lock<std::mutex> lock(stats_->mtx);
  return stats_->changed.wait_for(lock, timeout, [&] { return holds(*stats_->map); });
}

kv_future kv_client::leave_clock_vector() {
  auto op = std::make_shared<kv_op_state>();
  op->what = "leaving the clock vector (worker " + std::to_string(opts_.worker) + ")";
  auto req = std::make_shared<detail::op_request>();
  req->kind = op_kind::clock;
  req->op = op;
  req->hdr = request_header{current_map()->epoch(), opts_.worker, left_clock, 0};  // a tick to infinity
  caf::anon_send(caf::actor_cast<client_impl>(actor_), clock_atom::value, std::move(req));
  return kv_future(op);
}

void kv_client::die_if_killed_at(std::uint64_t c) {
  if (opts_.kill_at && c >= *opts_.kill_at)
    die_abruptly("worker " + std::to_string(opts_.worker) + " reached clock " + std::to_string(c) +
                 " (--faults: kill worker=" + std::to_string(opts_.worker) + " at=" + std::to_string(*opts_.kill_at) + ")");
}

void kv_client::leave_if_asked(std::uint64_t c) const {
  if (opts_.leave_requested && opts_.leave_requested())
    throw worker_leaving(c, "worker " + std::to_string(opts_.worker) + " leaves the job before its clock " +
                                std::to_string(c) + " (a stop signal)");
}

kv_future kv_client::push_and_advance(const key_set& keys, std::shared_ptr<std::vector<float>> values,
                                      std::size_t offset, std::uint64_t then_tick) {
  if (!values) throw bad_request("push: no values (null buffer)");
  leave_if_asked(then_tick);
  if (opts_.kill_at && then_tick >= *opts_.kill_at) {  // the push counts, then the worker dies ticking
    push(keys, std::move(values), offset).get();
    return advance_clock(then_tick);
  }
  auto f = send(op_kind::push, keys, std::move(values), offset, then_tick);
  clock_ = then_tick;
  return f;
}

kv_future kv_client::advance_clock(std::uint64_t c) {
  leave_if_asked(c);
  die_if_killed_at(c);
  clock_ = c;
  auto op = std::make_shared<kv_op_state>();
  op->what = "clock tick to " + std::to_string(c) + " of worker " + std::to_string(opts_.worker);
  auto req = std::make_shared<detail::op_request>();
  req->kind = op_kind::clock;
  req->op = op;
  req->hdr = request_header{current_map()->epoch(), opts_.worker, c, 0};
  caf::anon_send(caf::actor_cast<client_impl>(actor_), clock_atom::value, std::move(req));
  return kv_future(op);
}

kv_future kv_client::init(const key_set& keys, std::vector<float> values) {
  return send(op_kind::init, keys, std::make_shared<std::vector<float>>(std::move(values)));
}

std::pair<latency_summary, latency_summary> kv_client::take_latencies() {
  return {push_latency_->take(), pull_latency_->take()};
}

kv_future kv_client::pull(const key_set& keys) {
  return send(op_kind::pull, keys, nullptr);
}

kv_future kv_client::pull(const key_set& keys, std::vector<float> into) {
  return send(op_kind::pull, keys, nullptr, {}, 0, std::move(into));
}

std::uint32_t kv_client::table_dim(std::uint32_t table) const {
  if (table >= tables_.size())
    throw bad_request("no sparse table " + std::to_string(table) + " (the job has " + std::to_string(tables_.size()) +
                      ")");
  return tables_[table].dim;
}

kv_future kv_client::pull_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids) {
  return send_rows(op_kind::pull, table, ids, nullptr);
}

kv_future kv_client::push_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids,
                               const std::vector<float>& grads) {
  auto dim = table_dim(table);
  if (grads.size() != ids.size() * dim)
    throw bad_request("push of " + std::to_string(ids.size()) + " rows of table '" + tables_[table].name + "' (dim " +
                      std::to_string(dim) + "): " + std::to_string(grads.size()) + " gradient values, not " +
                      std::to_string(ids.size() * dim));
  return send_rows(op_kind::push, table, ids, grads.data());
}

// The request goes to the client actor, and the caller's thread runs the actor itself
// when this message woke it (inline_runner), as a data connection's reader does for
// answers: waking the scheduler's thread for it cost a futex wake, a sleep and two context
// switches per request, more than the dispatch. What the actor writes meanwhile goes into
// the thread's lingering batch, so the requests a caller makes between two waits leave
// in one write (write_batch).
template <class Request>
void dispatch_here(caf::actor_system& sys, const client_actor& actor, bool on_caller, std::shared_ptr<Request> req) {
  inline_runner here(sys);
  caf::actor_cast<caf::strong_actor_ptr>(actor)->enqueue(
      caf::make_mailbox_element(nullptr, caf::make_message_id(), {}, dispatch_atom::value, std::move(req)),
      on_caller ? &here : nullptr);  // nullptr: the scheduler takes the actor
  if (here.waiting() == 0) return;  // not woken here: it runs (or was running) elsewhere
  auto& batch = callers_batch();
  {
    write_batch::scope open(batch);
    here.run();
  }
  batch.release();
}

// Duplicates merged, then the distinct rows grouped by the shard that owns them.
kv_future kv_client::send_rows(op_kind kind, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                               const float* grads) {
  auto dim = table_dim(table);
  auto op = std::make_shared<kv_op_state>();
  op->latency = kind == op_kind::pull ? pull_latency_ : push_latency_;
  op->what = std::string(names_of(kind)) + " of " + std::to_string(ids.size()) + " rows of table '" +
             tables_[table].name + "'";
  auto merged = merge_rows(ids, grads, dim);
  auto req = std::make_shared<rows_request>();
  auto map = current_map();
  req->kind = kind;
  req->hdr = request_header{map->epoch(), opts_.worker, clock_, 0};
  req->table = table;
  req->dim = dim;
  req->op = op;
  std::map<std::uint32_t, std::size_t> group_of;  // shard -> index in groups
  std::vector<std::pair<std::size_t, std::uint32_t>> place(merged.ids.size());  // distinct row -> (group, row)
  std::vector<std::vector<float>> group_grads;
  for (std::size_t j = 0; j < merged.ids.size(); ++j) {
    auto shard = map->row_owner(table, merged.ids[j]);
    auto [it, fresh] = group_of.emplace(shard, req->groups.size());
    if (fresh) {
      req->groups.push_back({shard, row_ids{table, {}}, {}, {}});
      group_grads.emplace_back();
    }
    auto& grp = req->groups[it->second];
    place[j] = {it->second, static_cast<std::uint32_t>(grp.rows.ids.size())};
    grp.rows.ids.push_back(merged.ids[j]);
    if (grads) group_grads[it->second].insert(group_grads[it->second].end(), merged.grads.begin() + j * dim,
                                              merged.grads.begin() + (j + 1) * dim);
  }
  for (std::size_t g = 0; g < req->groups.size(); ++g) {
    if (grads) req->groups[g].grads = float_block::own(std::move(group_grads[g]));
    req->groups[g].positions.resize(req->groups[g].rows.ids.size());
  }
  if (kind == op_kind::pull) {
    op->values.resize(ids.size() * dim);
    for (std::size_t p = 0; p < ids.size(); ++p) {
      auto [g, k] = place[merged.slot[p]];
      req->groups[g].positions[k].push_back(static_cast<std::uint32_t>(p));
    }
  }
  kv_future f(op);
  dispatch_here(sys_, actor_, opts_.dispatch_on_caller, std::move(req));
  return f;
}

std::string kv_client::checked_request(op_kind kind, const key_set& keys, const std::vector<float>* whole,
                                       std::optional<std::size_t> offset) const {
  std::string what = names_of(kind);
  if (kind != op_kind::pull && !offset && whole->size() != keys.num_keys())
    throw bad_request(what + ": " + std::to_string(whole->size()) + " values for " + std::to_string(keys.num_keys()) +
                      " keys");
  if (kind != op_kind::pull && offset && (*offset > whole->size() || whole->size() - *offset < keys.num_keys()))
    throw bad_request(what + ": " + std::to_string(keys.num_keys()) + " keys need values [" +
                      std::to_string(*offset) + ", " + std::to_string(*offset + keys.num_keys()) +
                      ") of a buffer of " + std::to_string(whole->size()));
  if (!keys.ranges().empty())
    what += " of " + describe_keys(keys.ranges().front(), keys.ranges().back(), keys.ranges().size());
  if (auto outside = keys_outside(keys.ranges(), opts_.tensors); !outside.empty())
    throw bad_request(what + ": " + outside);
  return what;
}

kv_future kv_client::send(op_kind kind, const key_set& keys, std::shared_ptr<std::vector<float>> whole,
                          std::optional<std::size_t> offset, std::uint64_t then_tick,
                          std::optional<std::vector<float>> pull_into) {
  auto op = std::make_shared<kv_op_state>();
  op->what = checked_request(kind, keys, whole.get(), offset);
  op->latency = kind == op_kind::pull ? pull_latency_ : kind == op_kind::push ? push_latency_ : nullptr;
  auto req = std::make_shared<detail::op_request>();
  req->kind = kind;
  req->op = op;
  auto map = current_map();
  req->hdr = request_header{map->epoch(), opts_.worker, clock_, 0};
  req->chunks = plan_chunks(map->split(keys), chunk_bytes_now(kind, keys.num_keys()));
  if (kind == op_kind::pull) {
    req->hdr.pull_codec = static_cast<std::uint8_t>(opts_.pull_compression.kind);
    if (req->chunks.size() > 1 || pull_into) {
      req->in_place = true;
      if (pull_into) op->values = std::move(*pull_into);
      op->values.resize(keys.num_keys());
      if (req->hdr.pull_codec == 0) req->landing.assign(req->chunks.size(), 0);  // encoded answers come inline
    }
  } else {
    auto base = offset.value_or(0);
    // Over a data plane, chunks of scattered pieces may be written from `whole` directly.
    bool defer_gather = opts_.plane && !(kind == op_kind::push && opts_.compression.kind != codec_kind::none);
    req->source = whole;
    req->base = base;
    for (const auto& c : req->chunks) {
      if (c.contiguous()) {  // a view: no copy
        req->blocks.push_back({whole, base + c.first_offset(), c.num_values});
      } else if (defer_gather) {
        req->blocks.push_back({nullptr, 0, c.num_values});
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
  req->then_tick = then_tick;
  dispatch_here(sys_, actor_, opts_.dispatch_on_caller, std::move(req));
  return kv_future(op);
}

}  // namespace ps
