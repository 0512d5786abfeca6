#include "actors/coordinator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <optional>

#include "libps/cluster_status.hpp"
#include "libps/consistency.hpp"
#include "libps/handoff.hpp"
#include "libps/text.hpp"

namespace ps::detail {
// What a recovery reads: the checkpoint laid out for the map, its file, the newer files
// refused and why; or why there is none (error).
struct recovery_source {
  std::optional<checkpoint> found;
  std::string path;
  std::vector<std::string> refused;
  std::string error;
};
}  // namespace ps::detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const ps::detail::recovery_source>)

namespace ps {

namespace {

using detail::recovery_source;

using self_ptr = coordinator_actor::stateful_pointer<coordinator_state>;

cluster_view make_view(self_ptr self, const coordinator_options& opts) {
  cluster_view v;
  v.epoch = self->state.epoch;
  v.vnodes = opts.vnodes;
  v.bucket_bits = opts.bucket_bits;
  v.dense.ranges = dense_ranges(opts.spec);
  for (const auto& t : opts.tables) v.tables.push_back(table_msg::from(t));
  v.num_workers = static_cast<std::uint32_t>(self->state.worker_done.size());
  v.job_workers = opts.workers;
  v.staleness = opts.staleness;
  v.checkpoint_every = opts.checkpoint_every;
  v.checkpointer = opts.checkpointer;
  if (opts.checkpointer) v.checkpoint_dir = opts.checkpoint_dir;
  v.replication = opts.replication;
  // Every entry names its head: shards hand keys to each other when the map changes.
  for (const auto& e : self->state.shards)
    if (!self->state.retired.count(e.id)) {
      v.shards.push_back(e);
      if (!v.shards.back().handle && e.id < self->state.shard_handles.size())
        v.shards.back().handle = caf::actor_cast<caf::actor>(self->state.shard_handles[e.id]);
    }
  v.rule = rule_msg::from(opts.rule);
  for (const auto& [bucket, owner] : self->state.placement) {
    v.placed_buckets.push_back(bucket);
    v.placed_owners.push_back(owner);
  }
  return v;
}

// A registration answer: the member's id, the map and the job contract.
registration make_registration(self_ptr self, const coordinator_options& opts, std::uint32_t id,
                               encoded_block state = {}, std::uint64_t start_clock = 0) {
  return {id, make_view(self, opts), std::move(state), start_clock, job_spec_msg::from(opts.spec),
          self->state.barrier_generation};
}

// The ids of the shards in the map (not those that left it).
std::vector<std::uint32_t> live_ids(const coordinator_state& st) {
  std::vector<std::uint32_t> ids;
  for (std::uint32_t i = 0; i < st.shard_handles.size(); ++i)
    if (!st.retired.count(i)) ids.push_back(i);
  return ids;
}

// The heads of those shards.
std::vector<shard_actor> live_heads(const coordinator_state& st) {
  std::vector<shard_actor> heads;
  for (auto id : live_ids(st)) heads.push_back(st.shard_handles[id]);
  return heads;
}

// Tells the observer an event; without one (a coordinator on its own) prints `text`.
template <class... Event>
void tell(const coordinator_options& opts, const std::string& text, Event&&... event) {
  if (opts.observer)
    caf::anon_send(opts.observer, std::forward<Event>(event)...);
  else
    std::fprintf(stderr, "%s\n", text.c_str());
}

// The cluster's own news (failovers, joins, departures).
void tell_news(const coordinator_options& opts, const std::string& text) { tell(opts, text, news_atom::value, text); }

// The workers that are still running, for the clients (data partitions follow them).
void tell_members(self_ptr self) {
  auto& st = self->state;
  std::vector<std::uint32_t> live;
  for (std::uint32_t w = 0; w < st.worker_done.size(); ++w)
    if (!st.worker_done[w]) live.push_back(w);
  for (auto& sub : st.view_subscribers) caf::anon_send(sub, members_atom::value, live);
}

coordinator_record record_of(const coordinator_state& st, const coordinator_options& opts) {
  coordinator_record r;
  r.job_fingerprint = fingerprint_hex(opts.spec);
  r.servers = opts.servers;
  r.workers = opts.workers;
  r.epoch = st.epoch;
  r.placement = st.placement;
  r.retired.assign(st.retired.begin(), st.retired.end());
  for (const auto& e : st.shards) {
    r.shards.push_back({e.id, e.host, e.port, e.pid, {}});
    for (const auto& copy : e.chain) {
      auto at = st.copy_positions.find(copy.address());
      r.shards.back().chain.push_back(at == st.copy_positions.end() ? 0 : at->second);
    }
  }
  r.worker_done = st.worker_done;
  r.results = st.results;
  r.barrier_generation = st.barrier_generation;
  r.change = st.change;
  r.change_shard = st.change_shard;
  r.change_epoch = st.change_epoch;
  return r;
}

// --state-dir: saves what a resumed coordinator needs, once the job has formed (before,
// there is nothing to resume: members started afresh find a fresh coordinator).
void persist(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  if (opts.state_dir.empty() || st.resuming || st.ending || !st.view_ready || st.next_worker < opts.workers) return;
  try {
    save_record(opts.state_dir, record_of(st, opts));
  } catch (const bad_request& e) {
    tell_news(opts, std::string("coordinator: ") + e.what() + "; a restart could not resume from it");
  }
}

// The barrier is released once every running worker reached it; saved first, so a
// coordinator resumed after its death answers a barrier sent again at once.
void release_barrier_if_complete(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  auto live = st.worker_done.size() - st.finished_workers;
  if (st.resuming || st.barrier.empty() || st.barrier.size() < live) return;
  auto gen = st.barrier_generation++;
  persist(self, opts);
  for (auto& [worker, rp] : st.barrier) rp.deliver(gen);
  st.barrier.clear();
}

// A worker's barrier number `generation`: answered at once when released before.
caf::result<std::uint64_t> enter_barrier(self_ptr self, const coordinator_options& opts, std::uint32_t worker,
                                         std::uint64_t generation) {
  auto& st = self->state;
  if (st.ending) return st.end_reason;
  if (generation < st.barrier_generation) return generation;
  if (worker >= st.worker_done.size() || st.worker_done[worker])
    return make_ps_error("coordinator: worker " + std::to_string(worker) + " is not running, it has no barrier");
  auto rp = self->make_response_promise<std::uint64_t>();
  st.barrier[worker] = rp;  // one sent again (after a restart) replaces the first
  release_barrier_if_complete(self, opts);
  return rp;
}

// The job cannot go on, or was stopped: parked registrations and barriers get the
// reason, the workers' clients fail their requests to every shard at once, the observer
// hears it, and the coordinator quits with it (every member monitors the coordinator and
// ends with this reason and its exit status).
// The reason reaches members as a message, acknowledged by the shards before the
// coordinator quits: its process may exit at once, and a down message still queued in
// the network layer would then arrive as a plain lost connection.
// completed: the job ended as it should (code and text unused), members end normally.
void end_job(self_ptr self, const coordinator_options& opts, errc code, const std::string& text,
             bool completed = false) {
  auto& st = self->state;
  if (st.ending) return;
  st.ending = true;
  auto err = completed ? caf::error{} : make_error(code, text);
  st.end_reason = err;
  auto wire_code = completed ? std::uint8_t{0} : static_cast<std::uint8_t>(code);
  for (auto& w : st.waiting) w.promise.deliver(err);
  st.waiting.clear();
  for (auto& [worker, rp] : st.barrier) rp.deliver(err);
  st.barrier.clear();
  // Nothing is left to resume (a restart with --resume is refused, naming why).
  if (!opts.state_dir.empty()) std::remove(record_path(opts.state_dir).c_str());
  if (!completed) {
    for (auto& w : st.worker_handles) caf::anon_send(w, stop_atom::value, wire_code, text);
    for (auto& sub : st.view_subscribers)
      for (const auto& s : st.shards) caf::anon_send(sub, failed_atom::value, s.id, text);
  }
  // A stop is no failure: the observer learns it from the coordinator's exit reason.
  if (!completed && (code == errc::job_failed || code == errc::failed))
    tell(opts, "coordinator: " + text, job_failed_atom::value, text);
  // A failed job lingers a moment, so a member whose registration was on its way when the
  // job ended learns why (the register handler answers with the reason).
  auto quit = [=] {
    if (completed)
      self->quit();
    else
      self->delayed_send(self, std::chrono::milliseconds(500), end_atom::value);
  };
  auto to_stop = st.copies;
  for (const auto& [id, workers] : st.draining_clients) to_stop.push_back(st.shard_handles[id]);
  st.draining_clients.clear();
  auto remaining = std::make_shared<std::size_t>(to_stop.size());
  if (*remaining == 0) return quit();
  auto acked = [=] {
    if (--*remaining == 0) quit();
  };
  for (auto& copy : to_stop)
    self->request(copy, std::chrono::seconds(2), stop_atom::value, wire_code, text)
      .then([=](caf::ok_atom) { acked(); }, [=](caf::error&) { acked(); });
}

// Asks every head the same question (each answers a number): all(answers), in the heads'
// order, or failed(why) naming a head that did not answer within 5 s ("did not <what>").
template <class... Question>
void ask_heads(self_ptr self, const std::vector<shard_actor>& heads, const std::string& what,
               std::function<void(std::vector<std::uint64_t>)> all, std::function<void(std::string)> failed,
               Question... question) {
  auto answers = std::make_shared<std::vector<std::uint64_t>>(heads.size());
  auto remaining = std::make_shared<std::size_t>(heads.size());
  auto silent = std::make_shared<std::string>();
  auto answered = [=] {
    if (--*remaining > 0) return;
    if (silent->empty()) all(*answers);
    else failed(*silent);
  };
  for (std::size_t i = 0; i < heads.size(); ++i)
    self->request(heads[i], std::chrono::seconds(5), question...)
      .then(
        [=](std::uint64_t answer) {
          (*answers)[i] = answer;
          answered();
        },
        [=](caf::error& e) {
          *silent = "shard " + std::to_string(i) + " did not " + what + " (" + describe(e) + ")";
          answered();
        });
}

// The final checkpoint at `clock`: every head sends its part; the job ends once the file
// is written, or fails when it cannot be (the trained parameters would be lost).
void write_final_checkpoint(self_ptr self, const coordinator_options& opts, std::uint64_t clock) {
  self->request(opts.checkpointer, std::chrono::seconds(120), await_atom::value, clock)
    .then([=](const std::string& path) {
            tell_news(opts, "coordinator: final checkpoint " + path + " (clock " + std::to_string(clock) + ")");
            end_job(self, opts, errc::failed, "", true);
          },
          [=](caf::error& err) {
            end_job(self, opts, errc::job_failed, "the final checkpoint was not written: " + describe(err));
          });
  for (auto& head : live_heads(self->state)) caf::anon_send(head, final_atom::value, clock);
}

void cut_checkpoint(self_ptr self, std::function<void(std::uint64_t)> cut, std::function<void(std::string)> failed);

// An operator's stop (psctl stop, SIGINT, SIGTERM): with --checkpoint-dir the job first
// cuts a checkpoint at the next clock boundary and waits for its file, at most 1.5 s (a
// stop must end the job within 2 s); a failure for any other reason ends it at once.
void stop_job(self_ptr self, const coordinator_options& opts, errc kind, const std::string& why) {
  auto& st = self->state;
  if (kind == errc::job_failed || !opts.checkpointer || !st.view_ready || st.ending)
    return end_job(self, opts, kind, why);
  if (st.stopping) return;  // its checkpoint is on the way; the job ends after it
  st.stopping = true;
  auto end = [=](const std::string& news) {
    tell_news(opts, news);
    end_job(self, opts, kind, why);
  };
  cut_checkpoint(
    self,
    [=](std::uint64_t boundary) {
      self->request(opts.checkpointer, std::chrono::milliseconds(1500), await_atom::value, boundary)
        .then([=](const std::string& path) { end("coordinator: last checkpoint before the stop: " + path); },
              [=](caf::error& e) { end("coordinator: no checkpoint before the stop (" + describe(e) + ")"); });
    },
    [=](std::string failed) { end(failed); });
}

// Every worker is done. With --checkpoint-dir the job ends with a final checkpoint,
// labelled above every clock a worker reached or pushed; otherwise it ends now.
void finish_job(self_ptr self, const coordinator_options& opts) {
  auto heads = live_heads(self->state);
  if (!opts.checkpointer || heads.empty()) return end_job(self, opts, errc::failed, "", true);
  auto not_written = [=](const std::string& why) {
    end_job(self, opts, errc::job_failed, "the final checkpoint was not written: " + why);
  };
  auto with_clocks = [=](std::vector<std::uint64_t> clocks) {
    auto highest = *std::max_element(clocks.begin(), clocks.end());
    // A periodic checkpoint at that clock already holds the final state.
    self->request(opts.checkpointer, std::chrono::seconds(5), final_atom::value, highest)
      .then([=](const std::string& path) {
              if (path.empty()) return write_final_checkpoint(self, opts, highest);
              tell_news(opts, "coordinator: final checkpoint " + path + " (clock " + std::to_string(highest) + ")");
              end_job(self, opts, errc::failed, "", true);
            },
            [=](caf::error& err) { not_written(describe(err)); });
  };
  ask_heads(self, heads, "say its clock", with_clocks, not_written, final_atom::value);
}

void stop_if_drained(self_ptr self, const coordinator_options& opts, std::uint32_t id);
void stop_leavers_copies(self_ptr self, std::uint32_t id);

// After a worker left or the members came back: the job ends once every worker is done
// (it failed when none left a result), else the barrier may be complete now.
void go_on(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  if (st.finished_workers < st.worker_done.size()) return release_barrier_if_complete(self, opts);
  const bool any_result = std::any_of(st.results.begin(), st.results.end(), [](const auto& r) { return r.second.ok; });
  if (!any_result) return end_job(self, opts, errc::job_failed, "every worker went down before finishing");
  finish_job(self, opts);
}

void finish_resume(self_ptr self, const coordinator_options& opts);

void worker_finished(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto& st = self->state;
  if (id >= st.worker_done.size() || st.worker_done[id]) return;
  st.worker_done[id] = true;
  st.absent_workers.erase(id);
  ++st.finished_workers;
  st.barrier.erase(id);
  std::vector<std::uint32_t> drained;
  for (auto& [shard, workers] : st.draining_clients)
    if (workers.erase(id) && workers.empty()) drained.push_back(shard);
  for (auto shard : drained) stop_if_drained(self, opts, shard);
  // It leaves the clock vector: BSP and SSP reads stop waiting for it.
  for (auto& copy : st.copies) caf::anon_send(copy, leave_atom::value, id);
  tell_members(self);
  persist(self, opts);
  // A resumed job goes on (or ends) once its members are back: one that ended is.
  if (st.resuming) return finish_resume(self, opts);
  go_on(self, opts);
}

// Why a member cannot join this job (empty: it can): another protocol version, or job
// settings it was given that differ from the spec.
std::string refusal(const coordinator_options& opts, const node_info& info) {
  if (auto v = version_mismatch(info.version, opts.spec.version); !v.empty()) return v;
  auto diffs = opts.spec.differences(info.given);
  if (diffs.empty()) return {};
  return "its settings differ from the job's: " + describe_differences(diffs);
}

std::string member_name(const node_info& info) {
  return info.role + (info.pid ? " (pid " + std::to_string(info.pid) + (info.host.empty() ? "" : " on " + info.host) + ")"
                               : std::string());
}

encoded_block encoded_state(const checkpoint& c, std::uint32_t shard);
void recover_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                   const caf::error& reason);

// A map change begins or is over (the checkpointer drops rounds cut meanwhile).
void tell_map_change(const coordinator_options& opts, bool begins) {
  if (opts.checkpointer) caf::anon_send(opts.checkpointer, map_change_atom::value, begins);
}

// The checkpoint writer follows the map: which shards a file holds, and where their keys are.
void tell_checkpointer(const coordinator_options& opts, const cluster_view& view) {
  if (!opts.checkpointer) return;
  std::vector<std::uint32_t> ids;
  for (const auto& e : view.shards) ids.push_back(e.id);
  caf::anon_send(opts.checkpointer, view_atom::value, view.epoch, std::move(ids), view.placed_buckets, view.placed_owners);
}

// Hands the new map to every live shard first, then (once they all have it) to the
// workers' clients, so no request of the new epoch reaches a shard that lacks it.
void tell_leavers_chains(self_ptr self, const coordinator_options& opts);
bool leavers_copy(const coordinator_state& st, const shard_actor& copy);

void announce_view(self_ptr self, const coordinator_options& opts, std::function<void()> then = {}) {
  auto& st = self->state;
  auto view = make_view(self, opts);
  persist(self, opts);
  std::vector<shard_actor> copies;
  for (auto& copy : st.copies)
    if (!leavers_copy(st, copy)) copies.push_back(copy);
  auto remaining = std::make_shared<std::size_t>(copies.size());
  tell_checkpointer(opts, view);
  tell_map_change(opts, false);  // every shard has what the map gives it (if it changed)
  if (opts.observer) caf::anon_send(opts.observer, view_atom::value, view);
  // A leaver still draining passes stale writes on to their owners: it needs their heads.
  tell_leavers_chains(self, opts);
  auto to_workers = [=] {
    for (auto& sub : self->state.view_subscribers) caf::anon_send(sub, view_atom::value, view);
    if (then) then();
  };
  if (copies.empty()) return to_workers();
  for (auto& copy : copies)
    self->request(copy, std::chrono::seconds(5), view_atom::value, view)
      .then([=](std::uint64_t) { if (--*remaining == 0) to_workers(); },
            [=](caf::error&) { if (--*remaining == 0) to_workers(); });  // a dead one fails over next
}

// Shards that left the map but still serve: the one whose change is under way, and
// those clients still drain.
bool serving_leaver(const coordinator_state& st, std::uint32_t id) {
  return st.retired.count(id) && id < st.shards.size() &&
         ((st.change == "leave" && st.change_shard == id) || st.draining_clients.count(id));
}

// A copy of such a shard: it gets the view with its own chain (tell_leavers_chains),
// not the map's alone, which would leave it without a successor.
bool leavers_copy(const coordinator_state& st, const shard_actor& copy) {
  for (auto id : st.retired)
    if (serving_leaver(st, id)) {
      const auto& chain = st.shards[id].chain;
      if (std::find(chain.begin(), chain.end(), caf::actor_cast<caf::actor>(copy)) != chain.end()) return true;
    }
  return false;
}

// The view for the copies of serving leavers: the map's entries, and its own chain, so a
// copy whose successor died follows the next one (a map names no shard that left).
void tell_leavers_chains(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  for (auto id : st.retired) {
    if (!serving_leaver(st, id)) continue;
    auto view = make_view(self, opts);
    view.shards.push_back(st.shards[id]);
    view.shards.back().handle = caf::actor_cast<caf::actor>(st.shard_handles[id]);
    for (const auto& copy : st.shards[id].chain) caf::anon_send(caf::actor_cast<shard_actor>(copy), view_atom::value, view);
    if (st.shards[id].chain.empty()) caf::anon_send(st.shard_handles[id], view_atom::value, view);
  }
}

// A chain closed while the map changes: the shards get the view (a head needs its new
// successor to finish its part of the change), the clients only the change's own
// announcement, so none of them routes by the new map before its keys have moved.
void tell_chains(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  auto view = make_view(self, opts);
  persist(self, opts);
  for (auto& copy : st.copies)
    if (!leavers_copy(st, copy)) caf::anon_send(copy, view_atom::value, view);
  tell_leavers_chains(self, opts);
}

// Registrations waiting for the map: servers (role true) get theirs once every server is
// in; workers once the chains are complete too.
void deliver_waiting(self_ptr self, const coordinator_options& opts, bool servers_only) {
  auto& st = self->state;
  std::vector<coordinator_state::parked_registration> keep;
  for (auto& w : st.waiting) {
    if (servers_only && !w.server) {
      keep.push_back(std::move(w));
      continue;
    }
    auto reg = make_registration(self, opts, w.id);
    if (opts.restore && w.server) reg.state = encoded_state(*opts.restore, reg.id);
    if (opts.restore && !w.server) reg.start_clock = opts.restore_clock;  // where the checkpoint's job was
    w.promise.deliver(std::move(reg));
  }
  st.waiting = std::move(keep);
}

// A copy that had come back to a resuming coordinator died: it leaves the chain being
// assembled. True when it was the shard's last (back or awaited): the shard is recovered.
bool copy_failed_while_resuming(self_ptr self, std::uint32_t id, const caf::actor_addr& gone) {
  auto& st = self->state;
  auto back = st.rejoined_copies.find(id);
  if (back != st.rejoined_copies.end()) {
    for (auto it = back->second.begin(); it != back->second.end(); ++it)
      if (it->second.address() == gone) {
        back->second.erase(it);
        break;
      }
    if (back->second.empty()) st.rejoined_copies.erase(back);
  }
  // Another copy is back or may come (the resume finishes when the last one does).
  return !st.rejoined_copies.count(id) && !st.absent_copies.count(id);
}

// The server process that holds copy `position` of shard `id`: a head its own (numbered
// by its shard), a copy of the job's start as spawn_replicas placed it, a grown copy the
// one its position names (grown_position).
std::uint32_t process_of(const coordinator_options& opts, std::uint32_t id, std::uint32_t position) {
  if (position == 0) return id;
  return position < opts.servers ? (id + position) % opts.servers : position - opts.servers;
}

// The position a grown copy of a shard takes in `process`: it names that process.
std::uint32_t grown_position(const coordinator_options& opts, std::uint32_t process) { return opts.servers + process; }

// The process a copy of shard id lives in.
std::uint32_t process_of_copy(const coordinator_options& opts, const coordinator_state& st, std::uint32_t id,
                              const caf::actor_addr& copy) {
  auto at = st.copy_positions.find(copy);
  return process_of(opts, id, at == st.copy_positions.end() ? 0 : at->second);
}

// How many copies of shard id live in `process`.
std::size_t copies_in_process(const coordinator_options& opts, const coordinator_state& st, std::uint32_t id,
                              std::uint32_t process) {
  const auto& chain = st.shards[id].chain;
  return std::count_if(chain.begin(), chain.end(),
                       [&](const caf::actor& c) { return process_of_copy(opts, st, id, c.address()) == process; });
}

// A live process of the job's start that holds no copy of shard `id`, the one that holds
// the fewest copies (then the lowest); nullopt: none.
std::optional<std::uint32_t> host_for_copy(const coordinator_options& opts, const coordinator_state& st,
                                           std::uint32_t id) {
  std::map<std::uint32_t, std::size_t> held;
  std::set<std::uint32_t> holding_it;
  for (const auto& copy : st.copies) {
    auto shard = st.shard_ids.find(copy.address());
    if (shard == st.shard_ids.end()) continue;
    auto process = process_of_copy(opts, st, shard->second, copy.address());
    ++held[process];
    if (shard->second == id) holding_it.insert(process);
  }
  std::optional<std::uint32_t> best;
  for (const auto& [process, head] : st.process_heads)
    if (!holding_it.count(process) && (!best || held[process] < held[*best])) best = process;
  return best;
}

void grow_chain(self_ptr self, const coordinator_options& opts, std::uint32_t id, std::uint32_t process,
                std::function<void()> next = {});

void grow_chains(self_ptr self, const coordinator_options& opts);

// A growth step ended: a map change that waited for it goes first (chains grow on after
// it), else the next chain grows.
void grow_on(self_ptr self, const coordinator_options& opts) {
  auto waiting = std::move(self->state.after_growth);
  self->state.after_growth = nullptr;
  if (waiting) return waiting();
  for (auto held : std::set<std::uint32_t>(self->state.leavers_held)) stop_if_drained(self, opts, held);
  grow_chains(self, opts);
}

// How many copies of shard id will outlive the processes of shards that left the map
// (they end once drained: draining_clients names them).
std::size_t lasting_copies(const coordinator_options& opts, const coordinator_state& st, std::uint32_t id) {
  std::size_t lasting = 0;
  for (const auto& copy : st.shards[id].chain)
    lasting += !st.draining_clients.count(process_of_copy(opts, st, id, copy.address()));
  return lasting;
}

// Whether shard id's chain can grow now: short of --replication once the leavers'
// processes end, and a live process can host another copy.
bool can_grow(const coordinator_options& opts, const coordinator_state& st, std::uint32_t id) {
  const auto& chain = st.shards[id].chain;
  return !st.retired.count(id) && !st.ungrowable.count(id) && !chain.empty() &&
         lasting_copies(opts, st, id) < opts.replication && host_for_copy(opts, st, id);
}

// Chains short of --replication (counting copies in a leaver's process as gone) grow
// back, one copy at a time, in live server processes that hold no copy of the shard yet
// (none left: the chain stays as it is).
void grow_chains(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  if (opts.replication < 2 || st.growing || st.resuming || st.joining || st.ending || !st.view_ready) return;
  for (std::uint32_t id = 0; id < st.shards.size(); ++id)
    if (can_grow(opts, st, id)) return grow_chain(self, opts, id, *host_for_copy(opts, st, id));
}

// The new copy is seeded: it joins the end of the chain (a new epoch), unless the tail
// that seeded it is no longer the tail (it died meanwhile): then it goes, and the chain
// grows again from its tail now.
// asked: when the tail was asked to seed it.
void chain_grown(self_ptr self, const coordinator_options& opts, std::uint32_t id, std::uint32_t position,
                 const caf::actor& tail, const caf::actor& copy, std::chrono::steady_clock::time_point asked,
                 std::function<void()> next) {
  auto& st = self->state;
  st.growing = false;
  auto& chain = st.shards[id].chain;
  if (st.ending || chain.empty() || chain.back() != tail) {
    caf::anon_send_exit(copy, caf::exit_reason::kill);
    return next ? next() : grow_on(self, opts);
  }
  self->monitor(copy);
  const auto process = process_of(opts, id, position);
  st.members[copy.address()] = "copy " + std::to_string(position) + " of shard " + std::to_string(id) +
                               " (grown back in the process of server shard " + std::to_string(process) + ")";
  st.shard_ids[copy.address()] = id;
  st.copy_positions[copy.address()] = position;
  st.copies.push_back(caf::actor_cast<shard_actor>(copy));
  chain.push_back(copy);
  // Workers that joined or ended while it was seeded heard of it through its tail
  // (server_shard's join and leave pass them on to a copy the maps do not name yet).
  ++st.epoch;
  tell_news(opts, "shard " + std::to_string(id) + "'s chain grew to " + std::to_string(chain.size()) +
                    " copies: copy " + std::to_string(position) + " in the process of server shard " +
                    std::to_string(process) + ", seeded by the chain's tail in " + ms_since(asked) + " ms; epoch " +
                    std::to_string(st.epoch));
  if (st.joining) tell_chains(self, opts);  // a joiner's chain: the clients get it with the join's map
  else announce_view(self, opts);
  next ? next() : grow_on(self, opts);
}

// A copy of shard `id` starts in `process` and its chain's tail seeds it (extend_atom).
// A failure is named in the news, and the chains grow on: a process that did not answer
// hosts none from then on, a tail that refused (or whose copy failed its seed) is not
// asked again.
void grow_chain(self_ptr self, const coordinator_options& opts, std::uint32_t id, std::uint32_t process,
                std::function<void()> next) {
  auto& st = self->state;
  st.growing = true;
  const auto attempt = ++st.growth_attempt;
  const auto position = grown_position(opts, process);
  const auto tail = st.shards[id].chain.back();
  auto spawned = std::make_shared<caf::actor>();
  auto failed = [=](const std::string& why) {
    if (self->state.growth_attempt != attempt || !self->state.growing) return;  // given up on already
    self->state.growing = false;
    self->state.growth_abort = nullptr;
    if (*spawned) caf::anon_send_exit(*spawned, caf::exit_reason::kill);
    tell_news(opts, "shard " + std::to_string(id) + "'s chain was not grown: " + why);
    next ? next() : grow_on(self, opts);
  };
  // Its tail dying while it seeds the copy would leave this waiting for the request's
  // timeout: copy_failed gives up on it at once.
  st.growth_tail = tail.address();
  st.growth_abort = failed;
  self->request(st.process_heads[process], std::chrono::seconds(5), host_copy_atom::value,
                make_registration(self, opts, id), position)
    .then(
      [=](caf::actor& copy) {
        if (self->state.growth_attempt != attempt || !self->state.growing) {
          caf::anon_send_exit(copy, caf::exit_reason::kill);
          return;
        }
        *spawned = copy;
        const auto asked = std::chrono::steady_clock::now();
        // A tail with a disk tier sends its rows in pages: about 6 s per million rows here
        // (docs/checkpoints-and-faults.md). A dead tail is given up on at once (growth_abort), a hung one by this.
        self->request(caf::actor_cast<shard_actor>(tail), std::chrono::minutes(30), extend_atom::value, copy)
          .then([=](std::uint64_t) {
                  if (self->state.growth_attempt != attempt || !self->state.growing) return;
                  self->state.growth_abort = nullptr;
                  chain_grown(self, opts, id, position, tail, copy, asked, next);
                },
                [=](caf::error& e) {
                  // A tail that refused (or whose copy failed its seed) is not asked again;
                  // one that died or did not answer is replaced in its chain, which then
                  // grows from it.
                  if (e != caf::sec::request_receiver_down && e != caf::sec::request_timeout &&
                      self->state.growth_attempt == attempt)
                    self->state.ungrowable.insert(id);
                  failed(describe(e));
                });
      },
      [=](caf::error& e) {
        if (self->state.growth_attempt != attempt) return;
        // Its process died (its down message may still be on the way) or does not answer:
        // it hosts no copy from now on, and another may.
        self->state.process_heads.erase(process);
        failed("the process of server shard " + std::to_string(process) + " did not start a copy: " + describe(e));
        grow_chains(self, opts);
      });
}

void ask_again_after_failover(self_ptr self, const coordinator_options& opts, std::uint32_t id);

// A copy of shard `id` died. With a copy left, the chain closes over the gap; with none,
// the shard is recovered from a checkpoint (or the job ends).
void copy_failed(self_ptr self, const coordinator_options& opts, std::uint32_t id, const caf::actor_addr& gone,
                 const std::string& who, const caf::error& reason) {
  auto& st = self->state;
  st.copies.erase(std::remove_if(st.copies.begin(), st.copies.end(), [&](const shard_actor& c) { return c.address() == gone; }),
                  st.copies.end());
  if (st.resuming && !copy_failed_while_resuming(self, id, gone)) return;
  // A growth whose seeding tail this was is given up at once (its request would wait for
  // its timeout), once the chain no longer names it.
  auto give_up = st.growing && st.growth_tail == gone ? std::exchange(st.growth_abort, nullptr) : nullptr;
  const std::string tail_died = "its tail went down while seeding the new copy";
  auto& chain = st.shards[id].chain;
  chain.erase(std::remove_if(chain.begin(), chain.end(), [&](const caf::actor& c) { return c.address() == gone; }),
              chain.end());
  if (opts.replication < 2 || !st.view_ready || chain.empty()) {
    if (give_up) give_up(tail_died);
    return recover_shard(self, opts, id, who, reason);
  }
  ++st.epoch;
  st.shards[id].handle = chain.front();
  st.shards[id].since_epoch = st.epoch;
  st.shard_handles[id] = caf::actor_cast<shard_actor>(chain.front());
  if (give_up) give_up(tail_died);
  tell_news(opts, who + " went down (" + describe(reason) + "); shard " + std::to_string(id) + "'s chain closed over it: " +
    std::to_string(chain.size()) + " cop" + (chain.size() == 1 ? "y" : "ies") + " left, epoch " +
    std::to_string(st.epoch) + "; nothing lost");
  if (!st.change.empty()) {  // the clients get the map once the change is over
    tell_chains(self, opts);
    return ask_again_after_failover(self, opts, id);
  }
  announce_view(self, opts);
  if (auto retry = std::move(st.retry_move)) {  // shards were being asked whether they can move
    st.retry_move = nullptr;
    return retry();
  }
  if (!st.joining) grow_chains(self, opts);  // while shards are asked whether they can move: after that
}

void shard_failed(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                  const caf::error& reason);

// A shard with no copy left died: its recovery reads the newest checkpoint, so a file
// still being written (its parts were all in before the death) is waited for first.
void recover_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                   const caf::error& reason) {
  if (!opts.checkpointer || opts.checkpoint_dir.empty()) return shard_failed(self, opts, id, who, reason);
  self->request(opts.checkpointer, std::chrono::seconds(60), flush_atom::value)
    .then([=](caf::ok_atom) { shard_failed(self, opts, id, who, reason); },
          [=](caf::error&) { shard_failed(self, opts, id, who, reason); });  // recovers from what is there
}

