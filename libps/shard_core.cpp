#include "libps/shard_core.hpp"

#include <algorithm>

#include "libps/shard_store.hpp"

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

namespace {
// Rows `ids` of `table` (stride floats each in `rows`) cut by the owner `map` gives each.
std::map<std::uint32_t, table_rows> rows_by_owner(std::uint32_t table, std::uint32_t stride,
                                                  const std::vector<std::uint64_t>& ids, const std::vector<float>& rows,
                                                  const partitioner& map) {
  std::map<std::uint32_t, table_rows> out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto& part = out.try_emplace(map.row_owner(table, ids[i]), table_rows{table, stride, {}, {}}).first->second;
    part.ids.push_back(ids[i]);
    part.rows.insert(part.rows.end(), rows.begin() + static_cast<std::ptrdiff_t>(i * stride),
                     rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * stride));
  }
  return out;
}
}  // namespace

void shard_core::hand_off_rows(const partitioner& next, const std::function<shard_handoff&(std::uint32_t)>& to) {
  for (std::uint32_t t = 0; t < rows_.num_tables(); ++t) {
    auto leaving = rows_.take_rows(t, [&](std::uint64_t id) { return next.row_owner(t, id) != id_; });
    for (auto& [owner, rows] : rows_by_owner(t, leaving.stride, leaving.ids, leaving.rows, next))
      to(owner).rows.push_back(std::move(rows));
  }
}

void shard_core::hand_off_deferred(const partitioner& next, const std::function<shard_handoff&(std::uint32_t)>& to) {
  std::vector<deferred_push> kept;
  for (const auto& d : deferred_) {
    auto dim = d.table ? rows_.table(*d.table).spec().dim : 0;
    for (auto& [owner, part] : split_by_owner(to_update(d), next, dim)) {
      if (owner == id_) kept.push_back(from_update(part));
      else to(owner).deferred.push_back(std::move(part));
    }
  }
  deferred_ = std::move(kept);
}

void shard_core::split_row_queue(const partitioner& next, const std::function<shard_handoff&(std::uint32_t)>& to,
                                 shard_effects& fx) {
  std::deque<row_op> kept;
  for (auto& op : row_queue_) {
    if (op.what == row_op::kind::pull || op.what == row_op::kind::key_pull) {
      if (touches_other_shards(pulls_.at(op.token), next)) {
        fx.fail.emplace_back(op.token, name_ + ": rows of this pull moved to another shard (epoch " +
                                           std::to_string(next.epoch()) + "): send it again by the new map");
        continue;
      }
    } else if (op.what == row_op::kind::push) {
      auto parts = split_by_owner(to_update({op.req, {}, op.grads, op.table, op.ids}), next,
                                  rows_.table(op.table).spec().dim);
      auto own = parts.extract(id_);
      for (auto& [owner, part] : parts) to(owner).deferred.push_back(std::move(part));
      if (own.empty()) {  // all of it moved: acknowledged now, its new owners apply it
        if (op.ack != 0) fx.applied.push_back(op.ack);
        continue;
      }
      op.ids = std::move(own.mapped().ids);
      op.grads = std::move(own.mapped().values);
    }
    kept.push_back(std::move(op));
  }
  row_queue_ = std::move(kept);
  front_ = {};  // the front may have changed: its rows are looked at afresh
}

