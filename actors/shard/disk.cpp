// The disk tier's work: the core's disk effects carried out by the I/O actor, reads of
// evicted rows, checkpoint parts, sweeps and dropped rows.
#include "actors/shard/shard_internal.hpp"
#include "libps/sim/fault_exit.hpp"

namespace ps::shard_internal {

void carry_out(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, shard_effects& fx);

void disk_failed(self_ptr self, const caf::error& e) {
  std::fprintf(stderr, "%s: the disk tier failed: %s\n", self->state.name.c_str(), describe(e).c_str());
  self->quit(e);
}

void read_from_disk(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                    std::shared_ptr<const std::vector<row_key>> keys);

// The disk tier's work: evicted rows to write, rows to read (no order needed between
// them: a row is read only when no write of it is under way).
void send_disk_work(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, shard_effects& fx) {
  auto& st = self->state;
  for (auto& w : fx.writes)
    self->request(st.disk, caf::infinite, write_rows_atom::value, std::move(w))
      .then(
        [=](std::uint64_t seq) {
          auto next = self->state.core->rows_written(seq);
          carry_out(self, opts, coordinator, next);
        },
        [=](caf::error& e) { disk_failed(self, e); });
  for (const auto& s : fx.sweeps)
    self->request(st.disk, caf::infinite, sweep_rows_atom::value, s)
      .then(
        [=](const std::shared_ptr<const swept_page>& page) {
          auto next = self->state.core->rows_swept(s, *page);
          carry_out(self, opts, coordinator, next);
        },
        [=](caf::error& e) { disk_failed(self, e); });
  // One read: the I/O actor spreads its keys over the idle readers (actors/row_io.hpp).
  if (!fx.reads.empty())
    read_from_disk(self, opts, coordinator, std::make_shared<const std::vector<row_key>>(std::move(fx.reads)));
}

void read_from_disk(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator,
                    std::shared_ptr<const std::vector<row_key>> keys) {
  self->request(self->state.disk, caf::infinite, read_rows_atom::value, std::move(keys))
    .then(
      [=](std::shared_ptr<const disk_rows>& got) {
        shard_effects next;
        try {
          next = self->state.core->rows_loaded(*got->keys, got->found, got->rows, got->pushed);
        } catch (const bad_request& e) {
          disk_failed(self, make_ps_error(e.what()));
          return;
        }
        carry_out(self, opts, coordinator, next);
      },
      [=](caf::error& e) { disk_failed(self, e); });
}

// This shard's part of the checkpoint at `clock`: its parameters and its rows. Rows on a
// disk tier are saved by the I/O actor (after the writes before them) into the
// checkpoint's directory, and the part, naming that directory, follows.
void send_checkpoint_part(self_ptr self, std::uint64_t clock) {
  auto& st = self->state;
  shard_snapshot part{st.core->id(), st.core->store().snapshot(), {}, {}, 0};
  part.sightings = st.core->rows().sightings();
  if (!st.disk) {
    part.tables = st.core->table_snapshot();
    caf::anon_send(st.checkpointer, snapshot_atom::value, part.shard, clock, st.core->epoch(), snapshot_block(part));
    return;
  }
  part.disk_rows = disk_rows_name(clock, part.shard);
  part.disk_row_count = st.core->rows().rows_live();
  part.disk_table_rows = st.core->rows().live_rows();
  auto into = (std::filesystem::path(st.checkpoint_dir) / part.disk_rows).string();
  auto changed = std::make_shared<const row_write>(st.core->rows().dirty_rows());
  auto epoch = st.core->epoch();
  self->request(st.disk, caf::infinite, save_rows_atom::value, changed, into)
    .then([=](caf::ok_atom) { caf::anon_send(self->state.checkpointer, snapshot_atom::value, part.shard, clock, epoch,
                                             snapshot_block(part)); },
          [=](caf::error& e) { disk_failed(self, e); });
}

// Carries out what the core left to do.
void carry_out(self_ptr self, const shard_options& opts, const coordinator_actor& coordinator, shard_effects& fx) {
  auto& st = self->state;
  for (const auto& e : fx.traces) st.trace(e);
  if (!fx.writes.empty() || !fx.reads.empty() || !fx.sweeps.empty()) send_disk_work(self, opts, coordinator, fx);
  for (auto id : fx.applied)
    if (auto it = st.push_waiters.find(id); it != st.push_waiters.end()) {
      auto reply = std::move(it->second);
      st.push_waiters.erase(it);
      reply();
    }
  if (fx.checkpoint_at && st.checkpointer) send_checkpoint_part(self, *fx.checkpoint_at);
  for (const auto& loss : fx.losses) caf::anon_send(coordinator, loss_atom::value, loss);
  if (fx.die) die_abruptly(*fx.die);
  for (auto token : fx.answer) answer_pull(self, opts, token);
  await_store_writes(self);
  for (auto& [token, why] : fx.fail) {
    if (auto it = st.pulls.find(token); it != st.pulls.end()) {
      it->second.promise.deliver(refusal(self, it->second.hdr, why));
      st.pulls.erase(it);
    }
    st.core->forget_pull(token);
  }
}

// While pulls are parked, wakes when the oldest reaches the park limit, so its
// explanation always beats the client's own timeout (the limit is 90% of it).
void schedule_sweep(self_ptr self, const shard_options& opts) {
  auto& st = self->state;
  if (st.sweep_scheduled || !st.core) return;
  auto due = st.core->next_expiry(opts.park_limit);
  if (!due) return;
  st.sweep_scheduled = true;
  auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(*due - self->clock().now());
  self->delayed_send(self, std::max(wait, std::chrono::milliseconds(1)), sweep_atom::value);
}

// Deletes the rows each move picks from the disk tier, in one call of its I/O writer per
// table (after the writes and takes asked before), and stops counting them as this shard's.
void drop_from_disk(self_ptr self, std::vector<disk_move> drops) {
  for (auto& move : drops) {
    const auto table = move.table;
    self->request(self->state.disk, caf::infinite, drop_rows_atom::value, std::move(move))
      .then([=](std::uint64_t dropped) { self->state.core->dropped_from_disk(table, dropped); },
            [=](caf::error& e) { disk_failed(self, e); });
  }
}

}  // namespace ps::shard_internal
