#pragma once
// Row id -> slot, for the rows a table or cache holds: one flat array of (id, slot)
// pairs, open addressing with linear probing and backward-shift deletion (no
// tombstones). A lookup costs one cache miss, where std::unordered_map's cost two (the
// bucket, then the node): on a shard whose RAM tier holds millions of rows every request
// looks each of its rows up several times, and in a profile of a bench_sparse pull cell
// the shard's lookups were about a tenth of its actor thread (BENCHMARKS.md). prefetch()
// lets a loop over a request's ids start the next misses while it works on this one.
// (Abseil's flat_hash_map does this too; it is not among the project's dependencies.)
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ps {

class id_index {
 public:
  static constexpr std::uint32_t none = UINT32_MAX;
  std::size_t size() const { return size_; }
  // The slot of `id`, or none.
  std::uint32_t find(std::uint64_t id) const {
    if (size_ == 0) return none;
    for (std::size_t i = home(id);; i = (i + 1) & mask_) {
      const auto& e = entries_[i];
      if (e.slot == none) return none;
      if (e.id == id) return e.slot;
    }
  }
  bool contains(std::uint64_t id) const { return find(id) != none; }
  // Starts loading the line where `id` would be (a hint; no effect on the contents).
  void prefetch(std::uint64_t id) const {
    if (!entries_.empty()) __builtin_prefetch(&entries_[home(id)]);
  }
  // Adds id -> slot; `id` must not be held (slot != none).
  void insert(std::uint64_t id, std::uint32_t slot);
  // Removes `id`; false when it is not held.
  bool erase(std::uint64_t id);
  // Room for `rows` without growing.
  void reserve(std::size_t rows);

 private:
  struct entry {
    std::uint64_t id = 0;
    std::uint32_t slot = none;  // none: the place is free
  };
  // Fibonacci hashing: the top bits of id times 2^64 / phi, so ids that differ only in
  // their low bits (consecutive ids) spread over the table.
  std::size_t home(std::uint64_t id) const { return static_cast<std::size_t>((id * 0x9E3779B97F4A7C15ull) >> shift_); }
  void rebuild(std::size_t capacity);
  std::vector<entry> entries_;
  std::size_t mask_ = 0;
  unsigned shift_ = 64;
  std::size_t size_ = 0;
};

// f(i) for each position of ids in order, the index's line for the id a few positions
// ahead loading meanwhile: a request's lookups then overlap their cache misses.
template <class F>
void for_each_prefetched(const id_index& index, std::span<const std::uint64_t> ids, F f) {
  constexpr std::size_t ahead = 8;
  for (std::size_t i = 0; i < std::min(ahead, ids.size()); ++i) index.prefetch(ids[i]);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i + ahead < ids.size()) index.prefetch(ids[i + ahead]);
    f(i);
  }
}

}  // namespace ps
