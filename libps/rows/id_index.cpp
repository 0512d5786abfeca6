#include "libps/rows/id_index.hpp"

#include <algorithm>
#include <bit>
#include <utility>

namespace ps {

namespace {
constexpr std::size_t min_capacity = 16;
// Full at 3/4: linear probing's runs stay short, and a table of n rows takes 21-43
// bytes a row (16-byte entries), about what std::unordered_map's node and bucket took.
bool over_load(std::size_t rows, std::size_t capacity) { return rows * 4 > capacity * 3; }
}  // namespace

void id_index::reserve(std::size_t rows) {
  std::size_t capacity = std::max(entries_.size(), min_capacity);
  while (over_load(rows, capacity)) capacity *= 2;
  if (capacity != entries_.size()) rebuild(capacity);
}

void id_index::rebuild(std::size_t capacity) {
  std::vector<entry> old(capacity);
  old.swap(entries_);
  mask_ = capacity - 1;
  shift_ = 64 - static_cast<unsigned>(std::countr_zero(capacity));
  for (const auto& e : old)
    if (e.slot != none)
      for (std::size_t i = home(e.id);; i = (i + 1) & mask_)
        if (entries_[i].slot == none) {
          entries_[i] = e;
          break;
        }
}

void id_index::insert(std::uint64_t id, std::uint32_t slot) {
  if (entries_.empty() || over_load(size_ + 1, entries_.size())) reserve(size_ + 1);
  for (std::size_t i = home(id);; i = (i + 1) & mask_)
    if (entries_[i].slot == none) {
      entries_[i] = {id, slot};
      ++size_;
      return;
    }
}

bool id_index::erase(std::uint64_t id) {
  if (size_ == 0) return false;
  std::size_t hole = home(id);
  while (entries_[hole].id != id || entries_[hole].slot == none) {
    if (entries_[hole].slot == none) return false;
    hole = (hole + 1) & mask_;
  }
  // Backward shift: an entry further along the run moves into the hole unless its home
  // lies cyclically after the hole (then it would be found before reaching the hole).
  for (std::size_t i = (hole + 1) & mask_; entries_[i].slot != none; i = (i + 1) & mask_) {
    const std::size_t from_home = (i - home(entries_[i].id)) & mask_;
    const std::size_t from_hole = (i - hole) & mask_;
    if (from_home >= from_hole) {
      entries_[hole] = entries_[i];
      hole = i;
    }
  }
  entries_[hole] = entry{};
  --size_;
  return true;
}

}  // namespace ps