// The newest intact checkpoint in dir laid out for map, or why there is none; read on a
// thread of its own (the file holds the whole model, and rows on a disk tier laid out for
// another map are streamed into new stores), never in a handler.
void read_recovery_source(self_ptr self, const coordinator_options& opts, const partitioner& map, std::uint32_t dead,
                          std::function<void(std::shared_ptr<const recovery_source>)> then) {
  // Rows on a disk tier go to a directory of this recovery's own (two shards that die
  // together are recovered side by side), only the dead shard's.
  auto read = [dir = opts.checkpoint_dir, map, dead](caf::event_based_actor* reader) -> caf::behavior {
    return {[=](restore_atom) {
      auto out = std::make_shared<recovery_source>();
      try {
        auto latest = load_latest(dir);
        out->refused = std::move(latest.refused);
        out->path = latest.path;
        if (!latest.found) {
          out->error = "no checkpoint has been written to " + dir + " yet";
        } else {
          const auto rows_dir = (std::filesystem::path(dir) / disk_rows_dir_name(latest.found->header.clock)).string();
          try {  // written under another map (before shards joined or left): its keys go where they are now
            out->found = laid_out_for(std::move(*latest.found), map, recovery_layout_dir(rows_dir, map.epoch(), dead), dead);
          } catch (const bad_request& e) {
            out->error = latest.path + " cannot be laid out for the current map: " + e.what();
          }
        }
      } catch (const bad_request& e) {
        out->error = std::string("no checkpoint to recover from: ") + e.what();
      }
      reader->quit();
      return std::shared_ptr<const recovery_source>(std::move(out));
    }};
  };
  auto reader = opts.checkpoint_reads_on_scheduler ? self->spawn(read) : self->spawn<caf::detached>(read);
  self->request(reader, caf::infinite, restore_atom::value)
    .then([then](std::shared_ptr<const recovery_source>& source) { then(std::move(source)); },
          [then](caf::error& e) {
            auto failed = std::make_shared<recovery_source>();
            failed->error = "reading the checkpoint failed: " + describe(e);
            then(std::move(failed));
          });
}

