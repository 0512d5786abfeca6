// The shard's configuration and views, its start as a server, and the coordinator lost
// and rejoined.
#include "actors/shard/shard_internal.hpp"

namespace ps::shard_internal {

// A new map: this copy's place in its chain. A new successor (the old one died) gets
// what it may lack again, in order; a copy that became the tail owes the replies itself.
std::uint64_t take_view(self_ptr self, const cluster_view& view) {
  auto& st = self->state;
  if (!st.core) return view.epoch;
  st.core->saw_epoch(view.epoch);
  if (view.checkpointer) st.checkpointer = view.checkpointer;
  // A view older than one taken already (a map change's, asked before a failover's views
  // came: a copy ahead may end after them) names heads and chains that may have died
  // since; following it would send updates to a dead successor for good.
  if (view.epoch < st.placed_epoch) return st.core->epoch();
  st.placed_epoch = view.epoch;
  st.owner_addresses.clear();  // a shard that left is dialled no more (its name may be another's now)
  for (const auto& e : view.shards) {
    if (e.handle) st.owners[e.id] = caf::actor_cast<shard_actor>(e.handle);
    st.owner_addresses[e.id] = {e.host, e.port};
  }
  send_again_to_new_heads(self);
  auto id = st.core->id();
  // By id: a map after a removal lacks the shards that left.
  auto entry = std::find_if(view.shards.begin(), view.shards.end(), [&](const shard_entry& e) { return e.id == id; });
  if (entry == view.shards.end()) {  // it left the map: what it applied is handed over, it answers alone
    if (st.successor && st.successor_down) follow(self, {});
    return st.core->epoch();
  }
  const auto& chain = entry->chain;
  auto me = std::find(chain.begin(), chain.end(), caf::actor_cast<caf::actor>(self));
  if (me == chain.end()) return st.core->epoch();  // one copy per shard, or not (yet) in the chain
  st.core->set_head(me == chain.begin());
  auto next = me + 1 == chain.end() ? shard_actor{} : caf::actor_cast<shard_actor>(*(me + 1));
  if (!next && st.successor_unannounced) return st.core->epoch();  // named once it took its seed
  if (next == st.successor) {
    st.successor_unannounced = false;
    return st.core->epoch();
  }
  follow(self, next);
  return st.core->epoch();
}

// The parameters and rows a registration carries (--restore, a replacement); throws
// bad_request.
shard_snapshot restored_state(const registration& reg) {
  if (!reg.state.bytes || reg.state.bytes->empty()) return {reg.id, {}, {}, {}, 0};
  auto snap = snapshot_of(reg.state);
  if (snap.shard != reg.id) throw bad_request("restored state belongs to shard " + std::to_string(snap.shard));
  return snap;
}

// The kills this shard's process follows: its own --faults, else the job's. Copies and
// replacements follow none (a kill names the original shard's process).
fault_plan faults_of(const registration& reg, const shard_options& opts) {
  if (opts.replaces || opts.replica) return {};
  if (!opts.faults.empty()) return opts.faults;
  for (const auto& s : reg.spec.settings)
    if (s.name == "faults") return parse_faults(s.value);
  return {};
}

shard_config config_of(const registration& reg, const shard_options& opts, const std::string& name,
                       shard_snapshot state) {
  shard_config c;
  c.id = reg.id;
  c.name = name;
  c.epoch = reg.view.epoch;
  for (const auto& s : reg.view.shards) c.shard_ids.push_back(s.id);
  c.vnodes = reg.view.vnodes;
  c.bucket_bits = reg.view.bucket_bits;
  c.dense = reg.view.dense.ranges;
  for (std::size_t i = 0; i < reg.view.placed_buckets.size() && i < reg.view.placed_owners.size(); ++i)
    c.placement.emplace_back(reg.view.placed_buckets[i], reg.view.placed_owners[i]);
  for (const auto& t : reg.view.tables) c.tables.push_back(t.to_spec());
  c.rule = reg.view.rule.to_rule();
  c.num_workers = reg.view.num_workers;
  c.staleness = reg.view.consistency.staleness;
  c.checkpoint_every = reg.view.checkpoint_every;
  c.sends_checkpoints = static_cast<bool>(reg.view.checkpointer);
  c.kill_at = faults_of(reg, opts).kill_clock(fault_plan::role::server, reg.id);
  c.head = !opts.replica;
  c.restored = std::move(state.segments);
  c.restored_rows = std::move(state.tables);
  c.restored_disk_rows = state.disk_row_count;
  c.restored_disk_table_rows = std::move(state.disk_table_rows);
  c.restored_sightings = std::move(state.sightings);
  c.shard_memory = opts.shard_memory;
  c.eviction = opts.eviction;
  return c;
}

// A copy this shard started in its process ends when this shard does, as with the
// process: a shard that left the job (psctl remove-shard) takes them along, and the
// chains they were in close over them and grow back elsewhere (in one process, the
// simulation's and an embedded job's, too).
void ends_with(self_ptr self, const caf::actor& copy) {
  self->attach_functor([copy](const caf::error& reason) {
    caf::anon_send_exit(copy, reason && reason != caf::exit_reason::normal ? caf::exit_reason::kill
                                                                            : caf::exit_reason::user_shutdown);
  });
}

// This process also keeps copies of the shards before this one on the ring: shard id - j
// at chain position j (so a chain spans consecutive server processes).
void spawn_replicas(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                    const registration& reg, const std::string& seed) {
  auto copies = reg.view.replication;
  auto n = static_cast<std::uint32_t>(reg.view.shards.size());
  if (opts.replica || opts.replaces || copies < 2) return;
  // A shard that joined a running job (its entry is newer than the job's first map): its
  // chain is built by the coordinator in other processes, and it keeps no copies here.
  auto me = std::find_if(reg.view.shards.begin(), reg.view.shards.end(), [&](const shard_entry& e) { return e.id == reg.id; });
  if (me == reg.view.shards.end() || me->since_epoch > 1) return;
  for (std::uint32_t j = 1; j < copies; ++j) {
    auto ropts = opts;
    ropts.faults = {};
    auto role = std::make_shared<shard_options::replica_role>();
    role->reg = reg;
    role->reg.state = {};
    role->reg.id = (reg.id + n - j) % n;
    role->position = j;
    if (!seed.empty()) role->disk_seed = sibling_disk_rows(seed, role->reg.id);
    ropts.replica = role;
    ends_with(self, caf::actor_cast<caf::actor>(self->spawn(server_shard, coordinator, ropts)));
  }
}

// Takes the id, the shard map and the job settings (and restored state) from a registration.
bool configure(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
               const registration& reg) {
  auto& st = self->state;
  st.name = opts.replica ? "shard " + std::to_string(reg.id) + " copy " + std::to_string(opts.replica->position)
                         : "shard " + std::to_string(reg.id);
  std::string seed;  // a checkpoint's rows on disk to start the disk tier from
  try {
    auto state = restored_state(reg);
    seed = opts.replica ? opts.replica->disk_seed : state.disk_rows;
    if (!seed.empty() && opts.shard_memory == 0)
      throw bad_request("the checkpoint holds this shard's rows on a disk tier (" + seed + "): restore it with --shard-memory");
    st.core.emplace(config_of(reg, opts, st.name, std::move(state)));
    st.dies_in_handoff = faults_of(reg, opts).kills_at_handoff(reg.id);
    st.checkpointer = reg.view.checkpointer;
    st.checkpoint_dir = reg.view.checkpoint_dir;
    if (!opts.trace_path.empty()) {
      st.trace_fd = ::open(opts.trace_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (st.trace_fd < 0) throw bad_request("cannot open trace file " + opts.trace_path + ": " + std::strerror(errno));
      st.trace_copy = (static_cast<std::uint64_t>(::getpid()) << 32) | (self->id() & 0xffffffffu);
    }
  } catch (const bad_request& e) {
    std::fprintf(stderr, "%s: bad cluster configuration: %s\n", st.name.c_str(), e.what());
    self->quit(make_ps_error(e.what()));
    return false;
  }
  if (opts.shard_memory > 0 && st.core->num_tables() > 0) {
    std::vector<std::size_t> strides;
    for (std::uint32_t t = 0; t < st.core->num_tables(); ++t) strides.push_back(st.core->rows().table(t).stride());
    st.disk = spawn_io(self, opts.disk_io, row_io, opts.shard_dir, st.name, std::move(strides), seed, opts.disk_io);
  }
  spawn_replicas(self, opts, coordinator, reg, seed);
  return true;
}

// A benchmark's table: made on disk by the I/O actor (the shard goes on meanwhile), or in RAM.
caf::result<std::uint64_t> fill(self_ptr self, std::uint32_t table, std::uint64_t count) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  if (table >= st.core->num_tables()) return make_ps_error(st.name + ": no sparse table " + std::to_string(table));
  if (!st.disk) return st.core->fill_rows_in_ram(table, count);
  auto order = std::make_shared<fill_order>();
  order->table = table;
  order->count = count;
  order->spec = st.core->rows().table(table).spec();
  order->keep = [map = st.core->map(), id = st.core->id(), table](std::uint64_t row) {
    return map.row_owner(table, row) == id;
  };
  auto rp = self->make_response_promise<std::uint64_t>();
  self->request(st.disk, caf::infinite, fill_atom::value, std::shared_ptr<const fill_order>(std::move(order)))
    .then(
      [=](std::uint64_t rows) mutable {
        self->state.core->filled_on_disk(table, rows);
        rp.deliver(rows);
      },
      [=](caf::error& e) mutable { rp.deliver(e); });
  return rp;
}

// The shard's figures as one JSON object.
std::string stats_json(const shard_state& st) {
  const auto& rows = st.core->rows();
  const auto& s = rows.stats();
  const auto& clocks = st.core->clocks();
  nlohmann::json worker_clocks = nlohmann::json::array();  // null: the worker left
  for (std::uint32_t w = 0; w < clocks.size(); ++w)
    worker_clocks.push_back(clocks.live(w) ? nlohmann::json(clocks.clock(w)) : nlohmann::json());
  const auto keys = st.core->store().num_keys();
  nlohmann::json j{{"shard", st.core->id()},
                   {"pid", getpid()},
                   {"epoch", st.core->epoch()},
                   {"keys", keys},
                   {"clocks", std::move(worker_clocks)},
                   {"pushes", st.pushes_received},
                   {"pulls", st.pulls_received},
                   {"uptime_s", std::chrono::duration<double>(std::chrono::steady_clock::now() - st.started).count()},
                   {"rows", rows.rows_created()},
                   {"rows_expired", s.expired},
                   {"row_pushes_refused", s.refused},
                   {"table_bytes", rows.table_bytes()},
                   {"ram_bytes", rows.held_bytes()},
                   {"ram_budget", rows.budget()},
                   {"ram_hits", s.hits},
                   {"ram_misses", s.misses},
                   {"rows_read", s.read},
                   {"rows_from_buffer", s.taken_back},
                   {"rows_written", s.written},
                   {"disk_bytes_read", process_disk_read_bytes()},
                   {"peak_rss", process_peak_rss()}};
  return j.dump();
}

// Registers with the coordinator (published at `port`); awaits the answer, so no push or
// pull is handled before the shard knows its map.
void start_server(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, std::uint16_t port) {
  self->state.port = port;
  self->request(coordinator, opts.register_timeout, register_atom::value,
                node_info{"server", opts.host, port, static_cast<std::uint32_t>(getpid()),
                          opts.host.empty() ? caf::actor_cast<caf::actor>(self) : caf::actor{}, 0, 0, protocol_version,
                          opts.given})
    .await([=](registration& reg) { configure(self, opts, coordinator, reg); },
           [=](caf::error& err) {
             std::fprintf(stderr, "server: registration with the coordinator failed: %s\n", describe(err).c_str());
             self->quit(err);
           });
}

// The coordinator went down without ending the job. A configured shard that may wait for
// it (opts.reconnect) serves on while its address is dialled again: a coordinator resumed
// there (--resume) takes it back. Otherwise, or once that wait is over, the shard ends
// with an error naming the coordinator.
void coordinator_down(self_ptr self, const shard_options& opts, const caf::error& reason) {
  auto& st = self->state;
  if (!reason || reason == caf::exit_reason::normal) return self->quit(reason);  // the job ended
  if (!opts.reconnect.enabled() || !st.core)
    return self->quit(make_ps_error(st.name + ": the coordinator went down (" + describe(reason) + ")"));
  st.coordinator_lost = describe(reason);
  log_line(log_level::warning, st.name + ": the coordinator at " + opts.reconnect.address + " went down (" +
                                   st.coordinator_lost + "); serving on, waiting up to " +
                                   std::to_string(opts.reconnect.patience.count()) + " ms for it to come back");
  redial_coordinator(self, opts.reconnect, st.coordinator.address());
}

// A coordinator answers at the old address: this shard tells it who it is. A coordinator
// that did not resume this job refuses, and the shard ends naming why; one that cannot be
// reached yet is dialled again.
void rejoin(self_ptr self, const shard_options& opts, coordinator_actor coordinator) {
  // A copy further down a chain names the place it was started at: the coordinator's
  // record keeps each chain's order by it.
  node_info me{opts.replica ? "replica" : "server", opts.host, self->state.port, static_cast<std::uint32_t>(getpid()), {},
               self->state.core->id(), opts.replica ? opts.replica->position : 0, protocol_version, opts.given};
  rejoin_coordinator(
    self, coordinator, me, opts.reconnect,
    [=] {
      auto& st = self->state;
      st.coordinator = coordinator;
      st.coordinator_lost.clear();
      log_line(log_level::warning, st.name + ": rejoined the coordinator at " + opts.reconnect.address);
      // The other shards were reached through the dead coordinator's node: dialled directly,
      // and sent to over that connection from then on.
      for (const auto& [id, address] : st.owner_addresses)
        if (id != st.core->id())
          dial_owner(self, id, [self, id = id](shard_actor direct) {
            auto owner = self->state.owners.find(id);
            if (direct && owner != self->state.owners.end() && same_actor(owner->second, direct)) owner->second = direct;
          });
    },
    [=](const std::string& why) {
      auto text = self->state.name + ": " + why;
      std::fprintf(stderr, "%s\n", text.c_str());
      self->quit(make_error(errc::job_failed, text));
    });
}

// No coordinator came back in time (why): the shard ends with an error naming it.
void coordinator_gone(self_ptr self, const shard_options& opts, const std::string& why) {
  auto& st = self->state;
  auto text = st.name + ": " + coordinator_gone_text(opts.reconnect, st.coordinator_lost) + " (" + why + ")";
  std::fprintf(stderr, "%s\n", text.c_str());
  self->quit(make_error(errc::job_failed, text));
}

// What workers may send a shard over a data connection (data_plane::serve): their
// requests on keys, rows and clocks; everything else keeps to CAF.
bool worker_request(caf::message_id mid, const caf::message& msg) {
  if (mid.is_response() || msg.empty() || !msg.match_element<caf::atom_value>(0)) return false;
  static constexpr caf::atom_value requests[] = {push_atom::value,      init_atom::value,     pull_atom::value,
                                                 push_rows_atom::value, pull_rows_atom::value, prefetch_atom::value,
                                                 clock_atom::value};
  return std::find(std::begin(requests), std::end(requests), msg.get_as<caf::atom_value>(0)) != std::end(requests);
}

// Watches the coordinator and the successor, starts the helpers, and a copy or a
// replacement configures itself at once.
void start_shard(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator) {
  self->state.coordinator = coordinator;
  self->state.dial_shard = opts.dial_shard;
  self->monitor(coordinator);
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.coordinator.address()) return coordinator_down(self, opts, dm.reason);
    auto& st = self->state;
    if (dm.source != st.successor.address()) return;
    // A seeded copy no map named (the chain did not grow), or the copies of a shard that
    // left the map (stopped by the coordinator): this copy is the tail again.
    if (st.successor_unannounced || (st.core && !in_own_map(*st.core))) return follow(self, {});
    st.successor_down = true;  // new chain coming
  });
  if (opts.plane) {
    opts.plane->lend_ring_payloads();  // updates are applied at once, straight from the ring
    self->state.claimer = self->spawn<caf::linked>(payload_claimer, opts.plane, true);
    self->state.writes = self->spawn<caf::linked>(write_tracker, self->state.write_counts);
    if (opts.plane->messages_enabled()) opts.plane->serve(caf::actor_cast<caf::strong_actor_ptr>(self), worker_request);
  }
  if (opts.replica) start_replica(self, opts, coordinator);
  if (opts.replaces) start_replacement(self, opts, coordinator);
}

caf::result<std::uint64_t> join(self_ptr self, std::uint32_t worker) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  try {
    auto start = st.core->join(worker);
    // A copy this tail is seeding is not among those the coordinator tells yet: it hears
    // here, ahead of the worker's updates that follow on the same path.
    if (st.successor_unannounced) caf::anon_send(st.successor, join_atom::value, worker);
    return start;
  } catch (const bad_request& e) {
    return make_ps_error(e.what());
  }
}

caf::result<std::string> stats(self_ptr self) {
  if (!self->state.core) return make_ps_error(self->state.name + ": not configured yet");
  return stats_json(self->state);
}

}  // namespace ps::shard_internal
