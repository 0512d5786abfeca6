#include "apps/sim_cluster.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <random>

#include <caf/all.hpp>

#include "actors/coordinator.hpp"
#include "actors/kv_client.hpp"
#include "actors/server_shard.hpp"
#include "libps/consistency.hpp"
#include "libps/trace.hpp"

namespace ps {

namespace {

constexpr std::uint64_t num_keys = 64;  // 16 buckets of 4 keys over 2 shards
constexpr std::uint64_t step_budget = 200000;

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
        pushes_(plan.workers, 0),
        done_(plan.workers, false),
        reading_(plan.workers) {
    std::remove(trace_path_.c_str());
    sys_.await_actors_before_shutdown(false);
  }

  ~sim_run() {
    clients_.clear();
    for (auto& a : alive_) caf::anon_send_exit(a, caf::exit_reason::kill);
    sched_.run();
    std::remove(trace_path_.c_str());
  }

  sim_outcome run() {
    start();
    for (std::uint64_t moves = 0; failure_.empty() && !all_done(); ++moves) {
      act(pick_worker());
      // Time passes only while every worker waits: computing is instantaneous here.
      for (auto k = rng_() % 8; k > 0 && failure_.empty(); --k) step(!any_can_act());
      if (steps_ > step_budget || moves > step_budget)
        fail("stuck: workers not done after " + std::to_string(steps_) + " messages");
    }
    if (failure_.empty()) finish();
    return {failure_, hash_, steps_};
  }

 private:
  void fail(const std::string& why) {
    if (failure_.empty()) failure_ = why;
  }

  bool all_done() const { return std::all_of(done_.begin(), done_.end(), [](bool d) { return d; }); }
  bool any_can_act() const {
    for (std::size_t w = 0; w < done_.size(); ++w)
      if (!done_[w] && (!reading_[w] || reading_[w]->ready())) return true;
    return false;
  }

  void start();
  void start_clients(const std::vector<std::shared_ptr<std::optional<registration>>>& regs);
  std::shared_ptr<std::optional<registration>> register_worker();
  std::uint32_t pick_worker();
  void act(std::uint32_t w);
  void check_read(std::uint32_t w, const std::vector<float>& values);
  bool step(bool timers = true);
  void kill_server(std::uint32_t server);
  void settle_everything();
  void finish();

  caf::actor_system_config cfg_;
  caf::actor_system sys_;
  caf::scheduler::test_coordinator& sched_;
  sim_plan plan_;
  std::mt19937_64 rng_;
  std::string trace_path_;
  coordinator_actor coord_;
  std::vector<caf::actor> alive_;  // killed at the end (the system does not wait for them)
  std::vector<std::unique_ptr<kv_client>> clients_;
  cluster_view view_;
  key_set keys_ = key_set::single({0, num_keys});
  std::vector<kv_future> ops_;
  std::vector<std::uint64_t> pushes_;
  std::uint64_t total_ = 0;
  std::vector<bool> done_;
  std::vector<std::optional<kv_future>> reading_;
  bool killed_ = false;
  std::uint64_t steps_ = 0;
  std::uint64_t hash_ = 0xcbf29ce484222325ull;
  std::string failure_;
};

std::shared_ptr<std::optional<registration>> sim_run::register_worker() {
  auto slot = std::make_shared<std::optional<registration>>();
  auto coord = coord_;
  // The helper stays alive as the worker's registered self (its end would mean the worker died).
  alive_.push_back(sys_.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    self->request(coord, caf::infinite, register_atom::value,
                  node_info{"worker", "", 0, 0, {}, 0, 0, protocol_version, {}})
      .then([=](registration& r) { *slot = r; });
    return {[](caf::unit_t) {}};
  }));
  return slot;
}

void sim_run::start() {
  coordinator_options o;
  o.servers = 2;
  o.workers = plan_.workers;
  o.bucket_bits = 2;
  o.staleness = plan_.staleness;
  o.replication = plan_.replication;
  // The job's news goes to an observer that keeps quiet (without one the coordinator prints it).
  auto quiet = sys_.spawn([](caf::event_based_actor* self) -> caf::behavior {
    self->set_default_handler(caf::drop);
    return {[](caf::unit_t) {}};
  });
  alive_.push_back(quiet);
  o.observer = caf::actor_cast<observer_actor>(quiet);
  coord_ = sys_.spawn(coordinator, o);
  alive_.push_back(caf::actor_cast<caf::actor>(coord_));
  shard_options sopts;
  sopts.trace_path = trace_path_;
  for (int i = 0; i < 2; ++i) {
    auto s = sys_.spawn(server_shard, coord_, sopts);
    caf::anon_send(s, start_atom::value, std::uint16_t{0});
    alive_.push_back(caf::actor_cast<caf::actor>(s));
  }
  std::vector<std::shared_ptr<std::optional<registration>>> regs;
  for (std::uint32_t w = 0; w < plan_.workers; ++w) regs.push_back(register_worker());
  sched_.run();
  start_clients(regs);
}

void sim_run::start_clients(const std::vector<std::shared_ptr<std::optional<registration>>>& regs) {
  clients_.resize(plan_.workers);
  for (auto& r : regs) {
    if (!r->has_value()) return fail("a worker's registration was not answered");
    view_ = (*r)->view;
    kv_client_options opts{(*r)->id, default_chunk_bytes, std::chrono::milliseconds(60000)};
    opts.coordinator = coord_;  // follows failovers
    opts.retry = std::chrono::milliseconds(plan_.retry_ms);
    opts.faults = plan_.messages;
    std::vector<shard_link> links;
    for (const auto& s : view_.shards)
      links.push_back({s.id, "shard " + std::to_string(s.id), caf::actor_cast<shard_actor>(s.handle)});
    clients_[(*r)->id] = std::make_unique<kv_client>(sys_, view_, links, opts);
  }
  for (const auto& s : view_.shards)
    for (const auto& copy : s.chain) alive_.push_back(copy);
  ops_.push_back(clients_[0]->init(keys_, std::vector<float>(num_keys, 0.0f)));
  settle_everything();
}

