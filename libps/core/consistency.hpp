#pragma once
// The vector clock over live workers and the staleness controller (BSP, SSP, ASP).
//
// A worker's clock is the number of iterations it has completed; its pushes during
// iteration c carry clock c, and it ticks to c + 1 after sending them. A read (pull)
// at clock c may be answered once min over live workers of their clocks >= c - s, so it
// includes every update with clock <= c - s - 1 from every live worker. s = 0 is BSP,
// s = k is SSP, s = infinite_staleness is ASP. A worker that finishes or dies leaves the
// vector: its entry counts as +infinity, so nobody waits for it.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ps {

inline constexpr std::uint64_t infinite_staleness = UINT64_MAX;
inline constexpr std::uint64_t left_clock = UINT64_MAX;  // the clock of a worker that left

// "inf" for ASP, the number otherwise.
std::string staleness_to_string(std::uint64_t s);

// From --consistency (bsp|ssp|asp, or "" for "decide from the staleness") and
// --staleness (negative: not given). Throws bad_request on a contradiction, e.g.
// bsp with staleness 2, or ssp with staleness 0.
std::uint64_t staleness_from(const std::string& consistency, std::int64_t staleness);
// "bsp", "ssp" or "asp" for a staleness bound.
const char* consistency_name(std::uint64_t staleness);

// A job's consistency model, as the cluster view carries it: BSP, SSP with bound k, or
// ASP, one value whose staleness bound the shards' controllers gate reads on.
struct consistency_model {
  std::uint64_t staleness = 0;  // 0: BSP, k: SSP, infinite_staleness: ASP

  static consistency_model bsp() { return {0}; }
  static consistency_model ssp(std::uint64_t bound);  // bound >= 1, else bad_request
  static consistency_model asp() { return {infinite_staleness}; }
  // From --consistency and --staleness (staleness_from's rules and errors).
  static consistency_model from_flags(const std::string& consistency, std::int64_t staleness) {
    return {staleness_from(consistency, staleness)};
  }
  const char* name() const { return consistency_name(staleness); }
  // "bsp", "ssp(2)" or "asp".
  std::string to_string() const;
  bool operator==(const consistency_model&) const = default;
};

class vector_clock {
 public:
  explicit vector_clock(std::size_t workers = 0);
  std::size_t size() const { return clocks_.size(); }
  // Raises worker w's clock to c (clocks never go back: a lower c is a bad_request).
  void advance(std::uint32_t w, std::uint64_t c);
  // w finished or died: its entry becomes +infinity.
  void leave(std::uint32_t w);
  // A worker joins a running job at clock c (ids between the old size and w, never seen,
  // count as left). Throws bad_request if w is already a member.
  void join(std::uint32_t w, std::uint64_t c);
  bool live(std::uint32_t w) const { return clock(w) != left_clock; }
  std::uint64_t clock(std::uint32_t w) const;
  // Minimum over live workers; left_clock when none is live.
  std::uint64_t min_clock() const;
  // A live worker whose clock is the minimum (the one everybody waits for); size() if none.
  std::uint32_t slowest() const;
  // Every worker's clock (left_clock for those that left), by id.
  const std::vector<std::uint64_t>& values() const { return clocks_; }
  // Keys handed over from another shard: each worker's clock becomes the lower of the two
  // (the updates it holds are known up to there on both); workers only `other` knows of
  // take its clock. A shard that never heard from anyone (fresh: every clock 0) takes
  // `other` as it is. A worker that left either stays left.
  void merge_lower(const std::vector<std::uint64_t>& other, bool fresh);

 private:
  void check(std::uint32_t w) const;
  std::vector<std::uint64_t> clocks_;
};

class staleness_controller {
 public:
  staleness_controller(std::size_t workers, std::uint64_t staleness)
      : clocks_(workers), staleness_(staleness) {}
  std::uint64_t staleness() const { return staleness_; }
  vector_clock& clocks() { return clocks_; }
  const vector_clock& clocks() const { return clocks_; }
  // Whether a read at clock c may be answered now.
  bool may_read(std::uint64_t c) const;
  // The smallest min clock that lets a read at clock c through (0 when it always may).
  std::uint64_t needed_min(std::uint64_t c) const;
  // Whether a push of clock c must wait before it is applied. Only under BSP: there a
  // read at clock c sees exactly the pushes of clocks < c, so a push of clock c stays
  // invisible until every live worker has finished clock c. (SSP and ASP apply pushes
  // at once: reads may be fresher than the bound, and read-my-writes needs it.)
  bool defers_push(std::uint64_t c) const { return staleness_ == 0 && c >= clocks_.min_clock(); }

 private:
  vector_clock clocks_;
  std::uint64_t staleness_;
};

// Reads waiting for the minimum clock to advance, released in clock order.
template <class Read>
class parked_reads {
 public:
  void park(std::uint64_t clock, Read r) { parked_.emplace(clock, std::move(r)); }
  std::size_t size() const { return parked_.size(); }
  // Removes and returns every parked read the controller now lets through.
  std::vector<Read> release(const staleness_controller& ctl) {
    std::vector<Read> out;
    auto it = parked_.begin();
    while (it != parked_.end() && ctl.may_read(it->first)) {
      out.push_back(std::move(it->second));
      it = parked_.erase(it);
    }
    return out;
  }
  template <class F>
  void for_each(F f) const {
    for (const auto& [clock, r] : parked_) f(r);
  }
  // Removes and returns the reads for which pred holds (e.g. waited too long).
  template <class Pred>
  std::vector<Read> release_if(Pred pred) {
    std::vector<Read> out;
    for (auto it = parked_.begin(); it != parked_.end();) {
      if (pred(it->second)) {
        out.push_back(std::move(it->second));
        it = parked_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

 private:
  std::multimap<std::uint64_t, Read> parked_;
};

}  // namespace ps