void recover_from(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                  const caf::error& reason, const checkpoint& ckpt, const std::string& source);

// A dead shard that cannot be recovered (why): workers stop waiting for a replacement
// that will not come; the job ends.
void unrecoverable(self_ptr self, const coordinator_options& opts, const std::string& who, const caf::error& reason,
                   const std::string& why) {
  end_job(self, opts, errc::job_failed, who + " went down (" + describe(reason) + "); " + why);
}

// A shard died. Without replicas its keys come back from the newest intact checkpoint,
// onto a replacement shard in a live server process; what the checkpoint lacks is reported.
void shard_failed(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                  const caf::error& reason) {
  auto& st = self->state;
  auto fail = [=](const std::string& why) { unrecoverable(self, opts, who, reason, why); };
  if (!st.view_out) return fail("the cluster never formed");
  if (opts.checkpoint_dir.empty())
    return fail("its keys are lost: recovery needs checkpoints (--checkpoint-dir, --checkpoint-every)");
  const auto map = map_of(make_view(self, opts));
  read_recovery_source(self, opts, map, id, [=](std::shared_ptr<const recovery_source> source) {
    if (self->state.ending) return;
    for (const auto& r : source->refused) tell_news(opts, "checkpoint refused: " + r);
    if (!source->error.empty()) return fail(source->error);
    if (self->state.epoch != map.epoch())  // the map changed meanwhile: laid out again for the new one
      return shard_failed(self, opts, id, who, reason);
    recover_from(self, opts, id, who, reason, *source->found, source->path);
  });
}

