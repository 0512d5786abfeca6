#include "libps/duplicate_filter.hpp"

#include "libps/sabotage.hpp"

namespace ps {

bool duplicate_filter::seen(std::uint32_t worker, std::uint64_t seq) const {
  auto it = workers_.find(worker);
  if (it == workers_.end()) return false;
  const auto& w = it->second;
  return (w.has_floor && seq <= w.floor) || w.recent.count(seq) > 0;
}

bool duplicate_filter::first_time(std::uint32_t worker, std::uint64_t seq) {
  if (seen(worker, seq) && !sabotage::dedupe_off) return false;
  auto& w = workers_[worker];
  w.recent.insert(seq);
  while (w.recent.size() > window_) {
    w.floor = *w.recent.begin();
    w.has_floor = true;
    w.recent.erase(w.recent.begin());
  }
  return true;
}

void duplicate_filter::merge(const duplicate_filter& other) {
  for (const auto& [worker, theirs] : other.workers_) {
    auto& mine = workers_[worker];
    if (theirs.has_floor) {
      mine.floor = mine.has_floor ? std::max(mine.floor, theirs.floor) : theirs.floor;
      mine.has_floor = true;
    }
    mine.recent.insert(theirs.recent.begin(), theirs.recent.end());
    if (mine.has_floor) mine.recent.erase(mine.recent.begin(), mine.recent.upper_bound(mine.floor));
    while (mine.recent.size() > window_) {
      mine.floor = *mine.recent.begin();
      mine.has_floor = true;
      mine.recent.erase(mine.recent.begin());
    }
  }
}

std::size_t duplicate_filter::remembered() const {
  std::size_t n = 0;
  for (const auto& [id, w] : workers_) n += w.recent.size();
  return n;
}

}  // namespace ps