void shard_core::hand_off_tiered(const partitioner& next, const std::function<shard_handoff&(std::uint32_t)>& to,
                                 shard_effects& fx, std::vector<shard_handoff>& pages) {
  split_row_queue(next, to, fx);
  auto map = std::make_shared<const partitioner>(next);
  auto was = std::make_shared<const partitioner>(map_);
  const auto self = id_;
  const bool ahead = copied_ahead(next.epoch());
  std::vector<table_rows> from_ram;  // copied ahead: the changed rows in RAM go from there
  auto is_changed = [&](const row_key& k) { return precopy_->changed.count(k) != 0; };
  if (auto w = rows_.flush_moved([&](const row_key& k) { return map->row_owner(k.table, k.id) != self; }, is_changed,
                                 ahead ? &from_ram : nullptr))
    fx.writes.push_back(std::move(w));
  for (const auto& rows : from_ram) {
    for (auto& h : changed_pages(rows, next)) pages.push_back(std::move(h));
    for (auto id : rows.ids) precopy_->changed.erase({rows.table, id});  // the rest are taken from the disk
  }
  // Only rows this shard owned until now move: a row on its disk that it did not own is
  // left over (a copy's of an earlier change, not yet dropped), never newer than its owner's.
  auto on_disk = ahead ? changed_on_disk() : std::map<std::uint32_t, std::vector<std::uint64_t>>{};
  for (std::uint32_t t = 0; t < rows_.num_tables(); ++t) {
    disk_move move{t, 0, [map, was, t, self](std::uint64_t id) {
                     return was->row_owner(t, id) == self && map->row_owner(t, id) != self;
                   }};
    if (!ahead) {
      fx.moves.push_back(std::move(move));
      continue;
    }
    // Copied ahead: the rows changed since are taken by id, the rest deleted after; or,
    // when many changed, all taken by the scan (rows_moved sends only the changed ones).
    auto changed = std::move(on_disk[t]);
    if (scans_instead(t, changed.size())) {
      fx.moves.push_back(std::move(move));
      continue;
    }
    if (!changed.empty()) fx.moves.push_back({t, 0, {}, std::move(changed)});
    fx.drops.push_back(std::move(move));
  }
  drain_rows(fx);  // the queue's front may have lost what it waited for
}

std::uint32_t shard_core::page_stride(const moved_page& page) const {
  const auto stride = static_cast<std::uint32_t>(rows_.table(page.table).stride());
  if (page.rows.size() != page.ids.size() * stride)
    throw bad_request(name_ + ": a page of rows from its disk tier holds " + std::to_string(page.rows.size()) +
                      " floats for " + std::to_string(page.ids.size()) + " rows of " + std::to_string(stride));
  return stride;
}

std::vector<shard_handoff> shard_core::pages_by_owner(std::uint32_t table, std::uint32_t stride,
                                                     const std::vector<std::uint64_t>& ids, const std::vector<float>& rows,
                                                     const partitioner& map, bool again) const {
  std::vector<shard_handoff> parts;
  for (auto& [owner, owned] : rows_by_owner(table, stride, ids, rows, map)) {
    parts.emplace_back();
    auto& h = parts.back();
    h.from = id_, h.to = owner, h.epoch = map.epoch(), h.rows_only = true, h.again = again;
    h.rows.push_back(std::move(owned));
  }
  return parts;
}

std::vector<shard_handoff> shard_core::rows_moved(const moved_page& page) {
  const auto stride = page_stride(page);
  rows_.moved_from_disk(page.table, page.ids.size());
  if (!copied_ahead(map_.epoch()))
    return pages_by_owner(page.table, stride, page.ids, page.rows, map_, false);
  return changed_pages({page.table, stride, page.ids, page.rows}, map_);  // the listed take's
}

std::array<table_rows, 2> shard_core::split_changed(const table_rows& rows) const {
  // Rows created since the precopy began count at the taker as new; the others it had
  // from the precopy (`again`).
  std::array<table_rows, 2> out{table_rows{rows.table, rows.stride, {}, {}}, table_rows{rows.table, rows.stride, {}, {}}};
  for (std::size_t i = 0; i < rows.ids.size(); ++i) {
    auto it = precopy_->changed.find({rows.table, rows.ids[i]});
    if (it == precopy_->changed.end()) continue;
    auto& to = out[it->second ? 0 : 1];
    to.ids.push_back(rows.ids[i]);
    to.rows.insert(to.rows.end(), rows.rows.begin() + static_cast<std::ptrdiff_t>(i * rows.stride),
                   rows.rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * rows.stride));
  }
  return out;
}