// The dead shard's section of ckpt (laid out for the current map) onto a replacement.
void recover_from(self_ptr self, const coordinator_options& opts, std::uint32_t id, const std::string& who,
                  const caf::error& reason, const checkpoint& ckpt, const std::string& source) {
  auto& st = self->state;
  auto section = std::find_if(ckpt.shards.begin(), ckpt.shards.end(), [&](const shard_snapshot& s) { return s.shard == id; });
  if (section == ckpt.shards.end())
    return unrecoverable(self, opts, who, reason, source + " has no section for shard " + std::to_string(id));
  // The dead entry stays in the map until the replacement is placed; the epoch moves then
  // (each announced map needs its own epoch: clients ignore one they have seen).
  auto reg = make_registration(self, opts, id, encoded_state(ckpt, id));
  std::vector<std::uint32_t> departed;
  for (std::uint32_t w = 0; w < st.worker_done.size(); ++w)
    if (st.worker_done[w]) departed.push_back(w);
  auto clock = ckpt.header.clock;
  auto placed = [=](shard_actor shard, const std::string& where, std::uint32_t pid) {
    auto& st = self->state;
    ++st.epoch;
    auto handle = caf::actor_cast<caf::actor>(shard);
    st.shards[id] = {id, "", 0, pid, handle, {}, st.epoch};
    if (opts.replication >= 2) st.shards[id].chain = {handle};
    st.shard_handles[id] = shard;
    st.copies.push_back(shard);
    self->monitor(handle);
    st.members[handle.address()] = "replacement shard " + std::to_string(id) + " (in " + where + ")";
    st.shard_ids[handle.address()] = id;
    tell_news(opts, who + " went down (" + describe(reason) + "); its keys were restored from " + source + " (clock " +
      std::to_string(clock) + ") onto a replacement shard in " + where + "; epoch " + std::to_string(st.epoch) +
      ". Updates to those keys from clock " + std::to_string(clock) +
      " on that the workers cannot resend are lost; the replacement reports them per worker.");
    announce_view(self, opts);
  };
  // Here, in the coordinator's process: only when no server process can take it.
  auto place_here = [=](const std::string& why) {
    auto sopts = opts.replacement;
    sopts.replaces = std::make_shared<shard_options::replacement>(shard_options::replacement{reg, clock, departed, source});
    placed(self->spawn(server_shard, caf::actor_cast<coordinator_actor>(self), sopts),
           "the coordinator's process (" + why + ")", static_cast<std::uint32_t>(getpid()));
  };
  // A live server process takes it: the head of the lowest-numbered live shard that is
  // not in the dead shard's process (its other actors die with it, their down messages
  // may still be on the way).
  shard_actor host;
  std::string host_name;
  std::uint32_t host_pid = 0;
  auto dead_pid = st.shards[id].pid;
  for (std::uint32_t i = 0; i < st.shard_handles.size() && !host; ++i) {
    if (i == id || !st.shard_ids.count(st.shard_handles[i].address()) || st.shards[i].pid == dead_pid) continue;
    host = st.shard_handles[i];
    host_name = "the process of server shard " + std::to_string(i) +
                (st.shards[i].host.empty() ? "" : " (" + st.shards[i].host + ", pid " + std::to_string(st.shards[i].pid) + ")");
    host_pid = st.shards[i].pid;
  }
  if (!host) return place_here("no live server left");
  self->request(host, std::chrono::seconds(3), restore_atom::value, reg, clock, departed, source)
    .then([=](caf::actor& shard) { placed(caf::actor_cast<shard_actor>(shard), host_name, host_pid); },
          [=](caf::error& err) { place_here(host_name + " refused: " + describe(err)); });
}

encoded_block encoded_state(const checkpoint& c, std::uint32_t shard) {
  for (const auto& s : c.shards)
    if (s.shard == shard) return snapshot_block(s);
  throw bad_request("the checkpoint has no section for shard " + std::to_string(shard));
}

// A worker joins the running job: every shard copy enters it into its clock vector; it
// starts at the highest of their minimum clocks, so it never reads behind anyone.
caf::result<registration> join_running_job(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                           const node_info& info) {
  auto& st = self->state;
  auto id = st.next_worker++;
  st.worker_done.push_back(false);
  if (sender) {
    self->monitor(sender);
    st.members[sender.address()] = "worker " + std::to_string(id) + " (joined, pid " + std::to_string(info.pid) + ")";
    st.worker_ids[sender.address()] = id;
    st.worker_handles.push_back(caf::actor_cast<worker_actor>(sender));
  }
  auto rp = self->make_response_promise<registration>();
  auto start = std::make_shared<std::uint64_t>(0);
  auto remaining = std::make_shared<std::size_t>(st.copies.size());
  auto answer = [=]() mutable {
    if (--*remaining > 0) return;
    tell_news(opts, "worker " + std::to_string(id) + " joined at clock " + std::to_string(*start) + " (pid " +
      std::to_string(info.pid) + "); " + std::to_string(self->state.worker_done.size() - self->state.finished_workers) +
      " workers now");
    auto reg = make_registration(self, opts, id, {}, *start);
    rp.deliver(std::move(reg));
    tell_members(self);
    persist(self, opts);
  };
  for (auto& copy : st.copies)
    self->request(copy, std::chrono::seconds(10), join_atom::value, id)
      .then([=](std::uint64_t min) mutable { *start = std::max(*start, min); answer(); },
            [=](caf::error&) mutable { answer(); });  // a dead copy: its failover carries the vector on
  return rp;
}

std::chrono::milliseconds checkpoint_period(const coordinator_options& opts) {
  return std::max(std::chrono::milliseconds(1), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  std::chrono::duration<double>(opts.checkpoint_seconds)));
}

// A member went down: a shard copy fails over, a worker leaves the clock vector.
void member_down(self_ptr self, const coordinator_options& opts, const caf::down_msg& dm) {
  auto& st = self->state;
  auto it = st.members.find(dm.source);
  if (it == st.members.end()) return;
  auto who = it->second;
  st.members.erase(it);
  if (st.ending) return;  // members end with the job: no failover, no news
  for (auto p = st.process_heads.begin(); p != st.process_heads.end(); ++p)
    if (p->second.address() == dm.source) {
      st.process_heads.erase(p);
      break;
    }
  if (auto s = st.shard_ids.find(dm.source); s != st.shard_ids.end()) {
    auto id = s->second;
    st.shard_ids.erase(s);
    copy_failed(self, opts, id, dm.source, who, dm.reason);
    return;
  }
  auto w = st.worker_ids.find(dm.source);
  if (w == st.worker_ids.end() || st.worker_done[w->second]) return;  // left after finishing
  // A dead worker leaves the clock vector; the others go on without it.
  tell_news(opts, who + " went down (" + describe(dm.reason) + "); it leaves the clock vector, the others go on");
  worker_finished(self, opts, w->second);
}

// Every head takes `boundary` unless its minimum clock passed it while it was picked (the
// workers run on): then a boundary above the highest such minimum is proposed again, at
// most `attempts` times. The parts of a boundary some head refused never complete: the
// checkpointer drops them once a later file completes.
void propose_cut(self_ptr self, std::vector<shard_actor> heads, std::uint64_t boundary, int attempts,
                 std::function<void(std::uint64_t)> cut, std::function<void(std::string)> failed) {
  auto answered = [=](std::vector<std::uint64_t> passed) {  // 0: taken, else that head's minimum
    if (std::find(passed.begin(), passed.end(), left_clock) != passed.end())
      return failed("coordinator: no checkpoint: a shard has no worker left");
    auto highest = *std::max_element(passed.begin(), passed.end());
    if (highest == 0) return cut(boundary);
    if (attempts <= 1)
      return failed("coordinator: no checkpoint: the workers kept passing the boundary (last proposed: clock " +
                    std::to_string(boundary) + ")");
    propose_cut(self, heads, highest + 2, attempts - 1, cut, failed);
  };
  ask_heads(self, heads, "take the boundary", answered,
            [=](const std::string& why) { failed("coordinator: no checkpoint: " + why); }, cut_atom::value, boundary);
}

// A checkpoint one clock boundary above every head's minimum, so each shard's part holds
// the same clocks (exactly, under BSP): cut(boundary) once every head took it, or
// failed(why) when a head did not answer (that round's file could not complete).
void cut_checkpoint(self_ptr self, std::function<void(std::uint64_t)> cut, std::function<void(std::string)> failed) {
  if (self->state.joining) return failed("coordinator: no checkpoint while a shard joins or leaves; try again once it has");
  auto heads = live_heads(self->state);
  if (heads.empty()) return failed("coordinator: no checkpoint: no shard yet");
  auto with_minimums = [=](std::vector<std::uint64_t> mins) {
    std::uint64_t highest = 0;
    for (auto m : mins)
      if (m != left_clock) highest = std::max(highest, m);
    propose_cut(self, heads, highest + 1, 5, cut, failed);
  };
  ask_heads(self, heads, "say its clock", with_minimums,
            [=](const std::string& why) { failed("coordinator: no checkpoint: " + why); }, min_clock_atom::value);
}

