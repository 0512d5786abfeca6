#pragma once
// A sparse table: embedding rows of `dim` floats by 64-bit id (feature hashes, unbounded
// in number), created on first touch, each with its update rule's optimizer state beside
// it. The first-touch value depends only on (seed, table name, id), so every copy of a
// shard, a restart and a migration create the same row. Plain class: a shard holds one
// per table. The rows it holds are the RAM tier of a tiered store (libps/rows/row_tier.hpp):
// each knows whether it changed since it was read from disk (dirty) and the table keeps
// them in eviction order (LRU, or segmented LRU that a scan cannot flush).
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "libps/rows/id_index.hpp"
#include "libps/core/slots.hpp"
#include "libps/core/update_rule.hpp"

namespace ps {

struct sparse_table_spec {
  std::string name;
  std::uint32_t dim = 16;
  float init_scale = 0.01f;  // first-touch values are uniform in [-init_scale, init_scale)
  update_rule rule;          // Adagrad is the usual choice for embeddings
  std::uint64_t seed = 1;
  // Admission: a row is created once its id was pushed this many times (1: on first
  // touch); until then pushes to it are dropped and pulls get its first-touch value.
  std::uint32_t admit_after = 1;
  // Expiry: a row not pushed to for this many clocks (the shard's minimum clock) is
  // dropped, and created afresh if touched again (0: never).
  std::uint64_t expire_after = 0;
  // Throws bad_request naming what is wrong (no name, dim 0 or above 4096, bad scale or
  // rule, admit_after outside 1..65535).
  void validate() const;
};

// Row `id`'s first-touch value: dim floats, uniform in [-scale, scale), a function of
// (seed, table, id) and nothing else (the same on every platform).
void initial_row(std::uint64_t seed, const std::string& table, std::uint64_t id, float scale, float* out,
                 std::uint32_t dim);

// lru: evicts the row used longest ago. slru (segmented LRU): a row used again while
// held moves to a protected segment (at most 80% of what the RAM tier holds), so one
// pass over many rows used once (a scan, the long tail of a Zipf law) evicts only others
// like it.
enum class eviction_policy { lru, slru };
eviction_policy eviction_policy_of(const std::string& name);  // throws bad_request

class sparse_table {
 public:
  // clock: the access counter shared by the tables of one shard, so their eviction
  // orders compare (none: the table's own).
  explicit sparse_table(sparse_table_spec spec, eviction_policy policy = eviction_policy::lru,
                        std::shared_ptr<std::uint64_t> clock = nullptr);  // throws bad_request for a bad spec

  const sparse_table_spec& spec() const { return spec_; }
  // Floats a row takes: its value and each optimizer state slot.
  std::size_t stride() const { return stride_; }
  // Rows `ids` into out (ids.size() * dim floats, in order; an id may repeat). Rows not
  // held are created (first touch) as used at `clock`. Each row counts as a use (see
  // touch) unless its access stamp is at or after used_from: a request that waited for
  // reads marked its rows used then (row_tier::keep) and the rows read for it came in
  // as new, so using them again would count one request twice (under slru, rows read
  // once from disk would skip probation and a scan would flush the protected rows).
  void pull(std::span<const std::uint64_t> ids, float* out, std::uint64_t clock = 0,
            std::uint64_t used_from = UINT64_MAX);
  // Folds grads (ids.size() * dim floats) into the rows with the table's rule, creating
  // rows not held first, and marks them pushed at `clock` (for expiry). A repeated id is
  // updated once per occurrence; clients merge duplicates first (merge_rows) so a
  // request carries each id once.
  // used_from: as for pull.
  void push(std::span<const std::uint64_t> ids, const float* grads, std::uint64_t clock = 0,
            std::uint64_t used_from = UINT64_MAX);
  // Drops the rows last pushed (or created) before `clock`; returns how many.
  // Drops the rows last pushed before `clock`; returns their ids.
  std::vector<std::uint64_t> expire_before(std::uint64_t clock);
  // Counts every row as pushed at `clock` at the latest (rows restored from a checkpoint
  // live from the clock the shard resumes at).
  void restamp(std::uint64_t clock);

