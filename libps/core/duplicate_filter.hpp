#pragma once
// Which (worker, sequence) updates a shard copy has already taken. A push is sent again
// after a failover or a lost reply; every copy in a chain must apply it exactly once.
// Sequence numbers are per worker and increase in the order its client sends; resends
// keep theirs. Memory is bounded: per worker the newest `window` numbers are kept, and
// anything older than those counts as seen (a resend that late cannot happen while its
// sender still waits for the acknowledgement of the window's requests).
#include <cstdint>
#include <deque>
#include <map>

namespace ps {

class duplicate_filter {
 public:
  explicit duplicate_filter(std::size_t window = 1u << 16) : window_(window) {}
  // True the first time (worker, seq) is offered, false after.
  bool first_time(std::uint32_t worker, std::uint64_t seq);
  bool seen(std::uint32_t worker, std::uint64_t seq) const;
  std::size_t remembered() const;
  // What `other` has seen counts as seen here too (keys handed over with their history).
  void merge(const duplicate_filter& other);
  // cereal (a handoff carries the filter; needs cereal's map and deque types).
  template <class Archive>
  void serialize(Archive& ar) {
    ar(window_, workers_);
  }

 private:
  // Kept sorted: a worker's seqs mostly arrive in order, so a new one is appended and the
  // oldest dropped from the front, and a lookup is a binary search over packed numbers (a
  // std::set's node walk was a tenth of a shard's thread at 4 KiB window 8).
  struct per_worker {
    std::deque<std::uint64_t> recent;
    std::uint64_t floor = 0;  // every seq <= floor counts as seen (0: none yet)
    bool has_floor = false;
    template <class Archive>
    void serialize(Archive& ar) {
      ar(recent, floor, has_floor);
    }
    bool remembers(std::uint64_t seq) const;
    void remember(std::uint64_t seq);
    void keep_newest(std::size_t window);
  };
  std::size_t window_;
  std::map<std::uint32_t, per_worker> workers_;
};

}  // namespace ps
