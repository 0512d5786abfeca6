// The shard map and its chains: announcing a view, the leavers' chains, growing chains back
// to their length after a copy died.
#include "actors/coordinator/coordinator_internal.hpp"

namespace ps::coordinator_internal {

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

void announce_view(self_ptr self, const coordinator_options& opts, std::function<void()> then) {
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
  if (opts.replication < 2 || st.growing || st.joining || !st.core.formed()) return;
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
  if (st.core.ending() || chain.empty() || chain.back() != tail) {
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

}  // namespace ps::coordinator_internal
