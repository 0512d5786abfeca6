// Handoffs after a map change: the moved keys and rows handed to their new owners (from
// the disk tier in pages), copies made ahead of a join, and a leaver taken over.
#include "actors/shard/shard_internal.hpp"
#include "libps/sim/fault_exit.hpp"
#include "libps/persist/handoff_codec.hpp"

namespace ps::shard_internal {

// One handoff under way (the map changed under this shard): its answer, the new epoch,
// waits until every part was taken. With a disk tier the moved rows come off the disk in
// pages that leave as they are read; the parts themselves leave after the last page (CAF
// keeps one sender's order), as their deferred pushes may touch the pages' rows.
struct handoff_run {
  self_ptr self;
  // Who waits for its answer: the coordinator that asked, and one resumed since that asked again.
  std::vector<caf::typed_response_promise<std::uint64_t>> answers;
  cluster_view view;
  std::vector<shard_handoff> parts;  // sent once no scan is left
  std::size_t scans = 0;             // disk_move scans not finished
  std::vector<disk_move> drops;      // after the scans (shard_effects::drops)
  std::uint64_t rows_sent = 0;       // in its parts and pages
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::size_t untaken = 0;           // parts sent, not taken yet
  bool parts_sent = false, settled = false;
  template <class Answer>
  void settle(const Answer& answer) {
    if (!settled)
      for (auto& p : answers) p.deliver(answer);
    settled = true;
  }
  void fail(const std::string& why) {
    settle(make_ps_error(why));
    release_forwards(self);  // the job ends now (the coordinator sees to it): nothing waits for them
  }
};
using handoff_run_ptr = std::shared_ptr<handoff_run>;

void send_parts(self_ptr self, const handoff_run_ptr& run, std::vector<shard_handoff> parts);

// Sends the parts once the scans are done, answers once they were all taken.
void advance_handoff(self_ptr self, const handoff_run_ptr& run) {
  if (run->settled || run->scans > 0) return;
  if (!run->parts_sent) {
    run->parts_sent = true;
    drop_from_disk(self, std::move(run->drops));
    send_parts(self, run, std::move(run->parts));
    release_forwards(self);
  }
  if (run->untaken != 0) return;
  run->settle(run->view.epoch);
  auto& st = self->state;
  if (!st.disk) return;
  // What moved keys and rows waited for (the cut); what was copied ahead is in the news before.
  log_line(log_level::info, st.name + ": cut of epoch " + std::to_string(run->view.epoch) + ": " +
                                std::to_string(run->rows_sent) + " rows sent, every part taken in " +
                                ms_since(run->started) + " ms");
  st.core->end_precopy();
}

// Each part goes to its taker's head of the moment, and again to its new head should that
// one die first (send_to_owner; a copy that took it from the dead head ignores it). Any
// other failure fails the handoff, and the coordinator ends the job.
void send_parts(self_ptr self, const handoff_run_ptr& run, std::vector<shard_handoff> parts) {
  for (const auto& part : parts) {
    for (const auto& t : part.rows) run->rows_sent += t.ids.size();
    auto block = block_of(encode_handoff(part));
    auto request = [=](const shard_actor& head, std::function<void()> ok, std::function<void(caf::error&)> failed) {
      self->request(head, std::chrono::seconds(60), takeover_atom::value, block).then([ok](std::uint64_t) { ok(); }, failed);
    };
    ++run->untaken;
    auto to = part.to;
    send_to_owner(self, to, request, [=](caf::error e) {
      if (e) return run->fail(self->state.name + ": shard " + std::to_string(to) + " did not take its keys: " + describe(e));
      --run->untaken;
      advance_handoff(self, run);
    });
  }
}

// One page of a scan that takes moved rows off the disk tier, then the next.
void scan_moved_rows(self_ptr self, const handoff_run_ptr& run, disk_move move) {
  self->request(self->state.disk, caf::infinite, move_rows_atom::value, move)
    .then(
      [=](const std::shared_ptr<const moved_page>& page) mutable {
        try {
          send_parts(self, run, self->state.core->rows_moved(*page));
        } catch (const bad_request& e) {
          return run->fail(e.what());
        }
        if (page->more) {
          move.from = page->next;
          return scan_moved_rows(self, run, std::move(move));
        }
        --run->scans;
        advance_handoff(self, run);
      },
      [=](caf::error& e) {
        run->fail(self->state.name + ": the disk tier failed while handing rows over: " + describe(e));
        disk_failed(self, e);
      });
}

// The map changes under this shard (a shard joined or leaves): it adopts `view`'s map
// and hands what moved to each new owner; the answer (the new epoch) waits until every
// taker has taken its part.
// Sends a map change (handoff_atom) down the chain, as pass_down sends updates.
std::function<void(shard_actor, std::uint64_t)> handoff_sender(self_ptr self, const shard_options& opts,
                                                               const cluster_view& view) {
  return chain_sender(self, opts.forward_timeout, handoff_atom::value, view);
}

// What this shard kept as a copy of the last map change is forgotten, its rows deleted
// from its disk: the change is over (another begins). One call of the I/O actor's writer
// per table, so no row a later write puts there is deleted (the rows it keeps are not
// this shard's under that map); deleted rows stop counting as its own.
void forget_kept(self_ptr self) { drop_from_disk(self, std::exchange(self->state.kept, {}).moves); }

// A copy further down a chain adopts the map its predecessor adopted (passed down in
// order with the updates before and after it): what the map moves away is dropped here,
// as its head hands it over; what it gains comes down the chain with the head's
// takeovers. Answered once the rest of the chain has done the same.
caf::result<std::uint64_t> adopt_as_copy(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                         const cluster_view& view) {
  auto& st = self->state;
  if (view.epoch <= st.core->map_epoch()) return view.epoch;  // adopted already
  shard_effects fx;
  forget_kept(self);  // the last change's: it is over
  try {
    // The parts are the head's to send; kept here until the change is over, for this
    // copy to send should it become the head first (the coordinator then asks it).
    st.kept.parts = st.core->hand_off(map_of(view), fx);
  } catch (const bad_request& e) {
    return make_ps_error(e.what());
  }
  st.kept.moves = std::exchange(fx.moves, {});  // scanned should this copy hand them over, after fx.writes
  carry_out(self, opts, coordinator, fx);
  take_view(self, view);
  if (!st.successor) return view.epoch;
  return pass_down(self, handoff_sender(self, opts, view), view.epoch, std::nullopt);
}

// A handoff of `parts` (and, with a disk tier, of the rows `moves` take off the disk);
// answered once every part was taken.
caf::result<std::uint64_t> start_handoff(self_ptr self, const cluster_view& view, std::vector<shard_handoff> parts,
                                         std::vector<disk_move> moves, std::vector<disk_move> drops) {
  auto& st = self->state;
  auto run = std::make_shared<handoff_run>();
  run->self = self;
  run->parts = std::move(parts);
  run->drops = std::move(drops);
  run->answers.push_back(self->make_response_promise<std::uint64_t>());
  run->view = view;
  run->scans = moves.size();
  st.handoff = run;
  st.holding_forwards = run->scans > 0;
  for (auto& m : moves) scan_moved_rows(self, run, std::move(m));  // after the writes carry_out sent
  advance_handoff(self, run);
  return run->answers.front();
}

// Asked for a change this shard has adopted: by a resumed coordinator (answered with the
// handoff under way), or as the new head of a chain whose head died during the change,
// which sends what it kept as a copy (a taker that has a giver's part ignores it).
caf::result<std::uint64_t> hand_off_again(self_ptr self, const cluster_view& view) {
  auto& st = self->state;
  auto under_way = std::static_pointer_cast<handoff_run>(st.handoff);
  if (under_way && !under_way->settled && under_way->view.epoch == view.epoch) {
    under_way->answers.push_back(self->make_response_promise<std::uint64_t>());
    return under_way->answers.back();
  }
  if (st.kept.empty()) return view.epoch;
  take_view(self, view);  // the takers' heads of the moment
  auto kept = std::exchange(st.kept, {});
  return start_handoff(self, view, std::move(kept.parts), std::move(kept.moves));
}

// The fault injector's kill at=handoff: the process ends once the shard's copies adopted
// the change (they keep what it moves), before any part is sent, so the chain's next copy
// must hand it all over.
caf::result<std::uint64_t> die_in_handoff(self_ptr self, const shard_options& opts, const cluster_view& view) {
  const auto why = self->state.name + " was asked to hand keys over (epoch " + std::to_string(view.epoch) +
                   ", --faults: kill server=" + std::to_string(self->state.core->id()) + " at=handoff)";
  if (!self->state.successor) die_abruptly(why);
  send_down(self, {handoff_sender(self, opts, view), {}, view.epoch, [why](caf::error) { die_abruptly(why); }});
  return self->make_response_promise<std::uint64_t>();  // never answered: the process ends
}

// A map change's rows copied ahead by a head with a disk tier: who waits for the
// change's answer, and how many parts of the page in flight are not taken yet.
struct precopy_run {
  cluster_view view;
  std::vector<caf::typed_response_promise<std::uint64_t>> answers;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::size_t untaken = 0;
  std::uint64_t rows = 0;
  bool over = false;
};
using precopy_run_ptr = std::shared_ptr<precopy_run>;

// The copy ahead is over (why: empty when every part was taken): the pin is let go and
// the change's cut made, by asking this shard for it again (the answer goes to all who
// asked meanwhile); the cut sends only what changed since, or everything after a failure.
void end_copy_ahead(self_ptr self, const precopy_run_ptr& run, const std::string& why) {
  if (std::exchange(run->over, true)) return;
  auto& st = self->state;
  caf::anon_send(st.disk, unpin_rows_atom::value);
  if (why.empty()) st.core->precopied();
  else st.core->end_precopy();
  if (why.empty())
    log_line(log_level::info, st.name + ": copied " + std::to_string(run->rows) + " rows ahead of epoch " +
                                  std::to_string(run->view.epoch) + " in " + ms_since(run->started) + " ms");
  else
    log_line(log_level::warning, st.name + ": could not copy rows ahead of epoch " + std::to_string(run->view.epoch) +
                                     " (" + why + "): the cut sends them all");
  st.precopied_epoch = run->view.epoch;
  st.precopy.reset();
  self->request(caf::actor_cast<shard_actor>(self), caf::infinite, handoff_atom::value, run->view)
    .then([run](std::uint64_t epoch) { for (auto& a : run->answers) a.deliver(epoch); },
          [run](caf::error& e) { for (auto& a : run->answers) a.deliver(e); });
}

// The parts of one page, each to its taker's head as the change's map names it; then().
void send_ahead(self_ptr self, const shard_options& opts, const precopy_run_ptr& run, std::vector<shard_handoff> parts,
                std::function<void()> then) {
  if (parts.empty()) return then();
  for (const auto& part : parts) {
    auto entry = std::find_if(run->view.shards.begin(), run->view.shards.end(),
                              [&](const shard_entry& e) { return e.id == part.to; });
    if (entry == run->view.shards.end() || !entry->handle)
      return end_copy_ahead(self, run, "the map names no head for shard " + std::to_string(part.to));
    run->rows += part.rows.front().ids.size();
    ++run->untaken;
    self->request(caf::actor_cast<shard_actor>(entry->handle), opts.forward_timeout, takeover_atom::value,
                  block_of(encode_handoff(part)))
      .then([=](std::uint64_t) {
              if (--run->untaken == 0 && !run->over) then();
            },
            [=](caf::error& e) { end_copy_ahead(self, run, "shard " + std::to_string(part.to) + ": " + describe(e)); });
  }
}

// One page of the pinned disk tier from row `from` of `table`: its rows the change moves
// go ahead, then the next page (one in memory at a time).
void copy_page_ahead(self_ptr self, const shard_options& opts, const precopy_run_ptr& run, std::uint32_t table,
                     std::uint64_t from) {
  self->request(self->state.disk, caf::infinite, copy_rows_atom::value, table, from)
    .then(
      [=](const std::shared_ptr<const moved_page>& page) {
        if (run->over) return;
        std::vector<shard_handoff> parts;
        try {
          parts = self->state.core->precopy_page(*page);
        } catch (const bad_request& e) {
          return end_copy_ahead(self, run, e.what());
        }
        send_ahead(self, opts, run, std::move(parts), [=] {
          if (page->more) return copy_page_ahead(self, opts, run, table, page->next);
          if (table + 1 < self->state.core->num_tables()) return copy_page_ahead(self, opts, run, table + 1, 0);
          end_copy_ahead(self, run, "");
        });
      },
      [=](caf::error& e) {
        end_copy_ahead(self, run, "the disk tier failed: " + describe(e));
        disk_failed(self, e);
      });
}

// A head with a disk tier asked for a map change copies the rows it moves to their new
// owners first, from its disk tier pinned now (with the RAM tier's changed rows written),
// while it goes on serving under its map and notes which of them change; the cut comes
// after (end_copy_ahead), so the moved rows wait only for those. The takers have the new
// map already (a joiner, or the shards that stay when one leaves, which adopt it first).
caf::result<std::uint64_t> copy_ahead(self_ptr self, const shard_options& opts, const cluster_view& view) {
  auto& st = self->state;
  try {
    st.core->begin_precopy(map_of(view));
  } catch (const bad_request& e) {
    return make_ps_error(e.what());
  }
  auto run = std::make_shared<precopy_run>();
  run->view = view;
  run->answers.push_back(self->make_response_promise<std::uint64_t>());
  st.precopy = run;
  auto changed = std::make_shared<const row_write>(st.core->rows().dirty_rows());
  self->request(st.disk, caf::infinite, pin_rows_atom::value, changed)
    .then([=](caf::ok_atom) { copy_page_ahead(self, opts, run, 0, 0); },
          [=](caf::error& e) {
            end_copy_ahead(self, run, "the disk tier failed: " + describe(e));
            disk_failed(self, e);
          });
  return run->answers.front();
}

// Whether a head copies a change's rows ahead: with a disk tier, once per change, and
// not while it seeds a copy (one pin at a time); unless --handoff=cut.
bool copies_ahead(const shard_state& st, const shard_options& opts, const cluster_view& view) {
  return opts.copy_ahead && st.disk && st.core->num_tables() > 0 && st.precopied_epoch < view.epoch && !st.seeding_copy &&
         !st.seeding_ahead;
}

caf::result<std::uint64_t> hand_off(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                    const cluster_view& view) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet, cannot hand keys over");
  // The coordinator asks heads only: a copy it asks became the head before a map told it
  // so (its head died during the change, or did not come back to a resumed coordinator;
  // a shard that left the map gets no more maps).
  const bool from_coordinator = st.coordinator && self->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(st.coordinator);
  if (!st.core->head() && from_coordinator) st.core->set_head(true);
  if (!st.core->head()) return adopt_as_copy(self, opts, coordinator, view);
  if (view.epoch == st.core->map_epoch()) return hand_off_again(self, view);
  if (auto ahead = std::static_pointer_cast<precopy_run>(st.precopy); ahead && ahead->view.epoch == view.epoch) {
    ahead->answers.push_back(self->make_response_promise<std::uint64_t>());
    return ahead->answers.back();
  }
  forget_kept(self);  // before this change's scans: they would find those rows too
  if (copies_ahead(st, opts, view)) return copy_ahead(self, opts, view);
  std::vector<shard_handoff> parts;
  shard_effects fx;
  try {
    parts = st.core->hand_off(map_of(view), fx);
  } catch (const bad_request& e) {
    return make_ps_error(e.what());
  }
  auto moves = std::move(fx.moves);
  auto drops = std::move(fx.drops);
  carry_out(self, opts, coordinator, fx);  // parked pulls of moved keys fail (errc::moved); moved rows go to disk
  take_view(self, view);
  if (parts.empty() && moves.empty()) {  // it gives nothing: answered once its copies have the map too
    drop_from_disk(self, std::move(drops));
    if (!st.successor) return view.epoch;
    return pass_down(self, handoff_sender(self, opts, view), view.epoch, std::nullopt);
  }
  // Its copies adopt the map in order with its updates: they stop serving what moved,
  // and keep it until the change is over (adopt_as_copy). Their answer is not waited for
  // (it is the parts' takers'); a new successor gets it again (follow).
  if (st.dies_in_handoff) return die_in_handoff(self, opts, view);
  if (st.successor) send_down(self, {handoff_sender(self, opts, view), {}, view.epoch, [](caf::error) {}});
  return start_handoff(self, view, std::move(parts), std::move(moves), std::move(drops));
}