// Time-based checkpoints (--checkpoint-seconds).
void checkpoint_round(self_ptr self, const coordinator_options& opts) {
  self->delayed_send(self, checkpoint_period(opts), checkpoint_atom::value);
  if (!self->state.view_ready) return;
  cut_checkpoint(self, [](std::uint64_t) {}, [=](std::string why) { tell_news(opts, why); });
}

// While the job has not every member it was started for: who is there, who is awaited.
void report_waiting(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  const std::size_t servers = st.shards.size(), workers = st.next_worker;
  if (st.ending || (servers >= opts.servers && workers >= opts.workers)) return;  // formed: no more reports
  std::string have;
  for (const auto& [addr, who] : st.members) have += (have.empty() ? "" : ", ") + who;
  auto missing = [](std::size_t want, std::size_t got, const char* what) {
    return std::to_string(want - std::min(want, got)) + " of " + std::to_string(want) + " " + what;
  };
  tell_news(opts, "coordinator: still waiting for " + missing(opts.servers, servers, "servers") + " and " +
                    missing(opts.workers, workers, "workers") + "; registered: " + (have.empty() ? "none" : have));
  self->delayed_send(self, opts.wait_report, wait_report_atom::value);
}

// psctl checkpoint: one now, at the next boundary.
caf::result<std::uint64_t> checkpoint_now(self_ptr self, const coordinator_options& opts) {
  if (!opts.checkpointer)
    return make_ps_error("coordinator: this job writes no checkpoints (start it with --checkpoint-dir=DIR)");
  if (!self->state.view_ready || self->state.ending)
    return make_ps_error(std::string("coordinator: no checkpoint: the job ") +
                         (self->state.ending ? "is ending" : "has not formed yet"));
  auto rp = self->make_response_promise<std::uint64_t>();
  cut_checkpoint(self, [=](std::uint64_t boundary) mutable { rp.deliver(boundary); },
                 [=](std::string why) mutable { rp.deliver(make_ps_error(why)); });
  return rp;
}

// psctl status: what the coordinator knows of its members, and each shard's own figures.
caf::result<std::string> cluster_status(self_ptr self) {
  auto& st = self->state;
  auto shards = std::make_shared<std::vector<status_shard>>();
  std::vector<shard_actor> heads;
  for (const auto& e : st.shards) {
    if (st.retired.count(e.id)) continue;
    shards->push_back({e.id, e.host.empty() ? "in the coordinator's process" : e.host + ":" + std::to_string(e.port),
                       e.pid, "", "", static_cast<std::uint32_t>(std::max<std::size_t>(e.chain.size(), 1))});
    heads.push_back(st.shard_handles[e.id]);
  }
  std::vector<status_worker> workers;
  for (std::uint32_t w = 0; w < st.worker_done.size(); ++w) workers.push_back({w, "", st.worker_done[w]});
  for (const auto& [addr, id] : st.worker_ids)
    if (auto m = st.members.find(addr); m != st.members.end()) workers[id].member = m->second;
  const std::string job = st.ending ? "ending" : st.resuming ? "resuming" : st.view_ready ? "running" : "forming";
  const auto epoch = st.epoch;
  auto rp = self->make_response_promise<std::string>();
  auto remaining = std::make_shared<std::size_t>(heads.size());
  auto finish = [=]() mutable {
    try {
      rp.deliver(status_json(epoch, job, *shards, workers));
    } catch (const bad_request& e) {
      rp.deliver(make_ps_error(e.what()));
    }
  };
  if (*remaining == 0) finish();
  for (std::size_t i = 0; i < heads.size(); ++i)
    self->request(heads[i], std::chrono::seconds(5), stats_atom::value)
      .then(
        [=](std::string& text) mutable {
          (*shards)[i].stats = std::move(text);
          if (--*remaining == 0) finish();
        },
        [=](caf::error& e) mutable {
          (*shards)[i].error = describe(e);
          if (--*remaining == 0) finish();
        });
  return rp;
}

// A copy of a shard further down its chain; once every chain is complete the map is
// announced (heads first) and the parked workers get theirs.
caf::result<registration> register_replica(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                           const node_info& info) {
  auto& st = self->state;
  if (opts.replication < 2 || info.shard >= opts.servers || info.position == 0 || info.position >= opts.replication ||
      !sender || st.view_ready)
    return make_ps_error("coordinator: unexpected replica (shard " + std::to_string(info.shard) + ", position " +
                         std::to_string(info.position) + ")");
  self->monitor(sender);
  st.members[sender.address()] = "copy " + std::to_string(info.position) + " of shard " + std::to_string(info.shard) +
                                 " (pid " + std::to_string(info.pid) + ")";
  st.shard_ids[sender.address()] = info.shard;
  st.copy_positions[sender.address()] = info.position;
  st.copies.push_back(caf::actor_cast<shard_actor>(sender));
  auto& chain = st.shards[info.shard].chain;
  if (chain.size() <= info.position) chain.resize(info.position + 1);
  chain[info.position] = sender;
  auto reg = make_registration(self, opts, info.shard);
  if (opts.restore) reg.state = encoded_state(*opts.restore, info.shard);
  if (++st.replicas_registered == opts.servers * (opts.replication - 1)) {
    // Every chain is complete: heads first, then the copies in order.
    for (std::uint32_t i = 0; i < opts.servers; ++i)
      st.shards[i].chain[0] = caf::actor_cast<caf::actor>(st.shard_handles[i]);
    st.view_ready = true;
    announce_view(self, opts, [=] { deliver_waiting(self, opts, false); });
  }
  return reg;
}

// A server or worker of the job's start waits for the map (and chains); once every
// server is in, the map goes out.
// `who` names the member in later news; `where` adds its address to the registration's.
caf::result<registration> park_registration(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                            std::uint32_t id, const std::string& who, bool server,
                                            const std::string& where = "") {
  auto& st = self->state;
  if (sender) {
    self->monitor(sender);
    st.members[sender.address()] = who;
  }
  tell_news(opts, "coordinator: " + who + where + " registered (" + std::to_string(st.shards.size()) + " of " +
                    std::to_string(opts.servers) + " servers, " + std::to_string(st.next_worker) + " of " +
                    std::to_string(opts.workers) + " workers)");
  auto rp = self->make_response_promise<registration>();
  st.waiting.push_back({rp, id, server});
  if (st.shards.size() == opts.servers) {  // the map is complete: hand it out
    st.view_out = true;
    if (opts.replication < 2) st.view_ready = true;
    // With chains, servers first: each then starts the copies it keeps, and workers
    // wait until every chain is complete.
    deliver_waiting(self, opts, !st.view_ready);
  }
  persist(self, opts);
  return rp;
}

// The answer (or failure, why) to ask `attempt` of shard id's handoff in round r; one
// asked again since is no longer waited for.
void handoff_answered(self_ptr self, const std::shared_ptr<handover_round>& r, std::uint32_t id, std::uint64_t attempt,
                      const std::string& why) {
  auto it = r->pending.find(id);
  if (it == r->pending.end() || it->second != attempt) return;
  r->pending.erase(it);
  if (!why.empty()) r->failed = "shard " + std::to_string(id) + ": " + why;
  if (!r->pending.empty()) return;
  if (self->state.handover == r) self->state.handover.reset();
  r->done(r->failed);
}

// Asks shard id's head of the moment for its part of round r: the change's map, with the
// heads and chains as they are now (a chain may have closed since the change began).
void ask_for_handoff(self_ptr self, const coordinator_options& opts, const std::shared_ptr<handover_round>& r,
                     std::uint32_t id) {
  auto& st = self->state;
  auto attempt = ++r->pending[id];
  auto view = make_view(self, opts);
  view.epoch = r->epoch;
  auto head = st.shard_handles[id];
  self->request(head, std::chrono::seconds(120), handoff_atom::value, view)
    .then([=](std::uint64_t) { handoff_answered(self, r, id, attempt, ""); },
          [=](caf::error& e) {
            // A head that died: with chains it is asked again once its chain has closed
            // (copy_failed, or now if that came first).
            if (opts.replication >= 2 && e == caf::sec::request_receiver_down) {
              if (self->state.shard_handles[id] != head && r->pending.count(id) && r->pending[id] == attempt)
                ask_for_handoff(self, opts, r, id);
              return;
            }
            handoff_answered(self, r, id, attempt, describe(e));
          });
}

// The shards `ids` hand over what the change's map (view) moves; done(why) once all
// answered (why: empty when every one could).
void hand_over(self_ptr self, const coordinator_options& opts, const std::vector<std::uint32_t>& ids,
               const cluster_view& view, std::function<void(std::string)> done) {
  if (ids.empty()) return done("");
  auto r = std::make_shared<handover_round>();
  r->epoch = view.epoch;
  r->done = std::move(done);
  self->state.handover = r;
  for (auto id : ids) ask_for_handoff(self, opts, r, id);
}

// A chain closed during a map change: a head that had not answered its handoff yet is
// asked again through the new head.
void ask_again_after_failover(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto r = self->state.handover;
  if (r && r->pending.count(id)) ask_for_handoff(self, opts, r, id);
}

// A fraction with three decimals, for news.
std::string fraction_text(double f) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", f);
  return text;
}

// Milliseconds since `start`, for news.
// A map change begins: saved with the new map, so a coordinator resumed before it ends
// finishes it (finish_change).
void begin_change(self_ptr self, const coordinator_options& opts, const std::string& kind, std::uint32_t shard) {
  auto& st = self->state;
  st.joining = true;
  st.change = kind;
  st.change_shard = shard;
  st.change_epoch = st.epoch;
  persist(self, opts);
}

// The map change is over (its map is saved with the announcement that follows).
void end_change(self_ptr self) {
  self->state.joining = false;
  self->state.change.clear();
}

// Why the map cannot change now (empty: it can).
std::string map_change_refusal(const coordinator_state& st) {
  if (st.resuming) return "the coordinator is resuming the job; try again once its members are back";
  if (st.joining || st.after_growth) return "another shard is joining or leaving; try again once it has";
  if (st.ending) return "the job is ending";
  if (!st.view_ready) return "the job has not formed yet";
  return {};
}

// Before a map change: every shard must answer (a shard that cannot would leave its part
// of the handoffs undone). go() once each answered, else refused(why). The map change
// is reserved meanwhile (another is refused). With chains, a head that died is asked
// again through its chain's new head, once the chain has closed (copy_failed).
void when_shards_can_move(self_ptr self, const coordinator_options& opts, std::function<void()> go,
                          std::function<void(std::string)> refused) {
  if (self->state.growing) {  // a copy seeded under the old map must not join its chain under the new one
    self->state.after_growth = [=] { when_shards_can_move(self, opts, go, refused); };
    return;
  }
  auto heads = live_heads(self->state);
  self->state.joining = true;
  auto dead = std::make_shared<std::vector<shard_actor>>();  // heads that bounced the question
  auto settle = [=](std::string why) {
    auto& st = self->state;
    st.joining = false;
    if (why.empty()) return go();
    auto again = [=] { when_shards_can_move(self, opts, go, refused); };
    if (opts.replication >= 2 && !dead->empty()) {
      const auto live = live_heads(st);
      bool replaced = std::none_of(dead->begin(), dead->end(), [&](const shard_actor& h) {
        return std::find(live.begin(), live.end(), h) != live.end();
      });
      st.joining = true;  // still reserved
      if (replaced) return again();
      st.retry_move = again;  // once the chain closed over it
      return;
    }
    grow_chains(self, opts);  // over copies that died meanwhile
    refused(why);
  };
  auto remaining = std::make_shared<std::size_t>(heads.size());
  auto failed = std::make_shared<std::string>();
  if (heads.empty()) return settle("");
  for (std::size_t i = 0; i < heads.size(); ++i)
    self->request(heads[i], std::chrono::seconds(5), min_clock_atom::value)  // the cheapest question
      .then([=](std::uint64_t) {
              if (--*remaining == 0) settle(*failed);
            },
            [=](caf::error& e) {
              *failed = "a shard did not answer before the map change (" + describe(e) + ")";
              if (e == caf::sec::request_receiver_down) dead->push_back(heads[i]);
              if (--*remaining == 0) settle(*failed);
            });
}

