#pragma once
// Rows kept in slots of flat arrays (sparse_table, row_cache): a slot freed goes on a free
// list and is taken again before the arrays grow.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ps {

// A free slot if there is one, else a new one at the end: meta grows by one and grow()
// extends the caller's arrays of row data.
template <class Meta, class Grow>
std::uint32_t take_slot(std::vector<std::uint32_t>& free, Meta& meta, Grow grow) {
  if (!free.empty()) {
    auto slot = free.back();
    free.pop_back();
    return slot;
  }
  meta.emplace_back();
  grow();
  return static_cast<std::uint32_t>(meta.size() - 1);
}

// Rows of `width` elements each, in chunks of at most chunk_bytes (or one row) that never move once
// made. Growing copies nothing, so memory grows with the rows held and no more: a
// std::vector that doubles holds its old and new arrays at once, and a shard whose RAM
// tier filled a 1.44 GB budget so peaked at 2.43 GB (docs/sparse-tables.md, "Measured").
// A chunk's elements are default-initialized (floats: left as they were; metadata with
// member initializers is written whole). Chunks of 64 KiB: a table of one row costs
// that, not the 1.3 MB of metadata a 2 MiB chunk wrote (a CTR model has 26 tables per
// shard), and 10^7 rows take some 10^5 chunk pointers.
template <class T>
class chunked_rows {
 public:
  explicit chunked_rows(std::size_t width = 1, std::size_t chunk_bytes = std::size_t{64} << 10) : width_(width) {
    while ((std::size_t{2} << shift_) * width_ * sizeof(T) <= chunk_bytes) ++shift_;
    mask_ = (std::size_t{1} << shift_) - 1;
  }
  std::size_t size() const { return size_; }
  std::size_t width() const { return width_; }
  T* row(std::size_t i) { return chunks_[i >> shift_].get() + (i & mask_) * width_; }
  const T* row(std::size_t i) const { return chunks_[i >> shift_].get() + (i & mask_) * width_; }
  T& operator[](std::size_t i) { return *row(i); }
  const T& operator[](std::size_t i) const { return *row(i); }
  // One more row at the end.
  void emplace_back() {
    if ((size_ >> shift_) == chunks_.size()) chunks_.emplace_back(new T[(mask_ + 1) * width_]);
    ++size_;
  }

 private:
  std::size_t width_;
  std::size_t shift_ = 0, mask_ = 0;  // rows per chunk: 2^shift_
  std::size_t size_ = 0;
  std::vector<std::unique_ptr<T[]>> chunks_;
};

}  // namespace ps