  bool holds(std::uint64_t id) const { return index_.contains(id); }
  // f(i) for each position of ids, their lookups overlapped (for_each_prefetched).
  template <class F>
  void for_each_id(std::span<const std::uint64_t> ids, F f) const {
    for_each_prefetched(index_, ids, f);
  }
  // Drops row id (it moved to another shard); false when it is not held.
  bool erase(std::uint64_t id);
  // f(id, row, dirty, pushed) for every row held (stride() floats each; dirty: changed
  // since read from disk; pushed: the clock of its last push, for expiry), in no
  // particular order.
  template <class F>
  void for_each_row(F f) const {
    for (std::size_t slot = 0; slot < meta_.size(); ++slot)
      if (meta_[slot].seg != segment::free)
        f(meta_[slot].id, arena_.row(slot), meta_[slot].dirty, meta_[slot].pushed);
  }
  // The most rows slru keeps protected (the tier sets 80% of the rows its budget holds);
  // beyond it the oldest go back on probation.
  void set_protected_limit(std::size_t rows) { protected_limit_ = rows; }
  // Takes a row read from the disk tier (stride() floats: value, then state), clean; or,
  // stored == nullptr, creates it (first touch), dirty: the disk has never seen it; as
  // pushed at `clock` (for expiry). changed: the stored row came from elsewhere (another
  // shard handed it over), so this disk has never seen it either: dirty.
  void install(std::uint64_t id, const float* stored, std::uint64_t clock = 0, bool changed = false);
  // A row another shard handed over again (it changed there since it was first sent):
  // the held one takes its floats, changed; one not held is installed, changed.
  void replace(std::uint64_t id, const float* stored, std::uint64_t clock = 0);
  // Counts as a use for the eviction order (a request found the row held); false when
  // the row is not held.
  bool touch(std::uint64_t id);
  // The access stamp of the row evict() would take (none held: nullopt).
  std::optional<std::uint64_t> next_victim_stamp() const;
  // Removes that row: its id, whether it changed since read from disk, and its stride()
  // floats appended to `row_out`.
  struct evicted {
    std::uint64_t id;
    bool dirty;
    std::uint64_t pushed;  // the clock of its last push (kept on disk beside it, for expiry)
  };
  evicted evict(std::vector<float>& row_out);

  std::size_t rows() const { return index_.size(); }
  // Bytes the rows and their state take (values and optimizer state, plus the index and
  // eviction order at row_overhead bytes per row).
  std::uint64_t bytes() const { return rows() * row_bytes(); }
  std::uint64_t row_bytes() const { return stride_ * sizeof(float) + row_overhead; }
  static constexpr std::uint64_t row_overhead = 64;

 private:
  static constexpr std::uint32_t none = UINT32_MAX;
  enum class segment : std::uint8_t { free, probation, protected_ };
  struct slot_meta {
    std::uint64_t id = 0;
    std::uint64_t stamp = 0;
    std::uint64_t pushed = 0;  // the clock of its last push (or creation), for expiry
    std::uint32_t prev = none, next = none;
    segment seg = segment::free;
    bool dirty = false;
  };
  struct order {  // a doubly linked list of slots, most recent at the head
    std::uint32_t head = none, tail = none;
    std::size_t size = 0;
  };
  // A use (unless stamped at or after used_from); creates the row on first touch.
  std::uint32_t slot_of(std::uint64_t id, std::uint64_t clock, std::uint64_t used_from);
  std::uint32_t add(std::uint64_t id);  // a slot for a new row, at the head of probation
  void remove(std::uint32_t slot);      // out of the order and the index, slot freed
  void used(std::uint32_t slot);        // a use: stamp, and move per the policy
  void link(order& o, segment s, std::uint32_t slot);
  void unlink(std::uint32_t slot);
  order& list_of(segment s) { return s == segment::protected_ ? protected_ : probation_; }

  sparse_table_spec spec_;
  eviction_policy policy_;
  std::shared_ptr<std::uint64_t> clock_;
  std::size_t stride_;  // floats per row: the value and each state slot
  id_index index_;  // id -> slot
  chunked_rows<float> arena_;                               // a row of stride_ floats per slot
  chunked_rows<slot_meta> meta_;
  std::vector<std::uint32_t> free_;
  order probation_, protected_;
  std::size_t protected_limit_ = SIZE_MAX;
};

// One request's rows with duplicates merged: the distinct ids in first-seen order, the
// sum of each one's gradients (for a push), and for each input position the slot of its
// id among the distinct ones (to spread a pull's answer back).
struct merged_rows {
  std::vector<std::uint64_t> ids;
  std::vector<float> grads;          // ids.size() * dim; empty when no gradients were given
  std::vector<std::uint32_t> slot;   // per input id
};
merged_rows merge_rows(std::span<const std::uint64_t> ids, const float* grads, std::uint32_t dim);

}  // namespace ps