// With chains of copies, a joiner's chain is built before anything moves to it: copies in
// other processes seeded by it (it holds nothing yet), as chains grow back; then(). When
// no process can host another copy (or one refused), it goes on with the copies it has.
void build_joiner_chain(self_ptr self, const coordinator_options& opts, std::uint32_t id, std::function<void()> then) {
  auto& st = self->state;
  const auto& chain = st.shards[id].chain;
  if (opts.replication < 2 || chain.empty() || chain.size() >= opts.replication) return then();
  auto host = st.ungrowable.count(id) ? std::nullopt : host_for_copy(opts, st, id);
  if (!host) {
    tell_news(opts, "server shard " + std::to_string(id) + " joins with " + std::to_string(chain.size()) + " of " +
                      std::to_string(opts.replication) + " copies: no other live server process can hold one");
    return then();
  }
  grow_chain(self, opts, id, *host, [=] { build_joiner_chain(self, opts, id, then); });
}

// The joiner has the map (and, with chains, its copies): the givers hand it what the map
// moves; the clients get the map once it has all of it.
void hand_to_joiner(self_ptr self, const coordinator_options& opts, const std::string& who,
                    std::vector<std::uint32_t> givers, cluster_view view, double moved) {
  auto started = std::chrono::steady_clock::now();
  hand_over(self, opts, givers, view, [=](std::string failed) {
    if (!failed.empty()) return end_job(self, opts, errc::job_failed, who + " could not join: " + failed);
    end_change(self);
    tell_news(opts, "coordinator: " + who + " joined; its keys and rows were handed over in " + ms_since(started) +
                      " ms (" + fraction_text(moved) + " of the dense keys moved); epoch " + std::to_string(view.epoch) +
                      ", " + std::to_string(self->state.shards.size() - self->state.retired.size()) + " shards now");
    announce_view(self, opts);
    grow_chains(self, opts);  // over copies that died while it joined
  });
}

// A server registers while the job runs: it joins as a new shard. The ring gives it
// about 1/(n+1) of the keys and rows; it gets its registration (the new map) first, then
// the old shards hand it what moved, and only then do the clients learn the map.
// The join itself: the new map, the newcomer's registration (rp), then the handoffs.
void admit_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender, const node_info& info,
                 caf::typed_response_promise<registration> rp) {
  auto& st = self->state;
  partitioner next = map_of(make_view(self, opts));
  auto id = static_cast<std::uint32_t>(st.shards.size());
  try {
    next = next.with_shard(id);
  } catch (const bad_request& e) {
    rp.deliver(make_error(errc::refused, std::string("coordinator: a server cannot join this job: ") + e.what()));
    return;
  }
  auto givers = live_ids(st);
  auto old_placement = st.placement;
  auto moved = moved_key_fraction(map_of(make_view(self, opts)), next, dense_ranges(opts.spec));
  st.epoch = next.epoch();
  st.placement = next.placement();
  st.shards.push_back({id, info.host, info.port, info.pid, sender, {}, st.epoch});
  if (opts.replication >= 2) st.shards.back().chain = {sender};
  auto shard = caf::actor_cast<shard_actor>(sender);
  st.shard_handles.push_back(shard);
  st.process_heads[id] = shard;
  st.copies.push_back(shard);
  st.shard_ids[sender.address()] = id;
  self->monitor(sender);
  auto who = "server shard " + std::to_string(id) +
             (info.host.empty() ? "" : " (" + info.host + ":" + std::to_string(info.port) + ", pid " +
                                         std::to_string(info.pid) + ")");
  st.members[sender.address()] = who + " (joined)";
  begin_change(self, opts, "join", id);
  auto view = make_view(self, opts);
  tell_checkpointer(opts, view);  // before any shard takes parts under the new map
  tell_map_change(opts, true);
  rp.deliver(make_registration(self, opts, id));
  // Behind its registration (one sender, one order): once it has the map, the handoffs.
  self->request(shard, std::chrono::seconds(10), view_atom::value, view)
    .then([=](std::uint64_t) {
            build_joiner_chain(self, opts, id, [=] { hand_to_joiner(self, opts, who, givers, view, moved); });
          },
          [=](caf::error& e) {  // nothing moved yet: the job goes on without it
            auto& st = self->state;
            end_change(self);
            st.retired.insert(id);
            st.process_heads.erase(id);
            st.placement = old_placement;
            st.copies.erase(std::remove(st.copies.begin(), st.copies.end(), shard), st.copies.end());
            st.shard_ids.erase(shard.address());
            st.members.erase(shard.address());
            tell_map_change(opts, false);
            tell_news(opts, "coordinator: " + who + " did not take the map (" + describe(e) + "); the job goes on without it");
            persist(self, opts);
          });
}


caf::result<registration> join_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                     const node_info& info) {
  auto refuse = [](const std::string& why) {
    return make_error(errc::refused, "coordinator: a server cannot join this job: " + why);
  };
  if (auto why = map_change_refusal(self->state); !why.empty()) return refuse(why);
  if (!sender) return refuse("the registration came without a handle");
  auto rp = self->make_response_promise<registration>();
  when_shards_can_move(
    self, opts, [=]() mutable { admit_shard(self, opts, sender, info, rp); },
    [=](std::string why) mutable { rp.deliver(refuse(why)); });
  return rp;
}

std::optional<std::string> last_copy_in_process(const coordinator_options& opts, const coordinator_state& st,
                                                std::uint32_t process);

// Why a leaver's process must not end yet (nullopt: it may): it holds a copy of another
// shard whose chain would be left short of --replication, and another process can take
// one (that chain grows there first; chain_grown asks again).
std::optional<std::string> rehoming_needed(const coordinator_options& opts, const coordinator_state& st,
                                           std::uint32_t process) {
  if (opts.replication < 2) return std::nullopt;
  for (std::uint32_t other = 0; other < st.shards.size(); ++other) {
    if (other != process && can_grow(opts, st, other) && copies_in_process(opts, st, other, process) > 0)
      return "its process holds a copy of shard " + std::to_string(other) + ", whose chain grows elsewhere first";
  }
  return std::nullopt;
}

// A shard that left the map stops once no running worker's client needs it (each says
// so, or finishes): normally, so its process exits 0. Not while its process holds a copy
// another process should take first (rehoming_needed).
void stop_if_drained(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto& st = self->state;
  auto it = st.draining_clients.find(id);
  if (it == st.draining_clients.end() || !it->second.empty()) return;
  auto why = last_copy_in_process(opts, st, id);  // kept however long it takes: else the keys are lost
  if (!why) why = rehoming_needed(opts, st, id);
  if (why) {
    if (st.leavers_held.insert(id).second)
      tell_news(opts, "coordinator: shard " + std::to_string(id) + " has left but does not stop yet: " + *why);
    return grow_chains(self, opts);
  }
  st.leavers_held.erase(id);
  st.draining_clients.erase(it);
  stop_leavers_copies(self, id);
  self->request(st.shard_handles[id], std::chrono::seconds(5), stop_atom::value, std::uint8_t{0},
                std::string("removed from the job (psctl remove-shard)"))
    .then([](caf::ok_atom) {}, [](caf::error&) {});
}

// psctl remove-shard: the remaining shards take the new map first (they gain the
// leaver's keys and rows), then the leaver hands everything over; then the map goes out.
void drain_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id,
                 caf::typed_response_promise<std::string> rp);

// The copies a server process holds end with it (ends_with): why it cannot end when one
// of them is the last of its shard (nullopt: it can).
std::optional<std::string> last_copy_in_process(const coordinator_options& opts, const coordinator_state& st,
                                                std::uint32_t process) {
  if (opts.replication < 2) return std::nullopt;
  for (std::uint32_t other = 0; other < st.shards.size(); ++other) {
    if (other == process || st.retired.count(other)) continue;
    const auto here = copies_in_process(opts, st, other, process);
    if (here > 0 && here == st.shards[other].chain.size())
      return "its process holds the last copy of shard " + std::to_string(other) +
             " (the other copies died); add a server or wait until that chain grew back";
  }
  return std::nullopt;
}

// Why shard id cannot leave because of the copies its process holds (nullopt: it can);
// a process whose first shard is no longer that shard's head has ended.
std::optional<std::string> leaver_holds_last_copy(const coordinator_options& opts, const coordinator_state& st,
                                                  std::uint32_t id) {
  auto head = st.process_heads.find(id);
  if (head == st.process_heads.end() || head->second != st.shard_handles[id]) return std::nullopt;
  return last_copy_in_process(opts, st, id);
}

caf::result<std::string> remove_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id) {
  auto& st = self->state;
  auto refuse = [id](const std::string& why) {  // by value: it may answer after this handler
    return make_error(errc::refused, "coordinator: shard " + std::to_string(id) + " cannot leave: " + why);
  };
  if (auto why = map_change_refusal(st); !why.empty()) return refuse(why);
  if (id >= st.shards.size() || st.retired.count(id)) return refuse("there is no such shard in the map");
  if (st.shards.size() - st.retired.size() < 2) return refuse("it is the last shard");
  if (auto last = leaver_holds_last_copy(opts, st, id)) return refuse(*last);
  auto rp = self->make_response_promise<std::string>();
  when_shards_can_move(
    self, opts, [=]() mutable { drain_shard(self, opts, id, rp); }, [=](std::string why) mutable { rp.deliver(refuse(why)); });
  return rp;
}

// A copy leaves the membership: its end is no failure, and it gets no more news.
void forget_copy(coordinator_state& st, const caf::actor_addr& copy) {
  st.copies.erase(std::remove_if(st.copies.begin(), st.copies.end(), [&](const shard_actor& c) { return c.address() == copy; }),
                  st.copies.end());
  st.shard_ids.erase(copy);
  st.copy_positions.erase(copy);
  st.members.erase(copy);
}

// The copies further down a leaver's chain hold nothing the map gives them (they dropped
// it as the leaver handed it over): they stop with it, once the clients drained it.
void stop_leavers_copies(self_ptr self, std::uint32_t id) {
  auto& st = self->state;
  for (const auto& copy : st.leavers_copies[id])
    self->request(caf::actor_cast<shard_actor>(copy), std::chrono::seconds(5), stop_atom::value, std::uint8_t{0},
                  std::string("its shard left the job (psctl remove-shard)"))
      .then([](caf::ok_atom) {}, [](caf::error&) {});
  st.leavers_copies.erase(id);
}

