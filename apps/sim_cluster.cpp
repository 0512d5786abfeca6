#include "apps/sim_cluster.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <set>

#include <caf/all.hpp>

#include "actors/coordinator.hpp"
#include "actors/kv_client.hpp"
#include "actors/server_shard.hpp"
#include "actors/transport/memory.hpp"
#include "libps/core/consistency.hpp"
#include "libps/observe/log.hpp"
#include "libps/rows/sparse_table.hpp"
#include "libps/core/trace.hpp"
#include "libps/persist/trace_file.hpp"

namespace ps {

namespace {

constexpr std::uint64_t num_keys = 64;  // 16 buckets of 4 keys over the shards
constexpr std::uint32_t row_dim = 4;    // the sparse table's rows, created at 0 on first touch
constexpr std::uint64_t num_rows = 24;
// sim --tiered: a shard's RAM budget for rows, a few of them (the rest are on its disk).
constexpr std::uint64_t tiered_shard_memory = 4 * (row_dim * sizeof(float) + sparse_table::row_overhead);
// ... and the rows in a page of its disk scans and seeds: few, so pushes fall between pages.
constexpr std::size_t tiered_page_rows = 2;
constexpr std::uint64_t step_budget = 400000;

// Row ids spread like feature hashes (each row lands on the shard its hash picks).
std::vector<std::uint64_t> row_ids() {
  std::vector<std::uint64_t> ids;
  for (std::uint64_t k = 1; k <= num_rows; ++k) ids.push_back(k * 0x9E3779B97F4A7C15ull);
  return ids;
}

// What a worker may have had applied: [lo, hi] pushes per element, by family.
struct bounds {
  std::uint64_t lo = 0, hi = 0;
};

std::uint64_t mix(std::uint64_t h, std::uint64_t x) {  // FNV-1a over 8 bytes
  for (int i = 0; i < 8; ++i) h = (h ^ ((x >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  return h;
}

caf::actor_system_config& testing_config(caf::actor_system_config& cfg) {
  register_types(cfg);
  cfg.set("scheduler.policy", caf::atom("testing"));
  return cfg;
}

class sim_run {
 public:
  sim_run(const sim_plan& plan, const std::string& trace_dir)
      : sys_(testing_config(cfg_)),
        sched_(dynamic_cast<caf::scheduler::test_coordinator&>(sys_.scheduler())),
        plan_(plan),
        rng_(plan.seed),
        trace_path_(trace_dir + "/actorps-sim-" + std::to_string(::getpid()) + ".jsonl"),
        state_dir_(trace_dir + "/actorps-sim-state-" + std::to_string(::getpid())),
        pushes_(plan.workers, 0),
        done_(plan.workers, false),
        reported_(plan.workers, false),
        dead_(plan.workers, false),
        key_pushes_(plan.workers),
        row_pushes_(plan.workers),
        acked_keys_(plan.workers, 0),
        acked_rows_(plan.workers, 0),
        reading_(plan.workers),
        leaving_(plan.workers) {
    while (reader_ == plan.leaver || reader_ == plan.kill_worker) ++reader_;
    std::remove(trace_path_.c_str());
    std::filesystem::remove_all(state_dir_);
    std::filesystem::create_directories(state_dir_);
    sys_.await_actors_before_shutdown(false);
  }

  ~sim_run() {
    clients_.clear();
    for (auto& a : alive_) caf::anon_send_exit(a, caf::exit_reason::kill);
    sched_.run();
    std::remove(trace_path_.c_str());
    std::filesystem::remove_all(state_dir_);
  }

  sim_outcome run() {
    start();
    for (std::uint64_t moves = 0; failure_.empty() && !all_done(); ++moves) {
      act(pick_worker());
      // Time passes only while every worker waits: computing is instantaneous here.
      for (auto k = rng_() % 8; k > 0 && failure_.empty(); --k) step(!any_can_act());
      if (steps_ > step_budget || moves > step_budget)
        fail("stuck: workers not done after " + std::to_string(steps_) + " messages" + first_failed_request());
    }
    if (failure_.empty()) finish();
    std::uint64_t plane_bytes = 0;
    for (const auto& m : members_) plane_bytes += m->counters().bytes_received;
    return {failure_, hash_, steps_, plane_bytes};
  }

 private:
  void fail(const std::string& why) {
    if (failure_.empty()) failure_ = why;
  }

  // What a stuck run says of the first request of a live worker that failed (a failed tick
  // or push can be why the others wait), or nothing.
  std::string first_failed_request() const {
    for (const auto& [w, op] : ops_)
      if (!(w < dead_.size() && dead_[w]) && op.ready() && !op.error().empty())
        return "; the first request that failed: " + op.error();
    return {};
  }

  static bool all_ready(const std::vector<kv_future>& fs) {
    return std::all_of(fs.begin(), fs.end(), [](const kv_future& f) { return f.ready(); });
  }
  bool all_done() const { return std::all_of(done_.begin(), done_.end(), [](bool d) { return d; }); }
  bool any_can_act() const {
    for (std::size_t w = 0; w < done_.size(); ++w)
      if (!done_[w] && (reading_[w].empty() || all_ready(reading_[w])) && (!leaving_[w] || leaving_[w]->ready()))
        return true;
    return false;
  }

  void start();
  void start_clients(const std::vector<std::shared_ptr<std::optional<registration>>>& regs);
  std::shared_ptr<std::optional<registration>> register_worker(caf::actor& helper);
  std::uint32_t pick_worker();
  void act(std::uint32_t w);
  bounds expected(std::uint32_t reader, bool rows) const;
  void check_read(std::uint32_t w, const std::vector<float>& values, bool rows);
  void kill_worker(std::uint32_t w);
  bool step(bool timers = true);
  std::vector<caf::actor> server_actors(std::uint32_t server) const;
  void kill_server(std::uint32_t server);
  void join_server();
  shard_options shard_opts();
  std::shared_ptr<transport> plane_member();
  reconnect_options reconnect();
  void restart_coordinator();
  void remove_server(std::uint32_t shard);
  void ask_again_when_refused();
  void run_fault_plan();
  bool cut_off(caf::resumable* job) const;
  bool timer_after_partition();
  void settle_everything();
  void finish();

  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  caf::scheduler::test_coordinator& sched_;
  sim_plan plan_;
  std::mt19937_64 rng_;
  std::string trace_path_;
  std::string fabric_;  // the in-memory transport's, this run's own
  std::vector<std::shared_ptr<transport>> members_;  // of fabric_
  std::string state_dir_;  // the coordinator's --state-dir
  coordinator_actor coord_;
  coordinator_options coordinator_options_;  // a restarted coordinator gets them again, with the saved state
  bool coordinator_dead_ = false;            // killed by the plan, not started again yet
  std::uint64_t restart_at_ = 0;             // the event at which it is started again
  bool restarted_ = false;
  std::vector<caf::actor> alive_;  // killed at the end (the system does not wait for them)
  std::vector<caf::actor> registered_;  // by worker id: the actor each worker registered from
  std::vector<std::unique_ptr<kv_client>> clients_;
  cluster_view view_;
  key_set keys_ = key_set::single({0, num_keys});
  std::vector<std::uint64_t> ids_ = row_ids();
  std::vector<std::pair<std::uint32_t, kv_future>> ops_;  // (worker, op): a dead worker's may never end
  std::vector<std::uint64_t> pushes_;
  std::uint64_t total_ = 0;
  std::vector<bool> done_;
  std::vector<bool> reported_;  // sent its end to the coordinator (the others' ends would end the job before the final read)
  std::vector<bool> dead_;
  // A worker's iterations: its pushes of keys and of rows (acknowledged ones count once dead).
  std::vector<std::vector<kv_future>> key_pushes_, row_pushes_;
  std::vector<std::uint64_t> acked_keys_, acked_rows_;  // of a dead worker, when it died
  std::vector<std::vector<kv_future>> reading_;          // a worker's reads under way (keys, rows)
  std::vector<std::optional<kv_future>> leaving_;        // the leaver's leave_clock_vector
  std::uint32_t reader_ = 0;                             // reads the final sums
  bool killed_ = false, killed_worker_ = false;
  bool joined_ = false, remove_asked_ = false;  // the plan's join and removal have begun
  bool removal_while_running_ = false;           // asked before every worker was done
  // The coordinator died while the removal was asked: its answer is lost, the resumed
  // coordinator finishes what was saved, and the operator asks again.
  bool removal_cut_ = false;
  std::shared_ptr<bool> joiner_refused_ = std::make_shared<bool>(false);  // the joiner ended before it joined
  std::uint64_t join_again_at_ = 0, ask_again_at_ = 0;  // the event at which a refused one is tried again
  bool cut_asked_again_ = false;
  std::shared_ptr<std::string> removed_ = std::make_shared<std::string>();  // the removal's answer
  std::set<caf::actor_id> cut_off_;  // a partitioned server's actors (their messages wait)
  bool partitioned_ = false;
  std::uint64_t events_ = 0, heal_at_ = 0;  // messages delivered and timers fired
  caf::actor_clock::time_point partition_began_{};
  bool started_ = false;  // the cluster formed and the keys were set
  std::uint64_t started_at_ = 0;
  std::uint64_t steps_ = 0;
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
  std::string failure_;
};

std::shared_ptr<std::optional<registration>> sim_run::register_worker(caf::actor& helper) {
  auto slot = std::make_shared<std::optional<registration>>();
  auto coord = coord_;
  // The helper stays alive as the worker's registered self (its end means the worker died).
  helper = sys_.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->request(coord, caf::infinite, register_atom::value,
                  node_info{"worker", "", 0, 0, {}, 0, 0, protocol_version, {}})
      .then([=](registration& r) { *slot = r; });
    return {[](caf::unit_t) {}};
  });
  alive_.push_back(helper);
  return slot;
}

void sim_run::start() {
  coordinator_options o;
  o.servers = plan_.servers;
  o.workers = plan_.workers;
  o.bucket_bits = 2;
  o.staleness = plan_.staleness;
  o.replication = plan_.replication;
  sparse_table_spec table;
  table.name = "sim";
  table.dim = row_dim;
  table.init_scale = 0;  // rows start at 0 and pushes sum: exact integer sums
  o.tables = {table};
  // The job's news goes to an observer that keeps quiet (without one the coordinator prints it).
  // From --log-level=warning on (replaying a seed) it prints the news: the same actor
  // either way, so a replay runs the failing schedule.
  auto quiet = sys_.spawn([](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(caf::drop);
    return {[](news_atom, const std::string& text) { log_line(log_level::warning, text); }};
  });
  alive_.push_back(quiet);
  o.observer = caf::actor_cast<observer_actor>(quiet);
  if (plan_.restart_step) {
    o.state_dir = state_dir_;
    o.rejoin_patience = std::chrono::seconds(10);  // the default --ps.failure-timeout-ms: below the shards' park limit (27 s)
  }
  coordinator_options_ = o;
  coord_ = sys_.spawn(coordinator, o);
  alive_.push_back(caf::actor_cast<caf::actor>(coord_));
  for (std::uint32_t i = 0; i < plan_.servers; ++i) {
    auto s = sys_.spawn(server_shard, coord_, shard_opts());
    caf::anon_send(s, start_atom::value, std::uint16_t{0});
    alive_.push_back(caf::actor_cast<caf::actor>(s));
  }
  std::vector<std::shared_ptr<std::optional<registration>>> regs;
  std::vector<caf::actor> helpers(plan_.workers);
  for (std::uint32_t w = 0; w < plan_.workers; ++w) regs.push_back(register_worker(helpers[w]));
  sched_.run();
  registered_.resize(plan_.workers);
  for (std::uint32_t w = 0; w < plan_.workers; ++w)
    if (regs[w]->has_value() && (*regs[w])->id < plan_.workers) registered_[(*regs[w])->id] = helpers[w];
  start_clients(regs);
}

void sim_run::start_clients(const std::vector<std::shared_ptr<std::optional<registration>>>& regs) {
  clients_.resize(plan_.workers);
  for (auto& r : regs) {
    if (!r->has_value()) return fail("a worker's registration was not answered");
    view_ = (*r)->view;
    kv_client_options opts{(*r)->id, default_chunk_bytes, std::chrono::milliseconds(60000)};
    opts.coordinator = coord_;  // follows failovers
    opts.reconnect = reconnect();
    opts.worker_handle = registered_[(*r)->id];
    opts.first_barrier = (*r)->barrier_generation;
    opts.retry = std::chrono::milliseconds(plan_.retry_ms);
    opts.faults = plan_.messages;
    opts.plane = plane_member();
    std::vector<shard_link> links;
    for (const auto& s : view_.shards)
      links.push_back({s.id, "shard " + std::to_string(s.id), caf::actor_cast<shard_actor>(s.handle)});
    clients_[(*r)->id] = std::make_unique<kv_client>(sys_, view_, links, opts);
  }
  for (const auto& s : view_.shards)
    for (const auto& copy : s.chain) alive_.push_back(copy);
  ops_.emplace_back(UINT32_MAX, clients_[0]->init(keys_, std::vector<float>(num_keys, 0.0f)));
  settle_everything();
  started_ = true;
  started_at_ = steps_;
}

std::uint32_t sim_run::pick_worker() {
  std::uint64_t sum = 0;
  for (auto s : plan_.speed) sum += s;
  auto r = rng_() % sum;
  std::uint32_t w = 0;
  while (r >= plan_.speed[w]) r -= plan_.speed[w++];
  return w;
}

// One move of worker w: take its reads' answers, or leave, or run one iteration (+1 on
// every key and every row, tick, then read both at the new clock).
void sim_run::act(std::uint32_t w) {
  if (done_[w]) return;
  auto& kv = *clients_[w];
  if (!reading_[w].empty()) {
    if (!all_ready(reading_[w])) return;
    auto reads = std::move(reading_[w]);
    reading_[w].clear();
    for (std::size_t i = 0; i < reads.size(); ++i) {
      if (auto err = reads[i].error(); !err.empty()) return fail("worker " + std::to_string(w) + ": " + err);
      check_read(w, reads[i].get(), i == 1);
    }
    if (kv.clock() == plan_.clocks) done_[w] = true;
    return;
  }
  if (leaving_[w]) {  // as a finishing worker does: out of the clock vectors, then done
    if (!leaving_[w]->ready()) return;
    if (auto err = leaving_[w]->error(); !err.empty()) return fail("worker " + std::to_string(w) + ": " + err);
    done_[w] = reported_[w] = true;
    caf::anon_send(coord_, done_atom::value, worker_result{w, true, "{}"});
    return;
  }
  if (plan_.leaver == w && kv.clock() == plan_.leave_at) {
    leaving_[w] = kv.leave_clock_vector();
    ops_.emplace_back(w, *leaving_[w]);
    return;
  }
  key_pushes_[w].push_back(kv.push(keys_, std::vector<float>(num_keys, 1.0f)));
  row_pushes_[w].push_back(kv.push_rows(0, ids_, std::vector<float>(num_rows * row_dim, 1.0f)));
  ops_.emplace_back(w, key_pushes_[w].back());
  ops_.emplace_back(w, row_pushes_[w].back());
  ops_.emplace_back(w, kv.advance_clock(kv.clock() + 1));
  ++pushes_[w];
  ++total_;
  reading_[w] = {kv.pull(keys_), kv.pull_rows(0, ids_)};
  for (const auto& r : reading_[w]) ops_.emplace_back(w, r);
}

// How many pushes every element read by `reader` at its clock must show, at least and at
// most: its own, and of every other worker those of clocks below c - s (under BSP
// exactly those below c), counting only the acknowledged ones of a dead worker.
bounds sim_run::expected(std::uint32_t reader, bool rows) const {
  const auto c = clients_[reader]->clock();
  const auto s = plan_.staleness;
  bounds b;
  for (std::uint32_t o = 0; o < plan_.workers; ++o) {
    auto sure = dead_[o] ? (rows ? acked_rows_[o] : acked_keys_[o]) : pushes_[o];
    if (s == 0) {
      b.lo += std::min(sure, c);
      b.hi += std::min(pushes_[o], c);
    } else {
      if (o == reader) b.lo += pushes_[o];
      else if (s != infinite_staleness && c > s) b.lo += std::min(sure, c - s);
      b.hi += pushes_[o];
    }
  }
  return b;
}

void sim_run::check_read(std::uint32_t w, const std::vector<float>& values, bool rows) {
  auto b = expected(w, rows);
  auto where = "worker " + std::to_string(w) + "'s read of " + (rows ? "rows" : "keys") + " at clock " +
               std::to_string(clients_[w]->clock()) + " (staleness " + staleness_to_string(plan_.staleness) + ")";
  for (std::size_t k = 0; k < values.size(); ++k) {
    auto v = static_cast<double>(values[k]);
    auto at = " at element " + std::to_string(k) + ": " + std::to_string(values[k]);
    if (v < static_cast<double>(b.lo)) return fail(where + " saw too little" + at + " < " + std::to_string(b.lo));
    if (v > static_cast<double>(b.hi)) {
      auto what = plan_.staleness == 0 ? " is not exact" : " saw more than was pushed";
      return fail(where + what + at + " > " + std::to_string(b.hi));
    }
  }
}

// Delivers one message to an actor the seed picks (or, with none waiting and `timers`,
// fires the next timer); false when it did neither.
bool sim_run::step(bool timers) {
  run_fault_plan();
  auto& jobs = sched_.jobs;
  std::vector<std::ptrdiff_t> eligible;
  for (std::size_t i = 0; i < jobs.size(); ++i)
    if (!cut_off(jobs[i])) eligible.push_back(static_cast<std::ptrdiff_t>(i));
  if (eligible.empty()) {
    if (timers && sched_.has_pending_timeout() && !timer_after_partition()) {
      hash_ = mix(hash_, 0x7157);  // a timer fired
      sched_.trigger_timeout();
      ++events_;
      return true;
    }
    if (!partitioned_) return false;
    heal_at_ = events_;  // nothing else can happen during it: the partition heals now
    run_fault_plan();
    return step(timers);
  }
  auto pick = eligible[rng_() % eligible.size()];
  std::rotate(jobs.begin(), jobs.begin() + pick, jobs.begin() + pick + 1);
  if (auto* a = dynamic_cast<caf::scheduled_actor*>(jobs.front())) {
    hash_ = mix(hash_, a->id());
    if (auto* m = a->mailbox().peek()) {
      hash_ = mix(hash_, m->content().type_token());
      if (m->content().match_element<caf::atom_value>(0))
        hash_ = mix(hash_, static_cast<std::uint64_t>(m->content().get_as<caf::atom_value>(0)));
    }
  }
  sched_.run_once();
  ++steps_;
  ++events_;
  return true;
}

// The plan's kills and partition, at their steps (counted from the end of the start:
// the keys' init is worker 0's).
void sim_run::run_fault_plan() {
  if (!started_) return;
  const auto since_start = steps_ - started_at_;
  if (plan_.kill_server && !killed_ && since_start >= plan_.kill_step) kill_server(*plan_.kill_server);
  if (plan_.kill_worker && !killed_worker_ && since_start >= plan_.kill_worker_step) kill_worker(*plan_.kill_worker);
  if (plan_.restart_step && !coordinator_dead_ && !restarted_ && since_start >= *plan_.restart_step) {
    coordinator_dead_ = true;
    restart_at_ = events_ + plan_.restart_events;
    hash_ = mix(hash_, 0xc0de);
    caf::anon_send_exit(coord_, caf::exit_reason::kill);
    if (remove_asked_ && removed_->empty()) removal_cut_ = true;
  }
  if (coordinator_dead_ && events_ >= restart_at_) restart_coordinator();
  ask_again_when_refused();
  if (plan_.join_step && !joined_ && !coordinator_dead_ && since_start >= *plan_.join_step) join_server();
  // With a join planned too, the removal waits until a client has the joined map (one map
  // change at a time; a second would be refused).
  if (plan_.remove_shard && !remove_asked_ && !coordinator_dead_ && since_start >= plan_.remove_step &&
      (!plan_.join_step || (clients_[reader_] && clients_[reader_]->map().shard_ids().size() > plan_.servers)))
    remove_server(*plan_.remove_shard);
  if (plan_.partition_server && !partitioned_ && heal_at_ == 0 && since_start >= plan_.partition_step) {
    partitioned_ = true;
    heal_at_ = events_ + plan_.partition_events;
    partition_began_ = sched_.clock().current_time;
    hash_ = mix(hash_, 0xc07);
    for (const auto& a : server_actors(*plan_.partition_server)) cut_off_.insert(a.id());
  }
  if (partitioned_ && events_ >= heal_at_) {
    partitioned_ = false;
    cut_off_.clear();
    hash_ = mix(hash_, 0x4ea1);
  }
}

// Whether the next timer falls after the partition's end: it lasts at most 2 s of
// simulated time (well inside the failure timeout and the requests' timeouts), so with
// only timers left beyond that it heals first.
bool sim_run::timer_after_partition() {
  if (!partitioned_) return false;
  const auto& schedule = sched_.clock().schedule();
  return !schedule.empty() && schedule.begin()->first > partition_began_ + std::chrono::seconds(2);
}

bool sim_run::cut_off(caf::resumable* job) const {
  if (cut_off_.empty()) return false;
  auto* a = dynamic_cast<caf::scheduled_actor*>(job);
  return a != nullptr && cut_off_.count(a->id()) > 0;
}

// Server k hosts copy j of shard k - j (j = 0: the head of shard k), as the shards
// place their copies (actors/shard/setup.cpp, spawn_replicas).
std::vector<caf::actor> sim_run::server_actors(std::uint32_t k) const {
  const auto n = plan_.servers;
  if (plan_.replication < 2) return {view_.shards[k].handle};  // set in one process
  std::vector<caf::actor> out;
  for (std::uint32_t j = 0; j < plan_.replication; ++j) out.push_back(view_.shards[(k + n - j) % n].chain.at(j));
  return out;
}

// A server's options. With a disk tier, its I/O runs on the scheduler too, so the
// schedule stays the seed's (the store's own reads and writes do not send messages).
shard_options sim_run::shard_opts() {
  shard_options o;
  o.trace_path = trace_path_;
  o.reconnect = reconnect();
  o.plane = plane_member();
  if (plan_.tiered) {
    o.shard_memory = tiered_shard_memory;
    o.disk_io = {false, tiered_page_rows};
  }
  return o;
}

// A member of this run's in-memory transport (none with plan.data_plane off): every block
// of at least one float goes over it, as production's larger blocks go over its data plane.
std::shared_ptr<transport> sim_run::plane_member() {
  if (!plan_.data_plane) return nullptr;
  static std::atomic<std::uint64_t> runs{0};
  if (fabric_.empty()) fabric_ = "sim-" + std::to_string(plan_.seed) + "-" + std::to_string(runs++);
  transport_settings s;
  s.bind_host = s.advertised_host = fabric_;
  s.min_bytes = sizeof(float);
  members_.push_back(make_memory_transport(s));
  return members_.back();
}

// One more server: it registers with the running job and joins as a new shard.
void sim_run::join_server() {
  joined_ = true;
  hash_ = mix(hash_, 0x701a);
  auto s = sys_.spawn(server_shard, coord_, shard_opts());
  caf::anon_send(s, start_atom::value, std::uint16_t{0});
  alive_.push_back(caf::actor_cast<caf::actor>(s));
  // A joiner refused (the coordinator resumes the job, or came back without its join)
  // ends with an error before it joined: the operator starts it again.
  auto refused = joiner_refused_;
  alive_.push_back(sys_.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->monitor(s);
    self->set_down_handler([=](caf::down_msg& dm) {
      if (dm.reason && dm.reason != caf::exit_reason::normal) *refused = true;
    });
    return {[](caf::unit_t) {}};
  }));
}

// An operator's join or removal that a restarting coordinator refused ("try again once
// its members are back"), or whose coordinator died under it, is tried again.
void sim_run::ask_again_when_refused() {
  if (*joiner_refused_) {  // started again some events later, as an operator would
    *joiner_refused_ = false;
    join_again_at_ = events_ + 200;
  }
  if (join_again_at_ != 0 && events_ >= join_again_at_) {
    join_again_at_ = 0;
    joined_ = false;
  }
  const bool resuming = removed_->find("try again once its members are back") != std::string::npos;
  const bool cut = removal_cut_ && !cut_asked_again_ && restarted_ && !coordinator_dead_;
  if (cut) cut_asked_again_ = true;
  if (remove_asked_ && (resuming || cut) && ask_again_at_ == 0) ask_again_at_ = events_ + 200;
  if (ask_again_at_ != 0 && events_ >= ask_again_at_) {
    ask_again_at_ = 0;
    remove_asked_ = false;
    removed_ = std::make_shared<std::string>();  // a late answer to the first asking goes to the old one
  }
}

// How members find the coordinator again after the plan killed it: the dial answers
// once it runs again (no network here, and the dial never blocks).
reconnect_options sim_run::reconnect() {
  reconnect_options r;
  r.dial = [this]() -> caf::expected<coordinator_actor> {
    if (coordinator_dead_) return caf::make_error(caf::sec::cannot_connect_to_node);
    return coord_;
  };
  r.address = "the simulated coordinator";
  r.patience = std::chrono::seconds(60);
  r.dial_blocks = false;
  return r;
}

// The plan's coordinator restart: a new one resumes the job from what the dead one saved;
// the workers that had finished say so again (a result sent while it was down is lost).
void sim_run::restart_coordinator() {
  restarted_ = true;
  coordinator_dead_ = false;
  hash_ = mix(hash_, 0x4e57a47);
  auto o = coordinator_options_;
  try {
    o.resume = std::make_shared<const coordinator_record>(load_record(state_dir_));
  } catch (const bad_request& e) {
    return fail(std::string("the coordinator cannot resume: ") + e.what());
  }
  coord_ = sys_.spawn(coordinator, o);
  alive_.push_back(caf::actor_cast<caf::actor>(coord_));
  for (std::uint32_t w = 0; w < plan_.workers; ++w)
    if (reported_[w] && !dead_[w]) caf::anon_send(coord_, done_atom::value, worker_result{w, true, "{}"});
}

// An operator's psctl remove-shard: the answer is checked at the end.
void sim_run::remove_server(std::uint32_t shard) {
  remove_asked_ = true;
  removal_while_running_ = !all_done();
  hash_ = mix(hash_, 0x1ea5e);
  auto coord = coord_;
  auto answer = removed_;
  alive_.push_back(sys_.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->request(coord, caf::infinite, remove_shard_atom::value, shard)
      .then([=](std::string& news) { *answer = news; }, [=](caf::error& e) { *answer = "refused: " + describe(e); });
    return {[](caf::unit_t) {}};
  }));
}

