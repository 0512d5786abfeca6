// shard_core's decisions when keys and rows move: handoffs after a map change (dense,
// deferred and tiered rows), seeding a new copy, copying ahead of a join, taking over a leaver.
#include "libps/core/shard_core.hpp"

#include <algorithm>

#include "libps/core/shard_store.hpp"

namespace ps {

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

}  // namespace ps