std::vector<shard_handoff> shard_core::changed_pages(const table_rows& rows, const partitioner& map) const {
  auto split = split_changed(rows);
  auto parts = pages_by_owner(rows.table, rows.stride, split[0].ids, split[0].rows, map, false);
  for (auto& h : pages_by_owner(rows.table, rows.stride, split[1].ids, split[1].rows, map, true)) parts.push_back(std::move(h));
  return parts;
}

void shard_core::begin_seed_copy() {
  if (!rows_.tiered()) throw bad_request(name_ + ": a seed copied ahead needs a disk tier");
  precopy_ = precopy{std::nullopt, false, {}, false};
}

std::vector<shard_handoff> shard_core::seed_parts(std::array<table_rows, 2> rows) const {
  std::vector<shard_handoff> parts;
  for (int again = 0; again < 2; ++again) {
    if (rows[again].ids.empty()) continue;
    auto h = seed_rows({rows[again].table, rows[again].ids, rows[again].rows, false, 0});
    h.again = again == 1;
    parts.push_back(std::move(h));
  }
  return parts;
}

std::vector<shard_handoff> shard_core::seed_changes(std::vector<disk_move>& listed) {
  if (!precopy_ || precopy_->next || precopy_->seed_cut) throw bad_request(name_ + ": no seed copied ahead under way");
  precopy_->seed_cut = true;
  std::vector<shard_handoff> parts;
  for (const auto& rows : rows_.copy_held([&](const row_key& k) { return precopy_->changed.count(k) != 0; })) {
    for (auto& h : seed_parts(split_changed(rows))) parts.push_back(std::move(h));
    for (auto id : rows.ids) precopy_->changed.erase({rows.table, id});
  }
  // The rest are on the disk, or in writes under way that land before the pin these
  // reads are made from: read by id, or, when many, by scanning the table (listed empty).
  for (auto& [table, ids] : changed_on_disk()) {
    disk_move move{table, 0, {}, {}};
    if (!scans_instead(table, ids.size())) move.listed = std::move(ids);
    move.keep = true;
    listed.push_back(std::move(move));
  }
  return parts;
}

std::map<std::uint32_t, std::vector<std::uint64_t>> shard_core::changed_on_disk() const {
  std::map<std::uint32_t, std::vector<std::uint64_t>> out;
  for (const auto& [key, created] : precopy_->changed) out[key.table].push_back(key.id);
  for (auto& [table, ids] : out) std::sort(ids.begin(), ids.end());
  return out;
}

bool shard_core::scans_instead(std::uint32_t table, std::size_t changed) const {
  // A read by id costs a random read of the device; a scan reads the table in order, at
  // many times that rate.
  return changed * 8 > rows_.live_rows().at(table);
}

std::vector<shard_handoff> shard_core::seed_changed(const moved_page& page) const {
  return seed_parts(split_changed({page.table, page_stride(page), page.ids, page.rows}));
}

void shard_core::begin_precopy(const partitioner& next) {
  if (!rows_.tiered()) throw bad_request(name_ + ": a precopy needs a disk tier");
  if (next.epoch() <= map_.epoch())
    throw bad_request(name_ + ": a precopy needs a newer map than epoch " + std::to_string(map_.epoch()));
  precopy_ = precopy{next, false, {}, false};
}

std::vector<shard_handoff> shard_core::precopy_page(const moved_page& page) const {
  const auto stride = page_stride(page);
  if (!precopy_ || !precopy_->next) throw bad_request(name_ + ": a precopy page without a precopy");
  const auto& next = *precopy_->next;
  std::vector<std::uint64_t> ids;
  std::vector<float> rows;
  for (std::size_t i = 0; i < page.ids.size(); ++i) {
    const auto id = page.ids[i];
    if (map_.row_owner(page.table, id) != id_ || next.row_owner(page.table, id) == id_) continue;
    ids.push_back(id);
    rows.insert(rows.end(), page.rows.begin() + static_cast<std::ptrdiff_t>(i * stride),
                page.rows.begin() + static_cast<std::ptrdiff_t>((i + 1) * stride));
  }
  return pages_by_owner(page.table, stride, ids, rows, next, false);
}

