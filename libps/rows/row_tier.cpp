#include "libps/rows/row_tier.hpp"

#include <algorithm>

#include "libps/keys/hash.hpp"
#include "libps/keys/keys.hpp"

namespace ps {

row_tier::row_tier(std::vector<sparse_table_spec> specs, std::uint64_t budget, eviction_policy policy)
    : budget_(budget) {
  for (auto& s : specs) {
    if (s.admit_after > 1 && !sightings_) sightings_ = std::make_unique<count_min_sketch>();
    tables_.emplace_back(std::move(s), policy, clock_);
    if (budget > 0) tables_.back().set_protected_limit(budget / tables_.back().row_bytes() * 4 / 5);
  }
  live_.assign(tables_.size(), 0);
}

namespace {
std::uint64_t sighting_key(std::uint32_t table, std::uint64_t id) { return mix64(id ^ mix64(table)); }
}  // namespace

std::vector<std::size_t> row_tier::refuse(std::uint32_t table, std::span<const std::uint64_t> ids) {
  std::vector<std::size_t> refused;
  if (admits_all(table)) return refused;
  const auto& t = tables_.at(table);
  for (std::size_t i = 0; i < ids.size(); ++i)
    if (sightings_->add(sighting_key(table, ids[i])) < t.spec().admit_after && !t.holds(ids[i])) refused.push_back(i);
  stats_.refused += refused.size();
  return refused;
}

bool row_tier::admitted(std::uint32_t table, std::uint64_t id) const {
  return admits_all(table) || tables_.at(table).holds(id) ||
         sightings_->estimate(sighting_key(table, id)) >= tables_[table].spec().admit_after;
}

std::vector<disk_sweep> row_tier::expire(std::uint64_t clock) {
  if (swept_at_.empty()) {  // the first clock this tier hears of: restored rows live from it
    revived_at_ = clock;
    for (auto& t : tables_)
      if (t.spec().expire_after > 0) t.restamp(clock);
  }
  now_ = clock;
  swept_at_.resize(tables_.size(), clock);
  std::vector<disk_sweep> sweeps;
  for (std::uint32_t i = 0; i < tables_.size(); ++i) {
    auto& t = tables_[i];
    auto after = t.spec().expire_after;
    if (after == 0 || clock <= after || clock < swept_at_[i] + std::max<std::uint64_t>(1, after / 4)) continue;
    swept_at_[i] = clock;
    auto dropped = t.expire_before(clock - after);
    stats_.expired += dropped.size();
    live_[i] -= dropped.size();
    if (!tiered()) continue;
    // A row dropped here may have an older copy on disk: it goes too, so no read finds it
    // and counts it again; then the disk's rows not in RAM are listed (disk_sweep).
    for (auto id : dropped) deleting_.push_back({i, id});
    if (sweeping_.empty()) sweeping_.assign(tables_.size(), false);
    if (sweeping_[i]) continue;  // the next sweep lists what this one would
    sweeping_[i] = true;
    sweeps.push_back({i, clock - after, revived_at_, 0});
  }
  return sweeps;
}

std::optional<disk_sweep> row_tier::swept(const disk_sweep& sweep, const swept_page& page) {
  const auto table = sweep.table;
  auto& t = tables_.at(table);
  for (auto id : page.ids) {
    row_key key{table, id};
    // Rows in RAM, being read (their read finds them expired) or in a write under way
    // (written or deleted since the listing) are not the listing's to count.
    if (t.holds(id) || reading_.count(key) || writing_.count(key)) continue;
    deleting_.push_back(key);
    ++stats_.expired;
    --live_[table];
  }
  if (page.more) {
    auto next = sweep;
    next.from = page.next;
    return next;
  }
  if (table < sweeping_.size()) sweeping_[table] = false;
  return std::nullopt;
}

bool row_tier::expired(std::uint32_t table, std::uint64_t last_push) const {
  // As the table's last sweep judged the rows in RAM (not by the clock of now: a row in
  // RAM past its time but not swept yet stays, so one on disk does too).
  const auto after = tables_[table].spec().expire_after;
  const auto swept = table < swept_at_.size() ? swept_at_[table] : 0;
  return after > 0 && swept > after && last_push < swept - after;
}

std::uint64_t row_tier::keep(std::uint32_t table, std::span<const std::uint64_t> ids,
                             std::vector<std::uint64_t>& absent) {
  auto from = *clock_ + 1;
  auto& t = tables_.at(table);
  t.for_each_id(ids, [&](std::size_t i) {
    if (!t.touch(ids[i])) absent.push_back(ids[i]);
  });
  return from;
}

void row_tier::created(std::uint32_t table) {
  ++stats_.created;
  ++live_[table];
}

bool row_tier::want(std::uint32_t table, std::span<const std::uint64_t> ids, bool count,
                    std::vector<row_key>& to_read) {
  auto& t = tables_.at(table);
  bool all_held = true;
  t.for_each_id(ids, [&](std::size_t i) {
    const auto id = ids[i];
    if (t.holds(id)) {
      if (count) ++stats_.hits;
      return;
    }
    if (count) ++stats_.misses;
    row_key key{table, id};
    if (!tiered()) {  // no disk tier: a row not held was never touched
      create(table, id);
      return;
    }
    if (auto w = writing_.find(key); w != writing_.end()) {  // evicted or deleted, its write still under way
      if (w->second.offset == in_write::deleted) {
        create(table, id);
        return;
      }
      t.install(id, row_in_write(key), w->second.pushed);
      ++stats_.taken_back;
      return;
    }
    all_held = false;
    if (reading_.insert(key).second) to_read.push_back(key);
  });
  return all_held;
}

void row_tier::loaded(const std::vector<row_key>& keys, const std::vector<std::uint8_t>& found,
                      const std::vector<float>& rows, const std::vector<std::uint64_t>& pushed) {
  if (found.size() != keys.size()) throw bad_request("a disk read answered " + std::to_string(found.size()) +
                                                     " of " + std::to_string(keys.size()) + " rows");
  std::size_t at = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto& k = keys[i];
    auto& t = tables_.at(k.table);
    reading_.erase(k);
    const float* stored = nullptr;
    if (found[i]) {
      if (at + t.stride() > rows.size()) throw bad_request("a disk read answered too few values");
      stored = rows.data() + at;
      at += t.stride();
    }
    if (dropped_.erase(k) != 0) continue;  // moved to another shard while it was read
    if (t.holds(k.id)) continue;  // cannot happen while reads are tracked; the RAM copy is newer
    const auto last_push = std::max(pushed.empty() ? 0 : pushed.at(i), revived_at_);
    if (stored && expired(k.table, last_push)) {  // expired on disk, not yet swept: made afresh
      ++stats_.expired;
      --live_[k.table];
      stored = nullptr;  // the new row is dirty: its write replaces the expired copy
    }
    t.install(k.id, stored, stored ? last_push : now_);
    if (stored) ++stats_.read;
    else created(k.table);
  }
}

