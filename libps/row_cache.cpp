#include "libps/row_cache.hpp"

#include <algorithm>
#include <unordered_set>

#include "libps/keys.hpp"

namespace ps {

row_cache::row_cache(std::uint32_t dim, std::size_t capacity_rows, std::uint64_t staleness)
    : dim_(dim), capacity_(capacity_rows), staleness_(staleness) {
  if (dim_ == 0) throw bad_request("row cache: rows need at least one value");
  if (capacity_ == 0) throw bad_request("row cache: --embedding-cache must hold at least one row");
}

std::vector<std::uint64_t> row_cache::misses(std::span<const std::uint64_t> ids, std::uint64_t clock) {
  std::vector<std::uint64_t> out;
  std::unordered_set<std::uint64_t> seen;
  for (auto id : ids) {
    if (!seen.insert(id).second) continue;
    auto it = rows_.find(id);
    if (it != rows_.end() && it->second.pulled_at + staleness_ >= clock) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.lru);
    } else {
      ++missed_;
      out.push_back(id);
    }
  }
  return out;
}

row_flush row_cache::take_pending(std::uint64_t id, entry& e) {
  row_flush f{id, std::move(e.pending)};
  e.pending.clear();
  return f;
}

void row_cache::evict_beyond(std::size_t capacity, std::vector<row_flush>& out) {
  while (rows_.size() > capacity) {
    auto id = lru_.back();
    auto it = rows_.find(id);
    if (!it->second.pending.empty()) out.push_back(take_pending(id, it->second));
    lru_.pop_back();
    rows_.erase(it);
  }
}

std::vector<row_flush> row_cache::fill(std::span<const std::uint64_t> ids, const float* values, std::uint64_t clock) {
  std::vector<row_flush> out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto [it, fresh] = rows_.try_emplace(ids[i]);
    auto& e = it->second;
    if (fresh) {
      lru_.push_front(ids[i]);
      e.lru = lru_.begin();
    } else {
      lru_.splice(lru_.begin(), lru_, e.lru);
      if (!e.pending.empty()) out.push_back(take_pending(ids[i], e));  // before the new version is used
    }
    e.value.assign(values + i * dim_, values + (i + 1) * dim_);
    e.pulled_at = clock;
  }
  evict_beyond(std::max(capacity_, ids.size()), out);  // a batch larger than the cache still fits
  return out;
}

void row_cache::read(std::span<const std::uint64_t> ids, float* out) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto it = rows_.find(ids[i]);
    if (it == rows_.end()) throw bad_request("row cache: row " + std::to_string(ids[i]) + " is not cached");
    std::copy(it->second.value.begin(), it->second.value.end(), out + i * dim_);
  }
}

void row_cache::accumulate(std::span<const std::uint64_t> ids, const float* grads, std::uint64_t clock) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto it = rows_.find(ids[i]);
    if (it == rows_.end()) throw bad_request("row cache: gradient for row " + std::to_string(ids[i]) + ", which is not cached");
    auto& e = it->second;
    if (e.pending.empty()) {
      e.pending.assign(dim_, 0.0f);
      e.pending_since = clock;
      pending_order_.emplace_back(clock, ids[i]);
    }
    for (std::uint32_t k = 0; k < dim_; ++k) e.pending[k] += grads[i * dim_ + k];
  }
}

std::vector<row_flush> row_cache::due(std::uint64_t clock) {
  std::vector<row_flush> out;
  while (!pending_order_.empty() && pending_order_.front().first + staleness_ < clock) {
    auto [since, id] = pending_order_.front();
    pending_order_.pop_front();
    auto it = rows_.find(id);
    if (it != rows_.end() && !it->second.pending.empty() && it->second.pending_since == since)
      out.push_back(take_pending(id, it->second));
  }
  return out;
}

std::vector<row_flush> row_cache::drain() {
  std::vector<row_flush> out;
  for (auto& [id, e] : rows_)
    if (!e.pending.empty()) out.push_back(take_pending(id, e));
  pending_order_.clear();
  return out;
}

void cache_traffic_counter::batch(std::span<const std::uint64_t> ids, std::uint64_t clock) {
  std::unordered_set<std::uint64_t> distinct(ids.begin(), ids.end());
  bound_.without_cache += 2 * distinct.size();
  for (auto id : distinct) {
    auto it = pulled_at_.find(id);
    if (it == pulled_at_.end() || it->second + staleness_ < clock) {
      ++bound_.with_cache;                   // a pull
      bound_.with_cache += dirty_.erase(id);  // a refresh flushes what it had
      pulled_at_[id] = clock;
    }
    dirty_.insert(id);
  }
}

cache_bound unbounded_cache_traffic(const std::vector<std::vector<std::uint64_t>>& batches, std::uint64_t staleness) {
  cache_traffic_counter counter(staleness);
  for (std::uint64_t clock = 0; clock < batches.size(); ++clock) counter.batch(batches[clock], clock);
  return counter.total();
}

}  // namespace ps