void sim_run::kill_server(std::uint32_t k) {
  killed_ = true;
  hash_ = mix(hash_, 0xdead);
  for (const auto& a : server_actors(k)) caf::anon_send_exit(a, caf::exit_reason::kill);
}

// Worker w ends abruptly, as a killed process: its client and its registered self.
void sim_run::kill_worker(std::uint32_t w) {
  killed_worker_ = true;
  if (done_[w]) return;  // finished already
  hash_ = mix(hash_, 0xdead0000 + w);
  auto acked = [](const std::vector<kv_future>& fs) {
    return static_cast<std::uint64_t>(
      std::count_if(fs.begin(), fs.end(), [](const kv_future& f) { return f.ready() && f.error().empty(); }));
  };
  acked_keys_[w] = acked(key_pushes_[w]);
  acked_rows_[w] = acked(row_pushes_[w]);
  dead_[w] = done_[w] = true;
  reading_[w].clear();
  clients_[w].reset();
  caf::anon_send_exit(registered_[w], caf::exit_reason::kill);
}

// Runs until every request made so far is answered (timers fire when nothing else can).
void sim_run::settle_everything() {
  auto pending = [&] {
    return std::any_of(ops_.begin(), ops_.end(),
                       [&](const auto& op) { return !(op.first < dead_.size() && dead_[op.first]) && !op.second.ready(); });
  };
  while (failure_.empty() && pending()) {
    if (!step()) return fail("stuck: requests unanswered and nothing left to run" + first_failed_request());
    if (steps_ > step_budget)
      return fail("stuck: requests unanswered after " + std::to_string(step_budget) + " steps" + first_failed_request());
  }
}

