#include "libps/core/duplicate_filter.hpp"

#include <algorithm>

#include "libps/sim/sabotage.hpp"

namespace ps {

bool duplicate_filter::per_worker::remembers(std::uint64_t seq) const {
  if (has_floor && seq <= floor) return true;
  if (recent.empty() || seq > recent.back()) return false;  // the usual case: the newest yet
  return std::binary_search(recent.begin(), recent.end(), seq);
}

void duplicate_filter::per_worker::remember(std::uint64_t seq) {
  if (recent.empty() || seq > recent.back()) {
    recent.push_back(seq);
    return;
  }
  auto at = std::lower_bound(recent.begin(), recent.end(), seq);
  if (at == recent.end() || *at != seq) recent.insert(at, seq);  // a resend overtaken by later ones
}

void duplicate_filter::per_worker::keep_newest(std::size_t window) {
  while (recent.size() > window) {
    floor = recent.front();
    has_floor = true;
    recent.pop_front();
  }
}

bool duplicate_filter::seen(std::uint32_t worker, std::uint64_t seq) const {
  auto it = workers_.find(worker);
  return it != workers_.end() && it->second.remembers(seq);
}

bool duplicate_filter::first_time(std::uint32_t worker, std::uint64_t seq) {
  auto& w = workers_[worker];
  if (w.remembers(seq) && !sabotage::dedupe_off) return false;
  w.remember(seq);
  w.keep_newest(window_);
  return true;
}

void duplicate_filter::merge(const duplicate_filter& other) {
  for (const auto& [worker, theirs] : other.workers_) {
    auto& mine = workers_[worker];
    if (theirs.has_floor) {
      mine.floor = mine.has_floor ? std::max(mine.floor, theirs.floor) : theirs.floor;
      mine.has_floor = true;
    }
    std::deque<std::uint64_t> both;
    std::set_union(mine.recent.begin(), mine.recent.end(), theirs.recent.begin(), theirs.recent.end(),
                   std::back_inserter(both));
    if (mine.has_floor) both.erase(both.begin(), std::upper_bound(both.begin(), both.end(), mine.floor));
    mine.recent = std::move(both);
    mine.keep_newest(window_);
  }
}

std::size_t duplicate_filter::remembered() const {
  std::size_t n = 0;
  for (const auto& [id, w] : workers_) n += w.recent.size();
  return n;
}

}  // namespace ps
