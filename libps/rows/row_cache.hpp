#pragma once
// A worker's embedding cache with bounded staleness (after HET, VLDB 2022). A clock is
// one minibatch of this worker. Each cached row carries the clock at which it was
// pulled; at clock c it is used while it is at most S clocks old (pulled at c - S or
// later), else pulled again. Gradients of a row accumulate in the cache and go to the
// server as one push: before the row is pulled again, when it is evicted, before a
// gradient of clock c0 would miss the reads of clock c0 + S + 1 (SSP: they must see it),
// and at the end. Least recently used rows are evicted beyond the capacity. Plain class:
// the worker's client asks it what to pull and what to push (docs/sparse-tables.md).
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "libps/rows/id_index.hpp"
#include "libps/core/slots.hpp"

namespace ps {

// Accumulated gradients of one row, to push.
struct row_flush {
  std::uint64_t id = 0;
  std::vector<float> grad;
};

class row_cache {
 public:
  // Throws bad_request for dim 0 or capacity 0.
  row_cache(std::uint32_t dim, std::size_t capacity_rows, std::uint64_t staleness);

  // The distinct ids of a batch at `clock` that must be pulled: not cached, or cached
  // from before clock - S. Counts hits and misses.
  std::vector<std::uint64_t> misses(std::span<const std::uint64_t> ids, std::uint64_t clock);
  // Rows pulled at `clock` (ids.size() * dim values). A refreshed row's pending
  // gradients, and those of rows evicted to make room, are returned: push them first.
  std::vector<row_flush> fill(std::span<const std::uint64_t> ids, const float* values, std::uint64_t clock);
  // The cached values of ids (each must be cached: misses() then fill()).
  void read(std::span<const std::uint64_t> ids, float* out) const;
  // Adds gradients (ids.size() * dim) to the rows' pending sums, noting the clock of a
  // row's first pending gradient.
  void accumulate(std::span<const std::uint64_t> ids, const float* grads, std::uint64_t clock);
  // Pending sums that must leave before `clock` begins: their first gradient is from
  // before clock - S.
  std::vector<row_flush> due(std::uint64_t clock);
  // Every pending sum (the end of training).
  std::vector<row_flush> drain();

  std::size_t size() const { return index_.size(); }
  std::uint64_t hits() const { return hits_; }
  std::uint64_t missed() const { return missed_; }

 private:
  static constexpr std::uint32_t none = UINT32_MAX;
  // Rows live in slots of two arenas (value, pending sum), dim floats each, with their
  // bookkeeping beside them and the LRU order as a list through the slots: no allocation
  // per row, and one hash lookup per row and batch where a vector per row and a
  // std::list cost the worker more than the bytes the cache saved (docs/sparse-tables.md).
  struct slot_meta {
    std::uint64_t id = 0;
    std::uint64_t pulled_at = 0;
    std::uint64_t pending_since = 0;
    std::uint64_t seen = 0;  // the misses() call that last met it (dedupes a batch's hits)
    std::uint32_t prev = none, next = none;
    bool used = false;
    bool pending = false;  // its pending sum holds gradients to push
  };
  float* value_of(std::uint32_t slot) { return values_.row(slot); }
  float* pending_of(std::uint32_t slot) { return pending_.row(slot); }
  std::uint32_t find(std::uint64_t id) const;  // none when not cached
  // The slot holding row ids[i] of the batch misses() saw last, if it still does;
  // else looked up (none when not cached) and remembered.
  std::uint32_t slot_at(std::span<const std::uint64_t> ids, std::size_t i) const;
  std::uint32_t add(std::uint64_t id);  // a new slot, most recently used
  void link_front(std::uint32_t slot);  // an unlinked slot becomes the most recently used
  void to_front(std::uint32_t slot);    // a linked one does
  void unlink(std::uint32_t slot);
  row_flush take_pending(std::uint32_t slot);
  void evict_beyond(std::size_t capacity, std::vector<row_flush>& out);

  std::uint32_t dim_;
  std::size_t capacity_;
  std::uint64_t staleness_;
  id_index index_;  // id -> slot
  chunked_rows<float> values_, pending_;  // dim_ floats per slot
  chunked_rows<slot_meta> meta_;
  std::vector<std::uint32_t> free_;
  std::uint32_t head_ = none, tail_ = none;  // most and least recently used
  std::uint64_t calls_ = 0;  // misses() calls
  // Per position of the batch misses() saw last, the slot found (none: a miss, looked
  // up again once filled). Only a hint: a slot is used only while it holds that id.
  mutable std::vector<std::uint32_t> hint_;
  std::unordered_set<std::uint64_t> missing_;  // misses() dedupes the batch's misses in it
  // (pending_since, id) as rows gained pending sums, so due() looks at what is due only;
  // entries of rows flushed or evicted since are skipped there.
  std::deque<std::pair<std::uint64_t, std::uint64_t>> pending_order_;
  std::uint64_t hits_ = 0, missed_ = 0;
};

// What a cache of unbounded capacity saves on a sequence of batches (each a list of row
// ids, one batch per clock) at staleness S, in rows moved: without a cache every batch
// pulls and pushes its distinct rows; with one, a row costs a pull when first touched
// or older than S clocks, and a push when refreshed (if it had gradients) or at the end.
// train_ctr's embedding_bytes_bound is `with_cache` times the row's bytes.
struct cache_bound {
  std::uint64_t without_cache = 0;  // rows pulled plus rows pushed
  std::uint64_t with_cache = 0;
};
cache_bound unbounded_cache_traffic(const std::vector<std::vector<std::uint64_t>>& batches, std::uint64_t staleness);

// The same, batch by batch, for a worker that cannot hold all its batches (train_ctr).
class cache_traffic_counter {
 public:
  explicit cache_traffic_counter(std::uint64_t staleness) : staleness_(staleness) {}
  // One batch's ids (repeats allowed) at `clock`; clocks ascend.
  void batch(std::span<const std::uint64_t> ids, std::uint64_t clock);
  // So far, counting the flush at the end of what is still pending.
  cache_bound total() const { return {bound_.without_cache, bound_.with_cache + dirty_.size()}; }

 private:
  std::uint64_t staleness_;
  cache_bound bound_;
  std::unordered_map<std::uint64_t, std::uint64_t> pulled_at_;  // id -> clock of its cached version
  std::unordered_set<std::uint64_t> dirty_;
};

}  // namespace ps