void shard_core::precopied() {
  if (precopy_) precopy_->complete = true;
}

void shard_core::note_precopied_change(std::uint32_t table, std::span<const std::uint64_t> ids, bool created) {
  if (!precopy_ || precopy_->seed_cut) return;
  const auto& next = precopy_->next;
  if (next && next->epoch() <= map_.epoch()) return;  // the cut was made
  for (auto id : ids)
    if (!next || next->row_owner(table, id) != id_) precopy_->changed.try_emplace({table, id}, created);
}

shard_handoff shard_core::seed_rows(const moved_page& page) const {
  const auto stride = page_stride(page);
  shard_handoff h;
  h.from = id_, h.to = id_, h.epoch = took_over_at_, h.rows_only = true;
  h.rows.push_back({page.table, stride, page.ids, page.rows});
  return h;
}

std::vector<shard_handoff> shard_core::hand_off(const partitioner& next, shard_effects& fx) {
  if (next.epoch() <= map_.epoch())
    throw bad_request(name_ + ": a handoff needs a newer map than epoch " + std::to_string(map_.epoch()) + ", got epoch " +
                      std::to_string(next.epoch()));
  std::map<std::uint32_t, shard_handoff> out;
  const auto sightings = rows_.sightings();
  auto to = [&](std::uint32_t owner) -> shard_handoff& {
    auto [it, fresh] = out.try_emplace(owner);
    if (fresh)
      it->second = {id_,    owner, next.epoch(), {}, {}, {}, consistency_.clocks().values(), applied_, highest_clock_,
                    sightings};
    return it->second;
  };
  // A newcomer hears from every giver, even of nothing: the handoff carries the clocks.
  // So does every shard from one that leaves the map: a write of its keys still on its
  // way here is passed on to their new owner later, which must not count that writer's
  // clock before it (it keeps the lower clocks until the writer ticks it again).
  const auto in = [](const partitioner& m, std::uint32_t id) {
    return std::find(m.shard_ids().begin(), m.shard_ids().end(), id) != m.shard_ids().end();
  };
  const bool leaving = !in(next, id_);
  for (auto id : next.shard_ids())
    if (id != id_ && (leaving || !in(map_, id))) to(id);
  std::vector<stored_segment> kept;
  for (auto& [owner, segments] : split_by_owner(store_->snapshot(), next, state_slots_)) {
    if (owner == id_) kept = std::move(segments);
    else for (auto& s : segments) to(owner).segments.push_back(std::move(s));
  }
  store_->restore(kept);
  std::vector<shard_handoff> all;  // pages of rows first (see hand_off_tiered), then the parts
  if (rows_.tiered()) hand_off_tiered(next, to, fx, all);
  else hand_off_rows(next, to);
  hand_off_deferred(next, to);
  auto moved = parked_.release_if([&](const parked& p) { return touches_other_shards(pulls_.at(p.token), next); });
  for (const auto& p : moved)
    fx.fail.emplace_back(p.token, name_ + ": keys of this pull moved to another shard (epoch " +
                                      std::to_string(next.epoch()) + "): send it again by the new map");
  map_ = next;
  was_in_map_ = true;
  saw_epoch(next.epoch());
  for (auto& [owner, h] : out) all.push_back(std::move(h));
  return all;
}

void shard_core::adopt_rows(const shard_handoff& h) {
  for (const auto& t : h.rows) {
    rows_.adopt(t.table, t.stride, t.ids, t.rows, h.again);
    // A copy seeded ahead is not this shard's successor yet: it hears of them as changed.
    note_precopied_change(t.table, t.ids, !h.again);
  }
}

