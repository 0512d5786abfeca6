#pragma once
// Rows kept in slots of flat arrays (sparse_table, row_cache): a slot freed goes on a free
// list and is taken again before the arrays grow.
#include <cstdint>
#include <vector>

namespace ps {

// A free slot if there is one, else a new one at the end: meta grows by one and grow()
// extends the caller's arrays of row data.
template <class Meta, class Grow>
std::uint32_t take_slot(std::vector<std::uint32_t>& free, std::vector<Meta>& meta, Grow grow) {
  if (!free.empty()) {
    auto slot = free.back();
    free.pop_back();
    return slot;
  }
  meta.emplace_back();
  grow();
  return static_cast<std::uint32_t>(meta.size() - 1);
}

}  // namespace ps