// A giver's part: this shard now owns it.
caf::result<std::uint64_t> take_over(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                                     const encoded_block& block) {
  auto& st = self->state;
  if (!st.core) return make_ps_error(st.name + ": not configured yet, cannot take keys over");
  if (!block.bytes) return make_ps_error(st.name + ": a handoff without bytes");
  shard_effects fx;
  try {
    auto h = decode_handoff(std::string(reinterpret_cast<const char*>(block.bytes->data()), block.bytes->size()));
    fx = st.core->take_over(h);
  } catch (const bad_request& e) {
    return make_ps_error(st.name + ": " + e.what());
  }
  carry_out(self, opts, coordinator, fx);
  if (!st.successor) return st.core->epoch();
  // Down the chain, in order: every copy holds what this shard took before the giver hears.
  return pass_down(self, chain_sender(self, std::chrono::seconds(60), takeover_atom::value, block), st.core->epoch(),
                   std::nullopt);
}

// A checkpoint's cut at `boundary`: 0 once agreed, else this shard's minimum clock (it
// passed the boundary already: the coordinator proposes a later one).
std::uint64_t cut_at(self_ptr self, std::uint64_t boundary) {
  if (!self->state.core || self->state.core->checkpoint_at(boundary)) return 0;
  return self->state.core->min_clock();
}

// Parked pulls that waited longer than the park limit fail; the next sweep is scheduled.
void sweep(self_ptr self, const shard_options& opts) {
  self->state.sweep_scheduled = false;
  feed(self, opts, self->state.coordinator, [&](shard_core& c) { return c.expire(self->clock().now(), opts.park_limit); });
  schedule_sweep(self, opts);
}

}  // namespace ps::shard_internal