// A leaver has handed everything over: it leaves the membership (its end is no failure,
// and it gets no more news) and stops once no running worker's client needs it.
void let_leaver_go(self_ptr self, std::uint32_t id) {
  auto& st = self->state;
  end_change(self);
  auto leaver = st.shard_handles[id];
  auto& chain = st.shards[id].chain;
  for (std::size_t i = 1; i < chain.size(); ++i) {
    forget_copy(st, chain[i].address());
    st.leavers_copies[id].push_back(chain[i]);
  }
  if (chain.size() > 1) chain.resize(1);
  forget_copy(st, leaver.address());
  if (auto p = st.process_heads.find(id); p != st.process_heads.end() && p->second == leaver)
    st.process_heads.erase(p);  // its process ends with it: it hosts no copy from now on
  auto& waiting = st.draining_clients[id];
  for (const auto& [addr, worker] : st.subscriber_workers)
    if (worker < st.worker_done.size() && !st.worker_done[worker]) waiting.insert(worker);
}

// The removal itself (remove_shard checked it can be done): answered through rp.
void drain_shard(self_ptr self, const coordinator_options& opts, std::uint32_t id,
                 caf::typed_response_promise<std::string> rp) {
  auto& st = self->state;
  auto before = map_of(make_view(self, opts));
  partitioner next = before.without_shard(id);
  auto moved = moved_key_fraction(before, next, dense_ranges(opts.spec));
  st.epoch = next.epoch();
  st.placement = next.placement();
  st.retired.insert(id);
  begin_change(self, opts, "leave", id);
  auto remaining_shards = live_ids(st);
  auto view = make_view(self, opts);
  tell_checkpointer(opts, view);  // before any shard takes parts under the new map
  tell_map_change(opts, true);
  auto started = std::chrono::steady_clock::now();
  auto who = "shard " + std::to_string(id);
  auto failed = [=](const std::string& why) mutable {
    end_change(self);
    rp.deliver(make_ps_error("coordinator: " + who + " could not leave: " + why));
    end_job(self, opts, errc::job_failed, who + " could not leave: " + why);
  };
  hand_over(self, opts, remaining_shards, view, [=](std::string why) mutable {
    if (!why.empty()) return failed(why);
    hand_over(self, opts, {id}, view, [=](std::string why) mutable {
      if (!why.empty()) return failed(why);
      auto& st = self->state;
      let_leaver_go(self, id);
      auto text = who + " left; its keys and rows were handed over in " + ms_since(started) + " ms (" +
                  fraction_text(moved) + " of the dense keys moved); epoch " +
                  std::to_string(view.epoch) + ", " + std::to_string(st.shards.size() - st.retired.size()) +
                  " shards now";
      tell_news(opts, "coordinator: " + text);
      announce_view(self, opts, [=]() mutable {
        rp.deliver(text);
        stop_if_drained(self, opts, id);
      });
      grow_chains(self, opts);  // over copies that died while it left
    });
  });
}

caf::result<registration> register_server(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                          const node_info& info) {
  auto& st = self->state;
  if (st.shards.size() >= opts.servers) {
    if (!st.view_ready)
      return make_ps_error("coordinator: all " + std::to_string(opts.servers) +
                           " servers have registered already; join once the job runs");
    return join_shard(self, opts, sender, info);
  }
  auto id = static_cast<std::uint32_t>(st.shards.size());
  st.shards.push_back({id, info.host, info.port, info.pid, info.handle, {}, 1});
  st.shard_handles.push_back(caf::actor_cast<shard_actor>(sender));
  st.copies.push_back(caf::actor_cast<shard_actor>(sender));
  st.process_heads[id] = caf::actor_cast<shard_actor>(sender);
  st.shard_ids[sender.address()] = id;
  auto who = "server shard " + std::to_string(id) +
             (info.host.empty() ? "" : " (" + info.host + ":" + std::to_string(info.port) + ", pid " +
                                         std::to_string(info.pid) + ")");
  return park_registration(self, opts, sender, id, who, true);
}

caf::result<registration> register_worker(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                          const node_info& info) {
  auto& st = self->state;
  if (st.next_worker >= opts.workers) {
    if (!st.view_ready)
      return make_ps_error("coordinator: all " + std::to_string(opts.workers) +
                           " workers have registered already; join once the job runs");
    return join_running_job(self, opts, sender, info);
  }
  auto id = st.next_worker++;
  st.worker_ids[sender.address()] = id;
  if (sender) st.worker_handles.push_back(caf::actor_cast<worker_actor>(sender));
  auto where = info.host.empty() ? "" : " (" + info.host + ", pid " + std::to_string(info.pid) + ")";
  return park_registration(self, opts, sender, id, "worker " + std::to_string(id), false, where);
}

// A member registers: refused when its version or given settings differ from the job's
// (before the job has all its members that ends the job: it would wait forever).
caf::result<registration> register_member(self_ptr self, const coordinator_options& opts, const node_info& info) {
  auto& st = self->state;
  if (st.ending) return st.end_reason ? st.end_reason : make_ps_error("coordinator: the job has ended");
  if (auto why = refusal(opts, info); !why.empty()) {
    auto text = "the coordinator refused " + member_name(info) + ": " + why;
    auto rp = self->make_response_promise<registration>();
    rp.deliver(make_error(errc::refused, text));
    if (!st.view_ready || st.next_worker < opts.workers) end_job(self, opts, errc::job_failed, text);
    return rp;
  }
  if (st.resuming)
    return make_error(errc::refused, "coordinator: " + member_name(info) + " cannot register while the coordinator "
                                     "resumes the job; register again once its members are back");
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (info.role == "server") return register_server(self, opts, sender, info);
  if (info.role == "worker") return register_worker(self, opts, sender, info);
  if (info.role == "replica") return register_replica(self, opts, sender, info);
  return make_ps_error("coordinator: unknown role \"" + info.role + "\"");
}

// ---- a resumed job (--resume) ------------------------------------------------------

// Whether shard `id` was leaving when the coordinator died: out of the map, yet holding
// keys it has not handed over, so it must come back.
bool leaving_now(const coordinator_state& st, std::uint32_t id) { return st.change == "leave" && st.change_shard == id; }

// The chain of shard `id` in a resumed job's saved order: its copies by the place they
// were started at (a job without chains: its one copy at 0).
std::vector<std::uint32_t> saved_chain(const coordinator_options& opts, std::uint32_t id) {
  if (!opts.resume || id >= opts.resume->shards.size() || opts.resume->shards[id].chain.empty()) return {0};
  return opts.resume->shards[id].chain;
}

// The copies that came back take their places: each shard's chain in its saved order,
// closed over those that did not, and its head.
void assemble_chains(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  for (auto& [id, back] : st.rejoined_copies) {
    std::vector<caf::actor> chain;
    for (auto position : saved_chain(opts, id))
      if (auto copy = back.find(position); copy != back.end()) chain.push_back(copy->second);
    if (chain.empty()) continue;
    st.shard_handles[id] = caf::actor_cast<shard_actor>(chain.front());
    st.shards[id].since_epoch = st.epoch + 1;  // the map that announces it (clients take newer entries only)
    if (opts.replication >= 2) {
      st.shards[id].handle = chain.front();
      st.shards[id].chain = std::move(chain);
    }
  }
  st.rejoined_copies.clear();
}

void finish_change(self_ptr self, const coordinator_options& opts);
void go_on_resumed(self_ptr self, const coordinator_options& opts);

// Every member is back (or given up): a map change that was under way is finished, then
// the job goes on.
void finish_resume(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  if (!st.resuming || !st.absent_copies.empty() || !st.absent_workers.empty()) return;
  assemble_chains(self, opts);
  if (!st.change.empty()) return finish_change(self, opts);
  go_on_resumed(self, opts);
}

// A map change was under way when the coordinator died: its shards are asked for their
// handoffs again under the saved (new) map, in the order the change asks them; those that
// had made theirs answer once it is complete. A leaver then goes, as it would have.
void finish_change(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  auto view = make_view(self, opts);
  view.epoch = std::min(view.epoch, st.change_epoch);  // the change's own map (chains may have closed since)
  const bool leaving = st.change == "leave";
  const auto id = st.change_shard;
  const auto what = std::string(leaving ? "shard " : "server shard ") + std::to_string(id) + (leaving ? " leaving" : " joining");
  tell_news(opts, "coordinator: " + what + " was under way when the coordinator went down; finishing its handoffs (epoch " +
                    std::to_string(view.epoch) + ")");
  auto failed = [=](const std::string& why) {
    end_job(self, opts, errc::job_failed, what + " could not be finished after the coordinator's restart: " + why);
  };
  auto done = [=] {
    if (leaving) let_leaver_go(self, id);
    else end_change(self);
    tell_news(opts, "coordinator: " + what + ": done");
    go_on_resumed(self, opts);
    if (leaving) stop_if_drained(self, opts, id);
  };
  tell_map_change(opts, true);
  // The chains as they were assembled (copies that did not come back left them): a copy
  // waiting on a dead successor would hold its head's takeovers, and so the change.
  tell_chains(self, opts);
  hand_over(self, opts, live_ids(st), view, [=](const std::string& why) {
    if (!why.empty()) return failed(why);
    if (!leaving) return done();
    hand_over(self, opts, {id}, view, [=](const std::string& why) {
      if (!why.empty()) return failed(why);
      done();
    });
  });
}

// The resumed job goes on under a new epoch, whose map names this coordinator's
// checkpointer, and is saved again.
void go_on_resumed(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  st.resuming = false;
  ++st.epoch;
  tell_news(opts, "coordinator: resumed the job: " + std::to_string(live_heads(st).size()) + " shards" +
                    (opts.replication >= 2 ? " (" + std::to_string(st.copies.size()) + " copies)" : "") + " and " +
                    std::to_string(st.worker_done.size() - st.finished_workers) + " running workers are back; epoch " +
                    std::to_string(st.epoch));
  tell_members(self);
  announce_view(self, opts);
  go_on(self, opts);
  grow_chains(self, opts);  // over copies that did not come back
}

// Takes over the dead coordinator's job from its saved state: the map as it was, the
// shards without handles until they rejoin, the finished workers' results (the observer
// hears them again), the barriers released.
void resume_job(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  const auto& r = *opts.resume;
  st.epoch = r.epoch;
  st.placement = r.placement;
  st.retired.insert(r.retired.begin(), r.retired.end());
  st.change = r.change;
  st.change_shard = r.change_shard;
  st.change_epoch = r.change_epoch;
  st.joining = !st.change.empty();  // finished once the members are back; no other change before
  std::size_t copies = 0;
  for (const auto& s : r.shards) {
    st.shards.push_back({s.id, s.host, s.port, s.pid, {}, {}, 1});
    if (st.retired.count(s.id) && !leaving_now(st, s.id)) continue;
    auto chain = saved_chain(opts, s.id);
    st.absent_copies[s.id].insert(chain.begin(), chain.end());
    copies += chain.size();
  }
  st.shard_handles.resize(r.shards.size());
  st.worker_done = r.worker_done;
  st.next_worker = static_cast<std::uint32_t>(r.worker_done.size());
  for (std::uint32_t w = 0; w < r.worker_done.size(); ++w) {
    if (r.worker_done[w]) ++st.finished_workers;
    else st.absent_workers.insert(w);
  }
  st.results = r.results;
  for (const auto& [w, res] : r.results) {
    tell(opts, "worker " + std::to_string(w) + " finished: " + res.json, done_atom::value, worker_result{w, res.ok, res.json});
  }
  st.barrier_generation = r.barrier_generation;
  st.view_out = st.view_ready = true;
  st.resuming = true;
  tell_checkpointer(opts, make_view(self, opts));  // the map as it was: parts may come before the members
  tell_news(opts, "coordinator: resuming the job at epoch " + std::to_string(st.epoch) + "; waiting up to " +
                    std::to_string(opts.rejoin_patience.count()) + " ms for " + std::to_string(st.absent_copies.size()) +
                    " shards" + (opts.replication >= 2 ? " (" + std::to_string(copies) + " copies)" : "") + " and " +
                    std::to_string(st.absent_workers.size()) + " workers to come back");
  self->delayed_send(self, opts.rejoin_patience, rejoin_atom::value);
  finish_resume(self, opts);
}

