// Chain replication: forwarding down the chain, copies started and seeded (rows on disk
// too), a chain extended by a new copy, replacements.
#include "actors/shard/shard_internal.hpp"
#include "libps/persist/handoff_codec.hpp"

namespace ps::shard_internal {

void follow(self_ptr self, const shard_actor& next);

// A copy this one seeded that no map names yet failed an update (it refused it, or did not
// answer): its growth was abandoned (the coordinator that asked for it died, and the one
// resumed does not know it: it refuses the copy's rejoin, and the copy, whose map stops at
// the old coordinator's, refuses every newer update meanwhile). The copy ends, so nothing
// ever reads from it, and this copy is the tail again: the update is on every copy of the
// chain. Failing it instead failed the workers' updates and ticks (sim --elastic --tiered
// seed 19669). A chain that should grow grows again from here.
void drop_unannounced_copy(self_ptr self, const caf::error& err) {
  auto& st = self->state;
  log_line(log_level::warning, st.name + ": the copy it seeded, which no map names yet, failed an update (" +
                                   describe(err) + "); it is stopped, and this copy is its chain's tail again");
  caf::anon_send_exit(st.successor, caf::exit_reason::kill);
  follow(self, {});
}

// The successor acknowledged (or refused) update `tag`: the reply owed goes out. While
// the successor is dead, failures wait for the new chain, which sends them again.
void forwarded(self_ptr self, std::uint64_t tag, const caf::error& err) {
  auto& st = self->state;
  auto it = st.forwards.find(tag);
  if (it == st.forwards.end()) return;  // sent again to a new successor since
  if (err == caf::sec::request_receiver_down) st.successor_down = true;  // bounced: it has ended
  if (err && st.successor_down) return;
  if (err && st.successor_unannounced) return drop_unannounced_copy(self, err);
  it->second.settle(err ? make_ps_error(st.name + ": the next copy in the chain failed: " + describe(err)) : caf::error{});
  st.forwards.erase(it);
}

// An update applied here goes down the chain; the reply to its sender waits for the
// successor's, so an acknowledged update is on every copy.
// made: the reply's promise, made when the request arrived (its values came later).
// Sends f down the chain and keeps it until the successor answers (a new successor gets
// it again: follow).
void send_down(self_ptr self, shard_state::forward f) {
  auto& st = self->state;
  auto tag = ++st.next_forward;
  auto send = f.send;
  st.forwards.emplace(tag, std::move(f));
  if (!st.seeding_copy) send(st.successor, tag);  // else once the copy has its seed (finish_seed)
}

caf::result<std::uint64_t> pass_down(self_ptr self, std::function<void(shard_actor, std::uint64_t)> send,
                                     std::uint64_t value, std::optional<ack_promise> made) {
  auto rp = made ? *made : self->make_response_promise<std::uint64_t>();
  send_down(self, {std::move(send), rp, value});
  return rp;
}

// `next` follows this copy in its chain now (none: this copy is the tail). The updates
// the old successor had not acknowledged go to it again, in order; a tail owes their
// replies itself (they are applied here).
void follow(self_ptr self, const shard_actor& next) {
  auto& st = self->state;
  st.successor = next;
  st.successor_down = false;
  st.successor_unannounced = false;
  st.seeding_copy = false;
  if (next) self->monitor(next);
  auto pending = std::move(st.forwards);
  st.forwards.clear();
  for (auto& [tag, f] : pending) {
    if (!next) {
      f.settle({});
      continue;
    }
    auto fresh = ++st.next_forward;
    auto send = f.send;
    st.forwards.emplace(fresh, std::move(f));
    send(next, fresh);
  }
}

// A copy further down a chain: configured from its successor's registration, then it
// registers as a replica (the answer carries its state under --restore).
void start_replica(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator) {
  const auto& r = opts.replica;
  if (!configure(self, opts, coordinator, r->reg) || r->seeded_by_tail) return;
  self->request(coordinator, opts.register_timeout, register_atom::value,
                node_info{"replica", opts.host, 0, static_cast<std::uint32_t>(getpid()),
                          caf::actor_cast<caf::actor>(self), r->reg.id, r->position, protocol_version, opts.given})
    .then(
      [=](registration& reg) {
        auto& st = self->state;
        try {
          auto state = restored_state(reg);
          if (state.disk_rows != r->disk_seed)  // its disk tier started from disk_seed when configured
            throw bad_request("its disk tier started from '" + r->disk_seed + "', but the checkpoint holds its rows in '" +
                              state.disk_rows + "'");
          st.core->restore(state.segments, state.tables);
          st.core->restore_counts(state.disk_table_rows, state.disk_row_count, state.sightings);
        } catch (const bad_request& e) {
          std::fprintf(stderr, "%s: cannot restore: %s\n", st.name.c_str(), e.what());
          self->quit(make_ps_error(st.name + ": cannot restore: " + e.what()));
        }
      },
      [=](caf::error& err) {
        std::fprintf(stderr, "%s: registration as a replica failed: %s\n", self->state.name.c_str(),
                     describe(err).c_str());
        self->quit(err);
      });
}

// A replacement for a dead shard, configured at once from the checkpoint's section.
void start_replacement(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator) {
  const auto& r = opts.replaces;
  if (!configure(self, opts, coordinator, r->reg)) return;
  try {
    self->state.core->start_as_replacement(r->clock, r->departed);
  } catch (const bad_request& e) {
    auto& st = self->state;
    std::fprintf(stderr, "%s: cannot restore from %s: %s\n", st.name.c_str(), r->source.c_str(), e.what());
    self->quit(make_ps_error(st.name + ": cannot restore from " + r->source + ": " + e.what()));
  }
}

// A copy of another shard in this process, as its chain grows back (host_copy_atom): it
// waits for its seed from the chain's tail.
caf::actor host_copy(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, registration reg,
                     std::uint32_t position) {
  auto ropts = opts;
  ropts.faults = {};  // a kill names the original shard's process
  ropts.replaces = nullptr;
  auto role = std::make_shared<shard_options::replica_role>();
  role->reg = std::move(reg);
  role->reg.state = {};
  role->position = position;
  role->seeded_by_tail = true;
  ropts.replica = role;
  auto copy = caf::actor_cast<caf::actor>(self->spawn(server_shard, coordinator, ropts));
  ends_with(self, copy);
  return copy;
}

// Sends the copy being seeded (extend_chain) the pinned disk tier's rows of `table` from
// id `from` on, a page at a time (the next is read once the copy took this one, so one
// page is in memory), then the later tables', then calls done. Stops when the copy is no
// longer the one being seeded.
// A seed of a copy from a disk tier, for its report: when it began, the rows sent from
// the first pin, when the copy became the successor, the rows changed since.
struct seed_tally {
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now(), moment;
  std::uint64_t pinned = 0, changed = 0;
};

void seed_disk_rows(self_ptr self, const shard_options& opts, const shard_actor& copy, std::uint32_t table,
                    std::uint64_t from, std::function<void()> done, std::function<void(const std::string&)> failed,
                    std::shared_ptr<seed_tally> tally) {
  auto seeding = [=] {
    if (self->state.seeding_ahead == copy) return true;
    caf::anon_send(self->state.disk, unpin_rows_atom::value);
    return false;
  };
  auto next = [=](const moved_page& page) {
    if (!seeding()) return;
    if (page.more) return seed_disk_rows(self, opts, copy, table, page.next, done, failed, tally);
    if (table + 1 < self->state.core->num_tables()) return seed_disk_rows(self, opts, copy, table + 1, 0, done, failed, tally);
    done();
  };
  self->request(self->state.disk, caf::infinite, copy_rows_atom::value, table, from)
    .then(
      [=](const std::shared_ptr<const moved_page>& page) {
        if (!seeding()) return;
        if (page->ids.empty()) return next(*page);
        tally->pinned += page->ids.size();
        encoded_block part;
        try {
          part = block_of(encode_handoff(self->state.core->seed_rows(*page)));
        } catch (const bad_request& e) {
          return failed(e.what());
        }
        self->request(copy, opts.forward_timeout, takeover_atom::value, part)
          .then([=](std::uint64_t) { next(*page); },
                [=](caf::error& e) { failed("the new copy did not take its rows: " + describe(e)); });
      },
      [=](caf::error& e) {
        failed("the disk tier failed while seeding a new copy: " + describe(e));
        disk_failed(self, e);
      });
}

// Sends the copy being seeded the rest of its seed, then the updates applied here since
// the seed was taken, which waited for it (send_down).
void finish_seed(self_ptr self, const shard_options& opts, const shard_actor& copy, const encoded_block& seed,
                 caf::typed_response_promise<std::uint64_t> rp) {
  self->request(copy, opts.forward_timeout, takeover_atom::value, seed)
    .then([=](std::uint64_t) mutable { rp.deliver(self->state.core->epoch()); },
          [=](caf::error& e) mutable {
            rp.deliver(make_ps_error(self->state.name + ": the new copy did not take its seed: " + describe(e)));
          });
  auto& st = self->state;
  if (!std::exchange(st.seeding_copy, false)) return;
  for (auto& [tag, f] : st.forwards) f.send(st.successor, tag);
}

// One page of the changed rows a seed copies from the disk tier pinned at its moment
// (moves[at]: by id, or listed empty, a scan of the table), each to the copy by send;
// then the next, and done() after the last.
void seed_changed_rows(self_ptr self, std::shared_ptr<std::vector<disk_move>> moves, std::size_t at,
                       std::function<void(const shard_handoff&)> send, std::function<void()> done) {
  if (at == moves->size()) return done();
  auto next = [=](const std::shared_ptr<const moved_page>& page) {
    for (const auto& part : self->state.core->seed_changed(*page)) send(part);
    (*moves)[at].from = page->next;
    seed_changed_rows(self, moves, page->more ? at : at + 1, send, done);
  };
  const auto& move = (*moves)[at];
  auto failed = [=](caf::error& e) { disk_failed(self, e); };
  if (move.listed.empty())
    self->request(self->state.disk, caf::infinite, copy_rows_atom::value, move.table, move.from).then(next, failed);
  else
    self->request(self->state.disk, caf::infinite, move_rows_atom::value, move).then(next, failed);
}

// The copy becomes this tail's successor with all that is held here now (whole_copy),
// then every update applied from now on, in order (CAF keeps one sender's order); the
// rows of a disk tier changed since its first pin go first (`parts` now, then those of
// `moves`, from the tier pinned again now, behind every write asked before). Updates
// applied meanwhile wait for the rest of the seed (send_down). Answered once the copy
// took it.
void seed_the_rest(self_ptr self, const shard_options& opts, const shard_actor& copy, std::vector<shard_handoff> parts,
                   std::vector<disk_move> moves, caf::typed_response_promise<std::uint64_t> rp,
                   std::shared_ptr<seed_tally> tally = nullptr) {
  auto& st = self->state;
  if (tally) tally->moment = std::chrono::steady_clock::now();
  const auto seed = block_of(encode_handoff(st.core->whole_copy()));
  follow(self, copy);
  st.successor_unannounced = true;
  st.seeding_copy = static_cast<bool>(st.disk);
  auto failed = std::make_shared<bool>(false);
  std::function<void(const shard_handoff&)> send = [=](const shard_handoff& part) {
    if (tally)
      for (const auto& t : part.rows) tally->changed += t.ids.size();
    self->request(copy, opts.forward_timeout, takeover_atom::value, block_of(encode_handoff(part)))
      .then([](std::uint64_t) {},
            [=](caf::error& e) mutable {
              if (!std::exchange(*failed, true))
                rp.deliver(make_ps_error(self->state.name + ": the new copy did not take its rows: " + describe(e)));
            });
  };
  for (const auto& part : parts) send(part);
  std::function<void()> finish = [=] {
    caf::anon_send(self->state.disk, unpin_rows_atom::value);
    self->state.core->end_precopy();
    if (*failed) return;
    if (tally)
      log_line(log_level::info, self->state.name + ": seeding a new copy: " + std::to_string(tally->pinned) +
                                    " rows from its pinned disk tier in " + ms_since(tally->started) +
                                    " ms while it acknowledged alone, then " + std::to_string(tally->changed) +
                                    " rows changed since, while updates waited " + ms_since(tally->moment) + " ms");
    finish_seed(self, opts, copy, seed, rp);
  };
  if (moves.empty()) return finish();
  auto pending = std::make_shared<std::vector<disk_move>>(std::move(moves));
  self->request(st.disk, caf::infinite, pin_rows_atom::value, std::make_shared<const row_write>())
    .then([=](caf::ok_atom) { seed_changed_rows(self, pending, 0, send, finish); },
          [=](caf::error& e) { disk_failed(self, e); });
}

// The coordinator grows this copy's chain (it is the tail): the new copy takes all that
// is held here (seed_the_rest). With a disk tier the rows go first, in pages of the tier
// pinned now with the RAM tier's changed rows written, while this tail goes on
// acknowledging alone; then the rows changed since, the rest of the seed and the updates
// applied from then on. Answered once the copy took its seed.
caf::result<std::uint64_t> extend_chain(self_ptr self, const shard_options& opts, const caf::actor& next) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet");
  if (st.successor) return make_ps_error(st.name + ": not the tail of its chain");
  if (!next) return make_ps_error(st.name + ": no copy to seed");
  if (st.precopy || st.seeding_ahead)
    return make_ps_error(st.name + ": its disk tier is pinned for another copy; grow the chain once that is over");
  auto copy = caf::actor_cast<shard_actor>(next);
  auto rp = self->make_response_promise<std::uint64_t>();
  if (!st.disk) {
    seed_the_rest(self, opts, copy, {}, {}, rp);
    return rp;
  }
  st.core->begin_seed_copy();
  st.seeding_ahead = copy;
  auto tally = std::make_shared<seed_tally>();
  std::function<void(const std::string&)> failed = [=](const std::string& why) mutable {
    caf::anon_send(self->state.disk, unpin_rows_atom::value);
    if (self->state.seeding_ahead == copy) {
      self->state.seeding_ahead = shard_actor{};
      self->state.core->end_precopy();
    }
    rp.deliver(make_ps_error(self->state.name + ": " + why));
  };
  auto done = [=] {
    caf::anon_send(self->state.disk, unpin_rows_atom::value);
    self->state.seeding_ahead = shard_actor{};
    std::vector<disk_move> listed;
    auto parts = self->state.core->seed_changes(listed);
    seed_the_rest(self, opts, copy, std::move(parts), std::move(listed), rp, tally);
  };
  auto changed = std::make_shared<const row_write>(st.core->rows().dirty_rows());
  self->request(st.disk, caf::infinite, pin_rows_atom::value, changed)
    .then([=](caf::ok_atom) { seed_disk_rows(self, opts, copy, 0, 0, done, failed, tally); },
          [=](caf::error& e) {
            failed("the disk tier failed while seeding a new copy: " + describe(e));
            disk_failed(self, e);
          });
  return rp;
}

caf::actor spawn_replacement(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                             shard_options::replacement what) {
  auto ropts = opts;
  ropts.faults = {};  // a kill names the original shard's process
  ropts.replica = nullptr;
  ropts.replaces = std::make_shared<shard_options::replacement>(std::move(what));
  return caf::actor_cast<caf::actor>(self->spawn(server_shard, coordinator, ropts));
}

}  // namespace ps::shard_internal