void row_tier::create(std::uint32_t table, std::uint64_t id) {
  auto& t = tables_.at(table);
  if (t.holds(id)) return;
  t.install(id, nullptr, now_);
  created(table);
}

void row_tier::filled_on_disk(std::uint32_t table, std::uint64_t rows) {
  stats_.created += rows;
  live_.at(table) += rows;
}

void row_tier::restored_on_disk(const std::vector<std::uint64_t>& rows_per_table, std::uint64_t rows) {
  if (!rows_per_table.empty() && rows_per_table.size() != tables_.size())
    throw bad_request("the checkpoint's disk tier counts rows of " + std::to_string(rows_per_table.size()) +
                      " sparse tables, the job has " + std::to_string(tables_.size()));
  stats_.created += rows;
  for (std::size_t i = 0; i < rows_per_table.size(); ++i) live_[i] += rows_per_table[i];
}

std::vector<std::uint16_t> row_tier::sightings() const {
  return sightings_ ? sightings_->counters() : std::vector<std::uint16_t>{};
}

void row_tier::restore_sightings(const std::vector<std::uint16_t>& counters) {
  if (counters.empty()) return;
  if (!sightings_)
    throw bad_request("the checkpoint holds admission counts, but no sparse table of this job admits after more than 1 "
                      "push (another model?)");
  sightings_->merge(counters);
}