// Every request answered without error, the sums exact, the trace clean.
void sim_run::finish() {
  settle_everything();
  for (const auto& [w, op] : ops_)
    if (failure_.empty() && !(w < dead_.size() && dead_[w]) && !op.error().empty()) fail("a request failed: " + op.error());
  std::vector<kv_future> finals{clients_[reader_]->pull(keys_), clients_[reader_]->pull_rows(0, ids_)};
  for (const auto& f : finals) ops_.emplace_back(reader_, f);
  settle_everything();
  for (std::size_t i = 0; i < finals.size() && failure_.empty(); ++i) {
    if (auto err = finals[i].error(); !err.empty()) return fail("the final read failed: " + err);
    const bool rows = i == 1;
    std::uint64_t lo = 0, hi = 0;
    for (std::uint32_t o = 0; o < plan_.workers; ++o) {
      lo += dead_[o] ? (rows ? acked_rows_[o] : acked_keys_[o]) : pushes_[o];
      hi += pushes_[o];
    }
    auto values = finals[i].get();
    for (std::size_t k = 0; k < values.size(); ++k)
      if (values[k] < static_cast<float>(lo) || values[k] > static_cast<float>(hi))
        return fail(std::string(rows ? "row element " : "key ") + std::to_string(k) + " ends at " +
                    std::to_string(values[k]) + ", not in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                    "] (acknowledged pushes, pushes sent)");
  }
  if (!failure_.empty()) return;
  // The removal (when planned) was answered: done, or refused only because the job was ending.
  while (remove_asked_ && removed_->empty() && failure_.empty() && steps_ <= step_budget)
    if (!step()) break;
  // A removal the coordinator's restart cut off or refused may end with the job before it
  // is asked again (the job's sums and map were checked above); any other must be answered,
  // done or refused only because the job was ending.
  const bool restart_interfered = removal_cut_ || ask_again_at_ != 0;
  if (remove_asked_ && removed_->empty() && !restart_interfered) return fail("psctl remove-shard was never answered");
  // Refusals an operator is told to expect: the job was ending, or the leaver's process
  // holds the last copy of another shard (a server died before).
  if (removal_while_running_ && !restart_interfered && removed_->rfind("refused: ", 0) == 0 &&
      removed_->find("ending") == std::string::npos && removed_->find("the last copy of shard") == std::string::npos)
    return fail("psctl remove-shard: " + *removed_);
  auto report = check_trace(read_trace(trace_path_));
  if (!report.violations.empty()) fail("consistency trace: " + report.violations.front());
}

}  // namespace

sim_outcome run_simulation(const sim_plan& plan, const std::string& trace_dir) {
  sim_run run(plan, trace_dir);
  return run.run();
}

}  // namespace ps
