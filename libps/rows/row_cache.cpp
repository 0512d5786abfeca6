#include "libps/rows/row_cache.hpp"

#include <algorithm>
#include <unordered_set>

#include "libps/keys/keys.hpp"

namespace ps {

row_cache::row_cache(std::uint32_t dim, std::size_t capacity_rows, std::uint64_t staleness)
    : dim_(dim), capacity_(capacity_rows), staleness_(staleness), values_(dim), pending_(dim) {
  if (dim_ == 0) throw bad_request("row cache: rows need at least one value");
  if (capacity_ == 0) throw bad_request("row cache: --embedding-cache must hold at least one row");
  index_.reserve(std::min<std::size_t>(capacity_, std::size_t{1} << 20));  // no rehash while it fills
}

std::uint32_t row_cache::find(std::uint64_t id) const {
  return index_.find(id);
}

std::uint32_t row_cache::slot_at(std::span<const std::uint64_t> ids, std::size_t i) const {
  if (hint_.size() == ids.size()) {
    auto s = hint_[i];
    if (s != none && meta_[s].used && meta_[s].id == ids[i]) return s;
    return hint_[i] = find(ids[i]);
  }
  return find(ids[i]);
}

std::vector<std::uint64_t> row_cache::misses(std::span<const std::uint64_t> ids, std::uint64_t clock) {
  std::vector<std::uint64_t> out;
  missing_.clear();
  ++calls_;
  hint_.assign(ids.size(), none);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto s = find(ids[i]);
    if (s != none && meta_[s].pulled_at + staleness_ >= clock) {
      hint_[i] = s;
      if (meta_[s].seen == calls_) continue;  // met already in this batch
      meta_[s].seen = calls_;
      ++hits_;
      to_front(s);
    } else if (missing_.insert(ids[i]).second) {
      ++missed_;
      out.push_back(ids[i]);
    }
  }
  return out;
}

std::uint32_t row_cache::add(std::uint64_t id) {
  auto s = take_slot(free_, meta_, [&] {
    values_.emplace_back();
    pending_.emplace_back();
  });
  meta_[s] = slot_meta{};
  meta_[s].id = id;
  meta_[s].used = true;
  index_.insert(id, s);
  link_front(s);
  return s;
}

void row_cache::unlink(std::uint32_t slot) {
  auto& m = meta_[slot];
  (m.prev != none ? meta_[m.prev].next : head_) = m.next;
  (m.next != none ? meta_[m.next].prev : tail_) = m.prev;
  m.prev = m.next = none;
}

void row_cache::link_front(std::uint32_t slot) {
  meta_[slot].next = head_;
  if (head_ != none) meta_[head_].prev = slot;
  head_ = slot;
  if (tail_ == none) tail_ = slot;
}

void row_cache::to_front(std::uint32_t slot) {
  if (head_ == slot) return;
  unlink(slot);
  link_front(slot);
}

row_flush row_cache::take_pending(std::uint32_t slot) {
  meta_[slot].pending = false;
  const float* g = pending_of(slot);
  return {meta_[slot].id, std::vector<float>(g, g + dim_)};
}

void row_cache::evict_beyond(std::size_t capacity, std::vector<row_flush>& out) {
  while (index_.size() > capacity) {
    auto s = tail_;
    if (meta_[s].pending) out.push_back(take_pending(s));
    unlink(s);
    index_.erase(meta_[s].id);
    meta_[s].used = false;
    free_.push_back(s);
  }
}

std::vector<row_flush> row_cache::fill(std::span<const std::uint64_t> ids, const float* values, std::uint64_t clock) {
  std::vector<row_flush> out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto s = find(ids[i]);
    if (s == none) {
      s = add(ids[i]);
    } else {
      to_front(s);
      if (meta_[s].pending) out.push_back(take_pending(s));  // before the new version is used
    }
    std::copy(values + i * dim_, values + (i + 1) * dim_, value_of(s));
    meta_[s].pulled_at = clock;
  }
  evict_beyond(std::max(capacity_, ids.size()), out);  // a batch larger than the cache still fits
  return out;
}

void row_cache::read(std::span<const std::uint64_t> ids, float* out) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto s = slot_at(ids, i);
    if (s == none) throw bad_request("row cache: row " + std::to_string(ids[i]) + " is not cached");
    const float* v = values_.row(s);
    std::copy(v, v + dim_, out + i * dim_);
  }
}

void row_cache::accumulate(std::span<const std::uint64_t> ids, const float* grads, std::uint64_t clock) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    auto s = slot_at(ids, i);
    if (s == none) throw bad_request("row cache: gradient for row " + std::to_string(ids[i]) + ", which is not cached");
    float* sum = pending_of(s);
    if (!meta_[s].pending) {
      std::fill(sum, sum + dim_, 0.0f);
      meta_[s].pending = true;
      meta_[s].pending_since = clock;
      pending_order_.emplace_back(clock, ids[i]);
    }
    for (std::uint32_t k = 0; k < dim_; ++k) sum[k] += grads[i * dim_ + k];
  }
}

std::vector<row_flush> row_cache::due(std::uint64_t clock) {
  std::vector<row_flush> out;
  while (!pending_order_.empty() && pending_order_.front().first + staleness_ < clock) {
    auto [since, id] = pending_order_.front();
    pending_order_.pop_front();
    auto s = find(id);
    if (s != none && meta_[s].pending && meta_[s].pending_since == since) out.push_back(take_pending(s));
  }
  return out;
}

std::vector<row_flush> row_cache::drain() {
  std::vector<row_flush> out;
  for (std::uint32_t s = 0; s < meta_.size(); ++s)
    if (meta_[s].used && meta_[s].pending) out.push_back(take_pending(s));
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