std::uint64_t row_tier::table_bytes() const {
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < tables_.size(); ++i) bytes += live_[i] * tables_[i].stride() * sizeof(float);
  return bytes;
}

table_rows row_tier::take_rows(std::uint32_t table, const std::function<bool(std::uint64_t)>& moves) {
  if (tiered()) throw bad_request("rows on a disk tier (--shard-memory) cannot be handed over to another shard yet");
  auto& t = tables_.at(table);
  table_rows out{table, static_cast<std::uint32_t>(t.stride()), {}, {}};
  std::vector<std::pair<std::uint64_t, const float*>> leaving;
  t.for_each_row([&](std::uint64_t id, const float* row, bool, std::uint64_t) {
    if (moves(id)) leaving.emplace_back(id, row);
  });
  std::sort(leaving.begin(), leaving.end());
  for (const auto& [id, row] : leaving) {
    out.ids.push_back(id);
    out.rows.insert(out.rows.end(), row, row + t.stride());
  }
  for (auto id : out.ids) t.erase(id);
  stats_.moved += out.ids.size();
  live_[table] -= out.ids.size();
  return out;
}

sparse_table& row_tier::table_of_stride(std::uint32_t table, std::uint32_t stride, const std::vector<std::uint64_t>& ids,
                                        const std::vector<float>& rows, const std::string& what) {
  if (table >= tables_.size())
    throw bad_request(what + " has rows of sparse table " + std::to_string(table) + ", the job has " +
                      std::to_string(tables_.size()) + " tables");
  auto& t = tables_[table];
  if (stride != t.stride() || rows.size() != ids.size() * stride)
    throw bad_request(what + "'s rows of sparse table " + t.spec().name + " have " + std::to_string(stride) +
                      " floats each, the job's " + std::to_string(t.stride()) + " (another model?)");
  return t;
}

void row_tier::restore(std::uint32_t table, std::uint32_t stride, const std::vector<std::uint64_t>& ids,
                       const std::vector<float>& rows) {
  if (tiered())
    throw bad_request("a checkpoint of rows held in RAM is not restored into a disk tier (--shard-memory) yet; "
                      "restore it without --shard-memory");
  auto& t = table_of_stride(table, stride, ids, rows, "the checkpoint");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (t.holds(ids[i])) continue;
    t.install(ids[i], rows.data() + i * stride, now_);
    created(table);
  }
}

void row_tier::adopt(std::uint32_t table, std::uint32_t stride, const std::vector<std::uint64_t>& ids,
                     const std::vector<float>& rows, bool again) {
  auto& t = table_of_stride(table, stride, ids, rows, "a handoff");
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const bool fresh = !t.holds(ids[i]);
    t.replace(ids[i], rows.data() + i * stride, now_);
    if (fresh && !again) created(table);
  }
}

std::vector<table_rows> row_tier::copy_held(const std::function<bool(const row_key&)>& pick) const {
  std::vector<table_rows> out;
  for (std::uint32_t i = 0; i < tables_.size(); ++i) {
    const auto& t = tables_[i];
    std::vector<std::pair<std::uint64_t, const float*>> picked;
    t.for_each_row([&](std::uint64_t id, const float* row, bool, std::uint64_t) {
      if (pick({i, id})) picked.emplace_back(id, row);
    });
    if (picked.empty()) continue;
    std::sort(picked.begin(), picked.end());
    table_rows rows{i, static_cast<std::uint32_t>(t.stride()), {}, {}};
    for (const auto& [id, row] : picked) {
      rows.ids.push_back(id);
      rows.rows.insert(rows.rows.end(), row, row + t.stride());
    }
    out.push_back(std::move(rows));
  }
  return out;
}

