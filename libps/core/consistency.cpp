#include "libps/core/consistency.hpp"

#include "libps/keys/keys.hpp"
#include "libps/sim/sabotage.hpp"

namespace ps {

std::string staleness_to_string(std::uint64_t s) {
  return s == infinite_staleness ? "inf" : std::to_string(s);
}

std::uint64_t staleness_from(const std::string& consistency, std::int64_t staleness) {
  const bool given = staleness >= 0;
  if (consistency == "bsp") {
    if (given && staleness != 0)
      throw bad_request("--staleness=" + std::to_string(staleness) +
                        " contradicts --consistency=bsp (bulk-synchronous is staleness 0)");
    return 0;
  }
  if (consistency == "asp") {
    if (given)
      throw bad_request("--staleness=" + std::to_string(staleness) +
                        " contradicts --consistency=asp (asynchronous has no staleness bound)");
    return infinite_staleness;
  }
  if (consistency == "ssp") {
    if (!given) return 3;
    if (staleness == 0)
      throw bad_request("--consistency=ssp needs --staleness >= 1 (staleness 0 is --consistency=bsp)");
    return static_cast<std::uint64_t>(staleness);
  }
  if (consistency.empty()) return given ? static_cast<std::uint64_t>(staleness) : 0;
  throw bad_request("--consistency=" + consistency + " is not one of bsp|ssp|asp");
}

const char* consistency_name(std::uint64_t staleness) {
  if (staleness == 0) return "bsp";
  if (staleness == infinite_staleness) return "asp";
  return "ssp";
}

consistency_model consistency_model::ssp(std::uint64_t bound) {
  if (bound == 0 || bound == infinite_staleness)
    throw bad_request("ssp needs a staleness bound of at least 1 (0 is bsp; no bound is asp)");
  return {bound};
}

std::string consistency_model::to_string() const {
  if (staleness == 0 || staleness == infinite_staleness) return name();
  return "ssp(" + std::to_string(staleness) + ")";
}

vector_clock::vector_clock(std::size_t workers) : clocks_(workers, 0) {}

void vector_clock::check(std::uint32_t w) const {
  if (w >= clocks_.size())
    throw bad_request("worker " + std::to_string(w) + " is not in the clock vector of " +
                      std::to_string(clocks_.size()) + " workers");
}

std::uint64_t vector_clock::clock(std::uint32_t w) const {
  check(w);
  return clocks_[w];
}

void vector_clock::advance(std::uint32_t w, std::uint64_t c) {
  check(w);
  if (clocks_[w] == left_clock)
    throw bad_request("worker " + std::to_string(w) + " left the job; its clock cannot advance");
  if (c < clocks_[w])
    throw bad_request("worker " + std::to_string(w) + " clock goes back from " +
                      std::to_string(clocks_[w]) + " to " + std::to_string(c));
  clocks_[w] = c;
}

void vector_clock::merge_lower(const std::vector<std::uint64_t>& other, bool fresh) {
  if (clocks_.size() < other.size()) clocks_.resize(other.size(), left_clock);
  for (std::size_t w = 0; w < other.size(); ++w) {
    if (clocks_[w] == left_clock || other[w] == left_clock)
      clocks_[w] = left_clock;  // leaving is for good: a giver that has not heard of it yet will
    else
      clocks_[w] = fresh ? other[w] : std::min(clocks_[w], other[w]);
  }
}

void vector_clock::join(std::uint32_t w, std::uint64_t c) {
  if (w < clocks_.size())
    throw bad_request("worker " + std::to_string(w) + " is already in the clock vector");
  if (c == left_clock) throw bad_request("a worker cannot join at clock infinity");
  clocks_.resize(w + 1, left_clock);
  clocks_[w] = c;
}

void vector_clock::leave(std::uint32_t w) {
  check(w);
  clocks_[w] = left_clock;
}

std::uint64_t vector_clock::min_clock() const {
  std::uint64_t m = left_clock;
  for (auto c : clocks_) m = c < m ? c : m;
  return m;
}

std::uint32_t vector_clock::slowest() const {
  auto m = min_clock();
  for (std::size_t w = 0; w < clocks_.size(); ++w)
    if (clocks_[w] == m && m != left_clock) return static_cast<std::uint32_t>(w);
  return static_cast<std::uint32_t>(clocks_.size());
}

std::uint64_t staleness_controller::needed_min(std::uint64_t c) const {
  if (staleness_ == infinite_staleness || c <= staleness_) return 0;
  return c - staleness_;
}

bool staleness_controller::may_read(std::uint64_t c) const {
  return sabotage::ssp_gate_off || clocks_.min_clock() >= needed_min(c);
}

}  // namespace ps