shard_effects shard_core::take_over(const shard_handoff& h) {
  if (h.to != id_)
    throw bad_request(name_ + ": a handoff for shard " + std::to_string(h.to) + " from shard " + std::to_string(h.from) +
                      " came here");
  if (h.epoch > map_.epoch())
    throw bad_request(name_ + ": a handoff of epoch " + std::to_string(h.epoch) + " came before this shard's map of it "
                      "(epoch " + std::to_string(map_.epoch()) + ")");
  shard_effects fx;
  // A giver's part of a change counts once: its new head (the old one died) sends it
  // again, and a disk tier's pages ahead of it too, which the first part covered already.
  if (!h.whole && parts_taken_.count({h.from, h.epoch})) return fx;
  if (!h.whole && !h.rows_only) parts_taken_.emplace(h.from, h.epoch);
  if (h.rows_only) {
    adopt_rows(h);
    if (auto w = rows_.trim(front_.keep_from)) fx.writes.push_back(std::move(w));
    return fx;
  }
  if (!h.sightings.empty()) rows_.restore_sightings(h.sightings);  // first: it refuses counts of another size
  auto segments = store_->snapshot();
  segments.insert(segments.end(), h.segments.begin(), h.segments.end());
  std::sort(segments.begin(), segments.end(), [](const stored_segment& a, const stored_segment& b) { return a.begin < b.begin; });
  store_->restore(segments);
  adopt_rows(h);
  for (const auto& d : h.deferred) deferred_.push_back(from_update(d));
  // A newcomer's clocks are nobody's yet: the first handoff's are taken as they are. A
  // shard that was in the map before keeps the lower of its own and the giver's.
  consistency_.clocks().merge_lower(h.clocks, h.whole || (!took_over_ && !was_in_map_));
  took_over_ = h.whole ? h.merges : true;
  took_over_at_ = std::max(took_over_at_, h.epoch);
  applied_.merge(h.applied);
  highest_clock_ = std::max(highest_clock_, h.highest_clock);
  release(fx);
  if (auto w = rows_.trim(front_.keep_from)) fx.writes.push_back(std::move(w));
  return fx;
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

template <class Body>
shard_effects shard_core::checked(const shard_request& r, const std::vector<key_range>& ranges, Body body) {
  shard_effects fx;
  fx.error = check(r, ranges);
  if (!fx.ok()) return fx;
  try {
    body(fx);
  } catch (const bad_request& e) {
    fx.error = name_ + ": " + e.what();
  }
  return fx;
}

shard_effects shard_core::push(const shard_request& r, const std::vector<key_range>& ranges, const float* values,
                               std::uint64_t n) {
  return checked(r, ranges, [&](shard_effects& fx) {
    if (fx.error = departed(r); !fx.ok()) return;
    highest_clock_ = std::max(highest_clock_, r.clock + 1);  // an update of clock c: the final file holds c
    take_push(r, ranges, values, n, fx);
    if (r.tick != 0) advance({r.epoch, r.worker, r.tick, 0, 0}, fx);  // a resent push ticks again: ticks are idempotent
  });
}

void shard_core::take_push(const shard_request& r, const std::vector<key_range>& ranges, const float* values,
                           std::uint64_t n, shard_effects& fx) {
  if (!applied_.first_time(r.worker, r.seq)) return;  // a resend: acknowledged, not applied again
  report_loss(r, fx);
  if (consistency_.defers_push(r.clock)) {
    // Acknowledged now, applied when the clock completes; a copy, since the sender may
    // reuse its buffer once acknowledged.
    shard_store::check_push(ranges, n);
    deferred_.push_back({r, ranges, std::vector<float>(values, values + n)});
    return;
  }
  store_->push(ranges, values, n);
  if (head_) fx.traces.push_back({trace_event::push, r.worker, r.clock, id_, 0, 0, 0, r.epoch < map_.epoch()});
}

shard_effects shard_core::init(const shard_request& r, const std::vector<key_range>& ranges, const float* values,
                               std::uint64_t n) {
  return checked(r, ranges, [&](shard_effects&) { store_->init(ranges, values, n); });
}

shard_effects shard_core::pull(const shard_request& r, std::vector<key_range> ranges, std::uint64_t token,
                               time_point now) {
  shard_effects fx;
  fx.error = check(r, ranges);
  if (!fx.ok()) return fx;
  pulls_[token] = {r, std::move(ranges)};  // kept until answered: the actor reads the store through them
  gate_pull(token, now, fx);
  return fx;
}

void shard_core::gate_pull(std::uint64_t token, time_point now, shard_effects& fx) {
  const auto clock = pulls_.at(token).req.clock;
  if (!consistency_.may_read(clock))
    parked_.park(clock, parked{token, now});
  else
    answer_pull(token, fx);
}

std::string shard_core::check_rows(const shard_request& r, std::uint32_t table,
                                   const std::vector<std::uint64_t>& ids) const {
  if (auto why = check(r, {}); !why.empty()) return why;
  if (table >= rows_.num_tables())
    return name_ + ": no sparse table " + std::to_string(table) + " (the job has " +
           std::to_string(rows_.num_tables()) + ")";
  for (auto id : ids)
    if (auto owner = map_.row_owner(table, id); owner != id_)
      return name_ + ": row " + std::to_string(id) + " of table '" + rows_.table(table).spec().name + "' belongs to shard " +
             std::to_string(owner) + " (epoch " + std::to_string(map_.epoch()) + ")";
  return {};
}

shard_effects shard_core::push_rows(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                                    const float* grads, std::uint64_t n) {
  shard_effects fx;
  fx.error = check_rows(r, table, ids);
  if (fx.ok()) fx.error = departed(r);
  if (!fx.ok()) return fx;
  highest_clock_ = std::max(highest_clock_, r.clock + 1);
  const auto& spec = rows_.table(table).spec();
  if (n != ids.size() * spec.dim) {
    fx.error = name_ + ": push of " + std::to_string(ids.size()) + " rows of table '" + spec.name + "' (dim " +
               std::to_string(spec.dim) + ") carries " + std::to_string(n) + " values, not " +
               std::to_string(ids.size() * spec.dim);
    return fx;
  }
  take_row_push(r, table, ids, grads, n, fx);
  if (r.tick != 0) advance({r.epoch, r.worker, r.tick, 0, 0}, fx);  // ticks are idempotent
  return fx;
}

void shard_core::take_row_push(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                               const float* grads, std::uint64_t n, shard_effects& fx) {
  if (!applied_.first_time(r.worker, r.seq)) return;  // a resend: acknowledged, not applied again
  report_loss(r, fx);
  if (consistency_.defers_push(r.clock)) {  // kept (copied) until the clock completes
    deferred_.push_back({r, {}, std::vector<float>(grads, grads + n), table, ids});
    return;
  }
  push_rows_now(r, table, ids, grads, false, fx);
}

void shard_core::push_rows_now(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                               const float* grads, bool acked, shard_effects& fx) {
  // Counted in arrival order on every copy: they agree on what is admitted.
  const auto refused = rows_.refuse(table, ids);
  if (refused.empty()) return push_admitted_rows(r, table, ids, grads, acked, fx);
  const auto dim = rows_.table(table).spec().dim;
  std::vector<std::uint64_t> kept;
  std::vector<float> kept_grads;
  for (std::size_t i = 0, next = 0; i < ids.size(); ++i) {
    if (next < refused.size() && refused[next] == i) {
      ++next;
      continue;
    }
    kept.push_back(ids[i]);
    kept_grads.insert(kept_grads.end(), grads + i * dim, grads + (i + 1) * dim);
  }
  push_admitted_rows(r, table, kept, kept_grads.data(), acked, fx);
}

void shard_core::push_admitted_rows(const shard_request& r, std::uint32_t table, const std::vector<std::uint64_t>& ids,
                                    const float* grads, bool acked, shard_effects& fx) {
  bool held = rows_.want(table, ids, true, fx.reads);
  if (held && row_queue_.empty() && !writes_backed_up()) {
    rows_.table(table).push(ids, grads, r.clock);
    note_precopied_change(table, ids, false);
    if (head_) fx.traces.push_back({trace_event::push, r.worker, r.clock, id_, 0, 0, 0, r.epoch < map_.epoch()});
  } else {  // kept (copied): the sender may reuse its buffer once acknowledged
    row_op op{row_op::kind::push, r, table, ids, {}, 0};
    op.grads.assign(grads, grads + ids.size() * rows_.table(table).spec().dim);
    if (!acked) fx.queued_push = op.ack = ++next_ack_;
    row_queue_.push_back(std::move(op));
  }
  drain_rows(fx);
}

void shard_core::sort_admitted(pending_pull& p) const {
  p.fresh.assign(p.ids.size(), 0);
  p.admitted.clear();
  for (std::size_t i = 0; i < p.ids.size(); ++i) {
    if (rows_.admitted(*p.table, p.ids[i])) p.admitted.push_back(p.ids[i]);
    else p.fresh[i] = 1;
  }
  if (p.admitted.size() == p.ids.size()) p.fresh.clear();
}

void shard_core::read_rows(pending_pull& p) {
  auto& t = rows_.table(*p.table);
  const auto& spec = t.spec();
  p.values.resize(p.ids.size() * spec.dim);
  if (p.fresh.empty()) return t.pull(p.ids, p.values.data(), p.req.clock, front_.keep_from);
  std::vector<float> held(p.admitted.size() * spec.dim);
  t.pull(p.admitted, held.data(), p.req.clock, front_.keep_from);
  const float* next = held.data();
  for (std::size_t i = 0; i < p.ids.size(); ++i) {
    float* out = p.values.data() + i * spec.dim;
    if (p.fresh[i]) {
      initial_row(spec.seed, spec.name, p.ids[i], spec.init_scale, out, spec.dim);
    } else {
      std::copy_n(next, spec.dim, out);
      next += spec.dim;
    }
  }
}

void shard_core::pull_rows_now(std::uint64_t token, shard_effects& fx) {
  auto& p = pulls_.at(token);
  if (!rows_.admits_all(*p.table)) sort_admitted(p);  // as the pushes queued before it left the counts
  bool held = rows_.want(*p.table, p.stored_ids(), true, fx.reads);
  row_op op{row_op::kind::pull, p.req, *p.table, {}, {}, token};
  if (held && row_queue_.empty() && !writes_backed_up())
    run(op, fx);
  else
    row_queue_.push_back(std::move(op));
  drain_rows(fx);
}

void shard_core::run(const row_op& op, shard_effects& fx) {
  switch (op.what) {
    case row_op::kind::push:
      rows_.table(op.table).push(op.ids, op.grads.data(), op.req.clock, front_.keep_from);
      note_precopied_change(op.table, op.ids, false);
      if (head_) fx.traces.push_back({trace_event::push, op.req.worker, op.req.clock, id_, 0, 0, 0, op.req.epoch < map_.epoch()});
      if (op.ack != 0) fx.applied.push_back(op.ack);
      return;
    case row_op::kind::pull: {
      auto& p = pulls_.at(op.token);
      read_rows(p);
      trace_pull(p, fx);
      fx.answer.push_back(op.token);
      return;
    }
    case row_op::kind::key_pull:
      trace_pull(pulls_.at(op.token), fx);
      fx.answer.push_back(op.token);
      return;
    case row_op::kind::checkpoint:
      fx.checkpoint_at = op.req.clock;
      return;
  }
}

void shard_core::drain_rows(shard_effects& fx) {
  while (!row_queue_.empty()) {
    const auto& op = row_queue_.front();
    if ((op.what == row_op::kind::push || op.what == row_op::kind::pull) && (writes_backed_up() || !front_ready(fx)))
      break;
    run(op, fx);
    row_queue_.pop_front();
    front_ = {};
  }
  if (auto w = rows_.trim(front_.keep_from)) fx.writes.push_back(std::move(w));
}

shard_effects shard_core::rows_written(std::uint64_t seq) {
  rows_.written(seq);
  shard_effects fx;
  drain_rows(fx);
  return fx;
}

bool shard_core::front_ready(shard_effects& fx) {
  const auto& op = row_queue_.front();
  if (front_.blocked) {
    if (rows_.want(op.table, front_.awaited, false, fx.reads)) return true;
    std::erase_if(front_.awaited, [&](std::uint64_t id) { return rows_.table(op.table).holds(id); });
    return false;
  }
  const auto& ids = op.what == row_op::kind::push ? op.ids : pulls_.at(op.token).stored_ids();
  if (rows_.want(op.table, ids, false, fx.reads)) return true;
  // Read from disk first, keeping the rest in RAM meanwhile.
  front_.blocked = true;
  front_.keep_from = rows_.keep(op.table, ids, front_.awaited);
  return false;
}

shard_effects shard_core::prefetch_rows(const shard_request& r, std::uint32_t table,
                                        const std::vector<std::uint64_t>& ids) {
  shard_effects fx;
  fx.error = check_rows(r, table, ids);
  if (fx.ok() && rows_.tiered()) rows_.want(table, ids, false, fx.reads);
  return fx;
}

std::uint64_t shard_core::fill_rows_in_ram(std::uint32_t table, std::uint64_t count) {
  std::uint64_t made = 0;
  for (std::uint64_t id = 0; id < count; ++id)
    if (owns_row(table, id)) rows_.create(table, id), ++made;
  return made;
}

shard_effects shard_core::rows_swept(const disk_sweep& sweep, const swept_page& page) {
  shard_effects fx;
  if (auto next = rows_.swept(sweep, page)) fx.sweeps.push_back(*next);
  if (auto w = rows_.trim(front_.keep_from)) fx.writes.push_back(std::move(w));
  return fx;
}

shard_effects shard_core::rows_loaded(const std::vector<row_key>& keys, const std::vector<std::uint8_t>& found,
                                      const std::vector<float>& rows, const std::vector<std::uint64_t>& pushed) {
  shard_effects fx;
  rows_.loaded(keys, found, rows, pushed);
  if (precopy_)
    for (std::size_t i = 0; i < keys.size() && i < found.size(); ++i)
      if (!found[i]) note_precopied_change(keys[i].table, std::span(&keys[i].id, 1), true);
  drain_rows(fx);
  return fx;
}

shard_effects shard_core::pull_rows(const shard_request& r, std::uint32_t table, std::vector<std::uint64_t> ids,
                                    std::uint64_t token, time_point now) {
  shard_effects fx;
  fx.error = check_rows(r, table, ids);
  if (!fx.ok()) return fx;
  pulls_[token] = {r, {}, table, std::move(ids)};
  gate_pull(token, now, fx);
  return fx;
}

void shard_core::answer_pull(std::uint64_t token, shard_effects& fx) {
  auto& p = pulls_.at(token);
  p.gate_min = consistency_.clocks().min_clock();
  if (p.table) {
    pull_rows_now(token, fx);
  } else if (!row_queue_.empty()) {
    row_queue_.push_back({row_op::kind::key_pull, p.req, 0, {}, {}, token});
  } else {
    trace_pull(p, fx);
    fx.answer.push_back(token);
  }
}

void shard_core::trace_pull(const pending_pull& p, shard_effects& fx) {
  fx.traces.push_back({trace_event::pull, p.req.worker, p.req.clock, id_, p.gate_min, consistency_.staleness()});
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
