// shard_core: its state restored and checked, ownership and staleness, losses, and the
// clock (ticks, joins and leaves, checkpoints, release of deferred writes, row expiry).
#include "libps/core/shard_core.hpp"

#include <algorithm>

#include "libps/core/shard_store.hpp"

namespace ps {

namespace {

partitioner map_of(const shard_config& c) {
  partitioner map(c.epoch, c.shard_ids, c.vnodes, c.bucket_bits, c.dense);
  return c.placement.empty() ? map : map.with_placement(c.placement);
}

}  // namespace

shard_core::shard_core(shard_config cfg, std::unique_ptr<param_store> store)
    : id_(cfg.id),
      name_(cfg.name.empty() ? "shard " + std::to_string(cfg.id) : cfg.name),
      map_(map_of(cfg)),
      state_slots_(cfg.rule.state_slots()),
      store_(store ? std::move(store) : std::make_unique<shard_store>(cfg.rule)),
      consistency_(cfg.num_workers, cfg.staleness),
      rows_(std::move(cfg.tables), cfg.shard_memory, cfg.eviction),
      view_epoch_(cfg.epoch),
      checkpoint_every_(cfg.checkpoint_every),
      sends_checkpoints_(cfg.sends_checkpoints),
      kill_at_(cfg.kill_at),
      head_(cfg.head),
      write_backlog_bytes_(cfg.write_backlog_bytes) {
  restore(cfg.restored, cfg.restored_rows);
  restore_counts(cfg.restored_disk_table_rows, cfg.restored_disk_rows, cfg.restored_sightings);
}

void shard_core::restore_counts(const std::vector<std::uint64_t>& disk_table_rows, std::uint64_t disk_rows,
                                const std::vector<std::uint16_t>& sightings) {
  rows_.restored_on_disk(disk_table_rows, disk_rows);
  rows_.restore_sightings(sightings);
}

void shard_core::restore(const std::vector<stored_segment>& segments, const std::vector<table_rows>& rows) {
  if (!segments.empty()) store_->restore(segments);
  for (const auto& t : rows) rows_.restore(t.table, t.stride, t.ids, t.rows);
}

deferred_update shard_core::to_update(const deferred_push& d) const {
  return {d.req.epoch, d.req.worker, d.req.clock, d.req.seq, d.ranges, d.values, d.table, d.ids};
}

shard_core::deferred_push shard_core::from_update(const deferred_update& u) {
  return {{u.epoch, u.worker, u.clock, u.seq, 0}, u.ranges, u.values, u.table, u.ids};
}

bool shard_core::touches_other_shards(const pending_pull& p, const partitioner& next) const {
  if (p.table) return std::any_of(p.ids.begin(), p.ids.end(), [&](std::uint64_t id) { return next.row_owner(*p.table, id) != id_; });
  return next.first_not_owned(p.ranges, id_).has_value();
}

shard_handoff shard_core::whole_copy() const {
  shard_handoff h{id_, id_, took_over_at_, store_->snapshot(), {}, {}, consistency_.clocks().values(),
                  applied_, highest_clock_, rows_.sightings()};
  if (!rows_.tiered()) h.rows = table_snapshot();
  for (const auto& d : deferred_) h.deferred.push_back(to_update(d));
  // Pushes queued behind disk reads are not applied here yet, and come from no one else:
  // the copy applies them as deferred ones.
  for (const auto& op : row_queue_)
    if (op.what == row_op::kind::push) h.deferred.push_back(to_update({op.req, {}, op.grads, op.table, op.ids}));
  h.whole = true;
  h.merges = took_over_ || was_in_map_;
  return h;
}

bool shard_core::owns(const std::vector<key_range>& ranges) const { return !map_.first_not_owned(ranges, id_); }

bool shard_core::owns_rows(std::uint32_t table, const std::vector<std::uint64_t>& ids) const {
  return std::all_of(ids.begin(), ids.end(), [&](std::uint64_t id) { return map_.row_owner(table, id) == id_; });
}

std::map<std::uint32_t, deferred_update> shard_core::route_stale(const deferred_update& u) const {
  if (u.epoch >= map_.epoch()) return {};
  std::uint32_t dim = 0;
  if (u.table) {
    if (*u.table >= rows_.num_tables()) return {};
    dim = rows_.table(*u.table).spec().dim;
    if (u.values.size() != u.ids.size() * dim) return {};
  } else {
    for (std::size_t i = 0; i < u.ranges.size(); ++i)
      if (u.ranges[i].empty() || (i > 0 && u.ranges[i].begin < u.ranges[i - 1].end)) return {};
    if (count_keys(u.ranges) != u.values.size()) return {};
  }
  auto parts = split_by_owner(u, map_, dim);
  if (parts.size() == 1 && parts.begin()->first == id_) return {};
  return parts;
}

std::vector<table_rows> shard_core::table_snapshot() const {
  std::vector<table_rows> out;
  for (std::uint32_t i = 0; i < rows_.num_tables(); ++i) {
    const auto& table = rows_.table(i);
    std::vector<std::pair<std::uint64_t, const float*>> held;
    table.for_each_row([&](std::uint64_t id, const float* row, bool, std::uint64_t) { held.emplace_back(id, row); });
    std::sort(held.begin(), held.end());
    table_rows t{i, static_cast<std::uint32_t>(table.stride()), {}, {}};
    t.ids.reserve(held.size());
    t.rows.reserve(held.size() * table.stride());
    for (const auto& [id, row] : held) {
      t.ids.push_back(id);
      t.rows.insert(t.rows.end(), row, row + table.stride());
    }
    out.push_back(std::move(t));
  }
  return out;
}

void shard_core::start_as_replacement(std::uint64_t clock, const std::vector<std::uint32_t>& departed) {
  auto& clocks = consistency_.clocks();
  for (std::uint32_t w = 0; w < clocks.size(); ++w) clocks.advance(w, clock);
  for (auto w : departed) clocks.leave(w);
  last_min_ = clock;
  restored_clock_ = clock;
  loss_reported_.assign(clocks.size(), false);
}

// Ownership stays fixed across failovers (a shard id keeps its keys, only its address
// changes), so older epochs are fine; a newer one means a map this shard never got.
std::string shard_core::check(const shard_request& r, const std::vector<key_range>& ranges) const {
  if (r.epoch > view_epoch_)
    return name_ + ": request from worker " + std::to_string(r.worker) + " has epoch " + std::to_string(r.epoch) +
           ", current epoch is " + std::to_string(view_epoch_);
  try {
    check_ownership(map_, id_, ranges);
  } catch (const bad_request& e) {
    return name_ + ": " + e.what();
  }
  return {};
}

std::string describe(const update_loss& loss, const std::string& shard_name) {
  std::string text = shard_name + ": worker " + std::to_string(loss.worker) + ": ";
  if (loss.lost_clocks == 0) return text + "no update lost (lost_clocks=0)";
  return text + "updates of clocks " + std::to_string(loss.from_clock) + ".." +
         std::to_string(loss.from_clock + loss.lost_clocks - 1) + " were lost with the dead shard (lost_clocks=" +
         std::to_string(loss.lost_clocks) + ")" +
         (loss.at_most ? ", at most: the checkpoint may hold some of them (SSP/ASP)" : "");
}

// A replacement shard: the first push of each worker shows which of its updates died
// with the old shard (clocks from the checkpoint's up to this one).
void shard_core::report_loss(const shard_request& r, shard_effects& fx) {
  if (!restored_clock_ || r.worker >= loss_reported_.size() || loss_reported_[r.worker]) return;
  loss_reported_[r.worker] = true;
  auto from = *restored_clock_;
  // Under SSP/ASP pushes are applied on arrival, so the checkpoint may hold some.
  fx.losses.push_back({id_, r.worker, from, r.clock > from ? r.clock - from : 0, consistency_.staleness() > 0});
}

// A worker that has left (finished, or declared dead) changes nothing any more: a push
// of a dead worker still on its way when its departure was announced would otherwise
// land behind reads that were told it was gone (under BSP, reads that are exact). The
// head decides; copies apply what it passes down.
std::string shard_core::departed(const shard_request& r) const {
  const auto& clocks = consistency_.clocks();
  if (!head_ || r.worker >= clocks.size() || clocks.live(r.worker)) return {};
  return name_ + ": push from worker " + std::to_string(r.worker) + " refused: it has left the job (finished or died)";
}

shard_effects shard_core::tick(const shard_request& r) {
  return checked(r, {}, [&](shard_effects& fx) { advance(r, fx); });
}

// Worker r.worker completed r.clock iterations (left_clock: it is done). Throws
// bad_request for a worker this shard does not know.
void shard_core::advance(const shard_request& r, shard_effects& fx) {
  auto& clocks = consistency_.clocks();
  if (r.epoch < took_over_at_) {  // planned before this shard took keys over: see took_over_at_
  } else if (r.clock == left_clock) {  // the worker is done: it leaves, behind its last pushes
    if (r.worker < clocks.size() && clocks.live(r.worker)) {
      clocks.leave(r.worker);
      fx.traces.push_back({trace_event::leave, r.worker, 0, id_, 0, 0});
    }
  } else if (r.worker >= clocks.size()) {
    clocks.advance(r.worker, r.clock);  // refused, naming the unknown worker
  } else if (clocks.live(r.worker) && r.clock > clocks.clock(r.worker)) {
    clocks.advance(r.worker, r.clock);
    highest_clock_ = std::max(highest_clock_, r.clock);
  }  // else: a tick seen before (resent after a failover), or from a worker that left
  release(fx);
}

shard_effects shard_core::leave(std::uint32_t worker) {
  shard_effects fx;
  if (worker >= consistency_.clocks().size()) return fx;
  consistency_.clocks().leave(worker);
  fx.traces.push_back({trace_event::leave, worker, 0, id_, 0, 0});
  release(fx);
  return fx;
}

std::uint64_t shard_core::join(std::uint32_t worker) {
  auto& clocks = consistency_.clocks();
  auto min = clocks.min_clock();
  if (min == left_clock) min = last_min_;  // nobody live: where the last one left off
  try {
    clocks.join(worker, min);
  } catch (const bad_request& e) {
    throw bad_request(name_ + ": " + e.what());
  }
  if (restored_clock_) loss_reported_.resize(clocks.size(), true);
  return min;
}

bool shard_core::checkpoint_at(std::uint64_t boundary) {
  if (boundary <= last_min_) return false;
  checkpoint_at_.insert(boundary);
  return true;
}

shard_effects shard_core::final_checkpoint(std::uint64_t clock) {
  shard_effects fx;
  if (!head_ || !sends_checkpoints_) return fx;
  if (row_queue_.empty())
    fx.checkpoint_at = clock;
  else
    row_queue_.push_back({row_op::kind::checkpoint, {0, 0, clock, 0, 0}});
  return fx;
}

// After the minimum clock may have moved: apply the pushes it completes, send the
// checkpoint part of a boundary it crossed, then answer the reads it lets through.
void shard_core::release(shard_effects& fx) {
  std::vector<deferred_push> keep;
  for (auto& d : deferred_) {
    if (consistency_.defers_push(d.req.clock)) {
      keep.push_back(std::move(d));
      continue;
    }
    if (d.table) {
      push_rows_now(d.req, *d.table, d.ids, d.values.data(), true, fx);  // traced when applied
      continue;
    }
    store_->push(d.ranges, d.values.data(), d.values.size());  // checked on arrival
    if (head_) fx.traces.push_back({trace_event::push, d.req.worker, d.req.clock, id_, 0, 0, 0, d.req.epoch < map_.epoch()});
  }
  deferred_ = std::move(keep);
  // Every update below a boundary the minimum clock crossed is applied (exactly those
  // under BSP), so the store now is this shard's part of the snapshot at that clock.
  auto min = consistency_.clocks().min_clock();
  bool boundary = min != left_clock &&
                  ((checkpoint_every_ > 0 && min / checkpoint_every_ > last_min_ / checkpoint_every_) ||
                   (!checkpoint_at_.empty() && *checkpoint_at_.begin() <= min));
  if (min != left_clock) checkpoint_at_.erase(checkpoint_at_.begin(), checkpoint_at_.upper_bound(min));
  if (head_ && sends_checkpoints_ && boundary) {
    if (row_queue_.empty()) fx.checkpoint_at = min;
    else  // pushes of clocks below it still wait for disk reads: the part follows them
      row_queue_.push_back({row_op::kind::checkpoint, {0, 0, min, 0, 0}});
  }
  if (min != left_clock) {
    last_min_ = min;
    fx.sweeps = rows_.expire(min);
    if (auto w = rows_.trim(front_.keep_from)) fx.writes.push_back(std::move(w));  // deletes of rows dropped from RAM
  }
  if (kill_at_ && min != left_clock && min >= *kill_at_) {  // the process ends: no read is answered
    fx.die = name_ + " reached clock " + std::to_string(min) + " (--faults: kill server=" + std::to_string(id_) +
             " at=" + std::to_string(*kill_at_) + ")";
    return;
  }
  for (auto& p : parked_.release(consistency_)) answer_pull(p.token, fx);
}

shard_effects shard_core::expire(time_point now, std::chrono::milliseconds limit) {
  shard_effects fx;
  auto expired = parked_.release_if([&](const parked& p) { return now - p.since >= limit; });
  const auto& clocks = consistency_.clocks();
  for (auto& p : expired) {
    const auto& req = pulls_.at(p.token).req;
    auto slow = clocks.slowest();
    std::string whom = slow < clocks.size()
                         ? "worker " + std::to_string(slow) + " is at clock " + std::to_string(clocks.clock(slow))
                         : "no worker is live";
    fx.fail.emplace_back(p.token, name_ + ": pull at clock " + std::to_string(req.clock) + " by worker " +
                                    std::to_string(req.worker) + " waited " + std::to_string(limit.count()) +
                                    " ms for the minimum clock to reach " +
                                    std::to_string(consistency_.needed_min(req.clock)) + " (staleness " +
                                    staleness_to_string(consistency_.staleness()) + "): " + whom);
  }
  return fx;
}

std::optional<shard_core::time_point> shard_core::next_expiry(std::chrono::milliseconds limit) const {
  std::optional<time_point> oldest;
  parked_.for_each([&](const parked& p) {
    if (!oldest || p.since < *oldest) oldest = p.since;
  });
  if (!oldest) return std::nullopt;
  return *oldest + limit;
}

const std::vector<key_range>& shard_core::pull_ranges(std::uint64_t token) const { return pulls_.at(token).ranges; }
void shard_core::forget_pull(std::uint64_t token) { pulls_.erase(token); }

void check_ownership(const partitioner& map, std::uint32_t id, const std::vector<key_range>& ranges) {
  // Empty and inverted ranges hold no keys to check; the store reports them as malformed.
  if (auto foreign = map.first_not_owned(ranges, id))
    throw bad_request("keys " + to_string(ranges[foreign->range]) + " belong to shard " + std::to_string(foreign->owner) +
                      " (epoch " + std::to_string(map.epoch()) + "), not to this one");
}

}  // namespace ps