std::uint32_t sim_run::pick_worker() {
  std::uint64_t sum = 0;
  for (auto s : plan_.speed) sum += s;
  auto r = rng_() % sum;
  std::uint32_t w = 0;
  while (r >= plan_.speed[w]) r -= plan_.speed[w++];
  return w;
}

// One move of worker w: take its read's answer, or leave, or run one iteration (+1 on
// every key, tick, then read at the new clock).
void sim_run::act(std::uint32_t w) {
  if (done_[w]) return;
  auto& kv = *clients_[w];
  if (reading_[w]) {
    if (!reading_[w]->ready()) return;
    auto read = *reading_[w];
    reading_[w].reset();
    if (auto err = read.error(); !err.empty()) return fail("worker " + std::to_string(w) + ": " + err);
    check_read(w, read.get());
    if (kv.clock() == plan_.clocks) done_[w] = true;
    return;
  }
  if (plan_.leaver == w && kv.clock() == plan_.leave_at) {
    done_[w] = true;
    caf::anon_send(coord_, done_atom::value, worker_result{w, true, "{}"});
    return;
  }
  ops_.push_back(kv.push(keys_, std::vector<float>(num_keys, 1.0f)));
  ops_.push_back(kv.advance_clock(kv.clock() + 1));
  ++pushes_[w];
  ++total_;
  reading_[w] = kv.pull(keys_);
  ops_.push_back(*reading_[w]);
}

void sim_run::check_read(std::uint32_t w, const std::vector<float>& values) {
  const auto clock = clients_[w]->clock();
  const auto s = plan_.staleness;
  std::uint64_t floor = pushes_[w], exact = 0;
  for (std::uint32_t o = 0; o < plan_.workers; ++o) {
    exact += std::min(pushes_[o], clock);
    if (o != w && s != infinite_staleness && clock > s) floor += std::min(pushes_[o], clock - s);
  }
  auto where = "worker " + std::to_string(w) + "'s read at clock " + std::to_string(clock) + " (staleness " +
               staleness_to_string(s) + ")";
  for (std::size_t k = 0; k < values.size(); ++k) {
    auto v = static_cast<double>(values[k]);
    auto at = " at key " + std::to_string(k) + ": " + std::to_string(values[k]);
    if (v < static_cast<double>(floor)) return fail(where + " saw too little" + at + " < " + std::to_string(floor));
    if (v > static_cast<double>(total_)) return fail(where + " saw more than was pushed" + at + " > " + std::to_string(total_));
    if (s == 0 && v != static_cast<double>(exact)) return fail(where + " is not exact" + at + " != " + std::to_string(exact));
  }
}

// Delivers one message to an actor the seed picks (or, with none waiting and `timers`,
// fires the next timer); false when it did neither.
bool sim_run::step(bool timers) {
  if (plan_.kill_server && !killed_ && steps_ >= plan_.kill_step) kill_server(*plan_.kill_server);
  auto& jobs = sched_.jobs;
  if (jobs.empty()) {
    if (!timers || !sched_.has_pending_timeout()) return false;
    hash_ = mix(hash_, 0x7157);  // a timer fired
    sched_.trigger_timeout();
    return true;
  }
  auto pick = static_cast<std::ptrdiff_t>(rng_() % jobs.size());
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
  return true;
}

// Server k hosts the head of shard k and the second copy of the other shard.
void sim_run::kill_server(std::uint32_t k) {
  killed_ = true;
  hash_ = mix(hash_, 0xdead);
  caf::anon_send_exit(view_.shards[k].chain.at(0), caf::exit_reason::kill);
  caf::anon_send_exit(view_.shards[1 - k].chain.at(1), caf::exit_reason::kill);
}

// Runs until every request made so far is answered (timers fire when nothing else can).
void sim_run::settle_everything() {
  auto pending = [&] { return std::any_of(ops_.begin(), ops_.end(), [](const kv_future& f) { return !f.ready(); }); };
  while (failure_.empty() && pending()) {
    if (!step()) return fail("stuck: requests unanswered and nothing left to run");
    if (steps_ > step_budget) return fail("stuck: requests unanswered after " + std::to_string(step_budget) + " steps");
  }
}

// Every request answered without error, the sums exact, the trace clean.
void sim_run::finish() {
  settle_everything();
  for (const auto& op : ops_)
    if (failure_.empty() && !op.error().empty()) fail("a request failed: " + op.error());
  std::uint32_t reader = plan_.leaver == 0u ? 1 : 0;
  ops_.push_back(clients_[reader]->pull(keys_));
  auto final_read = ops_.back();
  settle_everything();
  if (!failure_.empty()) return;
  if (auto err = final_read.error(); !err.empty()) return fail("the final read failed: " + err);
  auto values = final_read.get();
  for (std::size_t k = 0; k < values.size(); ++k)
    if (values[k] != static_cast<float>(total_))
      return fail("key " + std::to_string(k) + " ends at " + std::to_string(values[k]) + ", " +
                  std::to_string(total_) + " pushes were acknowledged");
  auto report = check_trace(read_trace(trace_path_));
  if (!report.violations.empty()) fail("consistency trace: " + report.violations.front());
}

}  // namespace

sim_outcome run_simulation(const sim_plan& plan, const std::string& trace_dir) {
  sim_run run(plan, trace_dir);
  return run.run();
}

}  // namespace ps