std::shared_ptr<const row_write> row_tier::flush_moved(const std::function<bool(const row_key&)>& moves,
                                                      const std::function<bool(const row_key&)>& copied,
                                                      std::vector<table_rows>* copies) {
  auto w = std::make_shared<row_write>();
  w->seq = next_write_ + 1;
  for (std::uint32_t i = 0; i < tables_.size(); ++i) {
    auto& t = tables_[i];
    std::vector<std::uint64_t> leaving;
    table_rows copy{i, static_cast<std::uint32_t>(t.stride()), {}, {}};
    t.for_each_row([&](std::uint64_t id, const float* row, bool dirty, std::uint64_t pushed) {
      if (!moves({i, id})) return;
      leaving.push_back(id);
      if (copies && copied({i, id})) {
        copy.ids.push_back(id);
        copy.rows.insert(copy.rows.end(), row, row + t.stride());
      }
      if (!dirty) return;  // on disk already, or in a write under way
      writing_[{i, id}] = {w->seq, w->rows.size(), pushed};
      w->keys.push_back({i, id});
      w->pushed.push_back(pushed);
      w->rows.insert(w->rows.end(), row, row + t.stride());
    });
    for (auto id : leaving) t.erase(id);
    if (!copy.ids.empty()) copies->push_back(std::move(copy));
  }
  for (const auto& k : reading_)
    if (moves(k)) dropped_.insert(k);
  return start_write(std::move(w));
}

void row_tier::moved_from_disk(std::uint32_t table, std::uint64_t rows) {
  stats_.moved += rows;
  live_.at(table) -= rows;
}

row_write row_tier::dirty_rows() const {
  row_write w;
  for (std::uint32_t i = 0; i < tables_.size(); ++i)
    tables_[i].for_each_row([&](std::uint64_t id, const float* row, bool dirty, std::uint64_t pushed) {
      if (!dirty) return;
      w.keys.push_back({i, id});
      w.rows.insert(w.rows.end(), row, row + tables_[i].stride());
      w.pushed.push_back(pushed);
    });
  return w;
}

std::uint64_t row_tier::held_bytes() const {
  std::uint64_t bytes = 0;
  for (const auto& t : tables_) bytes += t.bytes();
  return bytes;
}

std::optional<std::uint32_t> row_tier::oldest_table(std::uint64_t keep_from) const {
  std::optional<std::uint32_t> oldest;
  std::optional<std::uint64_t> stamp;
  for (std::uint32_t i = 0; i < tables_.size(); ++i) {
    auto s = tables_[i].next_victim_stamp();
    if (s && *s < keep_from && (!stamp || *s < *stamp)) stamp = s, oldest = i;
  }
  return oldest;
}

const float* row_tier::row_in_write(const row_key& key) const {
  auto it = writing_.find(key);
  if (it == writing_.end()) return nullptr;
  const auto& batch = *in_flight_.at(it->second.seq - in_flight_.front()->seq);
  return batch.rows.data() + it->second.offset;
}

std::shared_ptr<const row_write> row_tier::trim(std::uint64_t keep_from) {
  if (!tiered()) return nullptr;
  auto held = held_bytes();
  auto w = std::make_shared<row_write>();
  w->seq = next_write_ + 1;
  while (held > budget_) {
    auto victim = oldest_table(keep_from);
    if (!victim) break;
    auto& t = tables_[*victim];
    const auto at = w->rows.size();
    auto out = t.evict(w->rows);
    held -= t.row_bytes();
    if (!out.dirty) {  // on disk already, or in a write under way
      w->rows.resize(at);
      continue;
    }
    w->keys.push_back({*victim, out.id});
    w->pushed.push_back(out.pushed);
    writing_[w->keys.back()] = {w->seq, at, out.pushed};
  }
  for (const auto& k : deleting_) {
    w->deleted.push_back(k);
    writing_[k] = {w->seq, in_write::deleted, 0};
  }
  deleting_.clear();
  return start_write(std::move(w));
}

std::shared_ptr<const row_write> row_tier::start_write(std::shared_ptr<row_write> w) {
  if (w->keys.empty() && w->deleted.empty()) return nullptr;
  ++next_write_;
  buffered_bytes_ += w->rows.size() * sizeof(float);
  stats_.written += w->keys.size();
  in_flight_.push_back(w);
  return w;
}

void row_tier::written(std::uint64_t seq) {
  while (!in_flight_.empty() && in_flight_.front()->seq <= seq) {
    const auto& done = *in_flight_.front();
    for (const auto* keys : {&done.keys, &done.deleted})
      for (const auto& k : *keys)
        if (auto it = writing_.find(k); it != writing_.end() && it->second.seq == done.seq) writing_.erase(it);
    buffered_bytes_ -= done.rows.size() * sizeof(float);
    in_flight_.pop_front();
  }
}

}  // namespace ps