// The rejoin deadline: a shard with no copy back is dead (recovered from a checkpoint,
// or the job fails), its chain closes over the copies still away; a worker still away
// leaves the clock vector.
void give_up_absent(self_ptr self, const coordinator_options& opts) {
  auto& st = self->state;
  if (!st.resuming) return;
  const auto why = make_ps_error("it did not come back within " + std::to_string(opts.rejoin_patience.count()) +
                                 " ms of the coordinator's restart");
  auto workers = std::move(st.absent_workers);
  st.absent_workers.clear();
  for (auto w : workers) {
    tell_news(opts, "worker " + std::to_string(w) + " went down (" + describe(why) + "); it leaves the clock vector");
    worker_finished(self, opts, w);
  }
  if (!st.resuming) return;  // the last worker's end finished the resume
  auto absent = std::move(st.absent_copies);
  st.absent_copies.clear();
  std::vector<std::uint32_t> dead;
  for (const auto& [id, positions] : absent) {
    if (!st.rejoined_copies.count(id)) {
      dead.push_back(id);
      continue;
    }
    for (auto position : positions)
      tell_news(opts, "copy " + std::to_string(position) + " of shard " + std::to_string(id) + " went down (" +
                        describe(why) + "); the shard's chain closes over it, nothing lost");
  }
  if (dead.empty()) return finish_resume(self, opts);
  if (!st.change.empty()) {  // the change cannot be finished: a shard's keys would have no owner
    std::string ids;
    for (auto id : dead) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    return end_job(self, opts, errc::job_failed,
                   "a " + st.change + " of shard " + std::to_string(st.change_shard) +
                     " was under way when the coordinator went down, and shard " + ids + " did not come back within " +
                     std::to_string(opts.rejoin_patience.count()) +
                     " ms: the change cannot be finished; restart the job from its newest checkpoint (--restore)");
  }
  assemble_chains(self, opts);  // the shards that are back, before the replacements' maps go out
  st.resuming = false;          // the replacements' maps go out as they are placed
  for (auto id : dead) recover_shard(self, opts, id, "server shard " + std::to_string(id), why);
}

// A shard that left the map before the coordinator died, still serving the requests
// clients had sent it: it stops as it would have, once they say they need it no more
// (their word to the dead coordinator is lost: at the latest, when the job ends).
caf::result<registration> rejoin_drained_leaver(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                                std::uint32_t id) {
  auto& st = self->state;
  st.shard_handles[id] = caf::actor_cast<shard_actor>(sender);
  auto& waiting = st.draining_clients[id];
  for (std::uint32_t w = 0; w < st.worker_done.size(); ++w)
    if (!st.worker_done[w]) waiting.insert(w);
  auto reg = make_registration(self, opts, id);
  stop_if_drained(self, opts, id);
  return reg;
}

// A copy of a shard comes back (role "server": the shard's own, or its replacement;
// "replica": a copy further down its chain, by the place it was started at).
caf::result<registration> rejoin_shard(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                       const node_info& info) {
  auto& st = self->state;
  auto id = info.shard;
  const bool replica = info.role == "replica";
  const auto position = replica ? info.position : 0;
  auto who = (replica ? "copy " + std::to_string(position) + " of shard " : "server shard ") + std::to_string(id) +
             (info.host.empty() ? "" : " (" + info.host + ":" + std::to_string(info.port) + ", pid " +
                                         std::to_string(info.pid) + ")");
  if (id < st.shards.size() && st.retired.count(id) && !leaving_now(st, id)) {
    if (!replica) return rejoin_drained_leaver(self, opts, sender, id);
    // A copy of a shard that left, not stopped yet: it stops with its shard, as it would have.
    st.leavers_copies[id].push_back(sender);
    return make_registration(self, opts, id);
  }
  auto absent = st.absent_copies.find(id);
  if (id >= st.shards.size() || (st.retired.count(id) && !leaving_now(st, id)) || absent == st.absent_copies.end() ||
      !absent->second.count(position))
    return make_error(errc::refused, "coordinator: " + who + " cannot rejoin: the resumed job " +
                                       (id < st.shards.size() && !st.retired.count(id) ? "has it back already or gave it up"
                                                                                     : "has no such shard"));
  absent->second.erase(position);
  if (absent->second.empty()) st.absent_copies.erase(absent);
  if (!replica) {
    auto& entry = st.shards[id];
    std::tie(entry.host, entry.port, entry.pid) = std::tie(info.host, info.port, info.pid);
    if (!st.retired.count(id)) st.process_heads[id] = caf::actor_cast<shard_actor>(sender);  // joiners host copies too
  } else {
    st.copy_positions[sender.address()] = position;
  }
  st.rejoined_copies[id][position] = sender;
  st.copies.push_back(caf::actor_cast<shard_actor>(sender));
  st.shard_ids[sender.address()] = id;
  st.members[sender.address()] = who + " (rejoined)";
  self->monitor(sender);
  // Workers that ended while it was away (or before it came back) leave its clock vector.
  for (std::uint32_t w = 0; w < st.worker_done.size(); ++w)
    if (st.worker_done[w]) caf::anon_send(sender, leave_atom::value, w);
  auto reg = make_registration(self, opts, id);
  finish_resume(self, opts);
  return reg;
}

// A worker's client rejoins for its worker (info.handle, told when the job ends); a
// worker that finished only comes back to send its result again.
caf::result<registration> rejoin_worker(self_ptr self, const coordinator_options& opts, const caf::actor& sender,
                                        const node_info& info) {
  auto& st = self->state;
  auto id = info.shard;
  auto who = "worker " + std::to_string(id) + " (pid " + std::to_string(info.pid) + ")";
  if (id >= st.worker_done.size()) return make_error(errc::refused, "coordinator: " + who + " cannot rejoin: no such worker");
  if (st.worker_done[id]) return make_registration(self, opts, id);
  if (!st.absent_workers.count(id))
    return make_error(errc::refused, "coordinator: " + who + " cannot rejoin: the resumed job has it back already or gave it up");
  st.absent_workers.erase(id);
  if (info.handle) {
    self->monitor(info.handle);
    st.worker_ids[info.handle.address()] = id;
    st.worker_handles.push_back(caf::actor_cast<worker_actor>(info.handle));
    st.members[info.handle.address()] = who + " (rejoined)";
  }
  auto sub = caf::actor_cast<client_actor>(sender);
  st.view_subscribers.push_back(sub);
  st.subscriber_workers[sub.address()] = id;
  auto reg = make_registration(self, opts, id);
  finish_resume(self, opts);
  return reg;
}

// A member of the dead coordinator's job comes back: only to a coordinator that resumed it.
caf::result<registration> rejoin_member(self_ptr self, const coordinator_options& opts, const node_info& info) {
  auto& st = self->state;
  auto refuse = [&](const std::string& why) {
    return make_error(errc::refused, "coordinator: " + member_name(info) + " cannot rejoin: " + why);
  };
  if (!opts.resume) return refuse("this coordinator did not resume a job (start it with --state-dir=DIR --resume)");
  if (st.ending) return refuse("the job is ending");
  if (auto why = refusal(opts, info); !why.empty()) return refuse(why);
  auto sender = caf::actor_cast<caf::actor>(self->current_sender());
  if (!sender) return refuse("the message came without a sender");
  if (info.role == "server" || info.role == "replica") return rejoin_shard(self, opts, sender, info);
  if (info.role == "worker") return rejoin_worker(self, opts, sender, info);
  return refuse("a " + info.role + " does not rejoin");
}

// A worker's end: its result is kept (saved for a resume) and it leaves; one sent again
// after a restart is acknowledged and changes nothing.
caf::ok_atom worker_done(self_ptr self, const coordinator_options& opts, const worker_result& result) {
  auto& st = self->state;
  if (result.worker >= st.worker_done.size() || st.worker_done[result.worker]) return caf::ok_atom::value;
  st.results[result.worker] = {result.ok, result.json};
  tell(opts, "worker " + std::to_string(result.worker) + " finished: " + result.json, done_atom::value, result);
  worker_finished(self, opts, result.worker);
  return caf::ok_atom::value;
}

}  // namespace

coordinator_actor::behavior_type coordinator(self_ptr self, coordinator_options opts) {
  self->state.worker_done.assign(opts.workers, false);
  if (opts.checkpoint_seconds > 0 && opts.checkpointer)
    self->delayed_send(self, checkpoint_period(opts), checkpoint_atom::value);
  if (opts.wait_report.count() > 0 && !opts.resume) self->delayed_send(self, opts.wait_report, wait_report_atom::value);
  self->set_down_handler([=](caf::down_msg& dm) { member_down(self, opts, dm); });
  if (opts.resume) resume_job(self, opts);
  return {
    [=](register_atom, node_info& info) { return register_member(self, opts, info); },
    [=](end_atom) { self->quit(self->state.end_reason); },
    [=](barrier_atom, std::uint32_t worker, std::uint64_t generation) {
      return enter_barrier(self, opts, worker, generation);
    },
    [=](rejoin_atom, const node_info& info) { return rejoin_member(self, opts, info); },
    [=](rejoin_atom) { give_up_absent(self, opts); },
    [=](report_atom, std::uint32_t worker, const std::string& text) {
      tell(opts, "worker " + std::to_string(worker) + ": " + text, report_atom::value, worker, text);
    },
    [=](loss_atom, const update_loss& loss) {
      tell(opts, describe(loss, "shard " + std::to_string(loss.shard)), loss_atom::value, loss);
    },
    [=](checkpoint_atom) { checkpoint_round(self, opts); },
    [=](wait_report_atom) { report_waiting(self, opts); },
    [=](checkpoint_now_atom) { return checkpoint_now(self, opts); },
    [=](status_atom) { return cluster_status(self); },
    [=](remove_shard_atom, std::uint32_t id) { return remove_shard(self, opts, id); },
    [=](idle_atom, std::uint32_t shard, std::uint32_t worker) {
      auto it = self->state.draining_clients.find(shard);
      if (it == self->state.draining_clients.end()) return;
      it->second.erase(worker);
      stop_if_drained(self, opts, shard);
    },
    [=](view_atom, std::uint32_t worker) {
      auto& st = self->state;
      auto sub = caf::actor_cast<client_actor>(self->current_sender());
      if (!sub) return;
      st.view_subscribers.push_back(sub);
      st.subscriber_workers[sub.address()] = worker;
      if (st.epoch > 1) caf::anon_send(sub, view_atom::value, make_view(self, opts));  // missed one
    },
    [=](done_atom, const worker_result& result) { return worker_done(self, opts, result); },
    [=](stop_atom, std::uint8_t code, std::string& why) -> caf::result<caf::ok_atom> {
      auto kind = static_cast<errc>(code);
      if (kind != errc::stopped && kind != errc::interrupted && kind != errc::terminated && kind != errc::job_failed)
        return make_ps_error("coordinator: stop with code " + std::to_string(code) + " (expected stopped, "
                             "interrupted, terminated or job_failed)");
      auto rp = self->make_response_promise<caf::ok_atom>();
      rp.deliver(caf::ok_atom::value);
      stop_job(self, opts, kind, why);
      return rp;
    },
  };
}

}  // namespace ps
