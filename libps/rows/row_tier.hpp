#pragma once
// The rows of a shard's sparse tables as a tiered store: a RAM tier within a byte
// budget (the tables' rows) over a disk tier (libps/rows/row_disk.hpp) that this class never
// touches: it says which rows to read (want) and which evicted rows to write (trim), and
// takes what was read (loaded) and the writes' completion (written) as events, so the
// actor that uses it never waits on the disk. A write batch stays here until it has
// landed (the I/O actor shares it), and a row that left RAM while a write of it is under
// way is taken back from that batch: a row is read from disk only when no write of it is
// under way, and reads need no order with writes.
#include <cstdint>
#include <functional>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "libps/persist/snapshot_types.hpp"
#include "libps/rows/count_min.hpp"
#include "libps/rows/sparse_table.hpp"

namespace ps {

struct row_key {
  std::uint32_t table = 0;
  std::uint64_t id = 0;
  bool operator==(const row_key& o) const { return table == o.table && id == o.id; }
};
struct row_key_hash {
  std::size_t operator()(const row_key& k) const { return std::hash<std::uint64_t>{}(k.id * 0x9E3779B97F4A7C15ull ^ k.table); }
};

// Evicted rows to write to the disk tier: each row's stride floats back to back.
struct row_write {
  std::uint64_t seq = 0;
  std::vector<row_key> keys;
  std::vector<float> rows;
  std::vector<std::uint64_t> pushed;  // per key: the clock of the row's last push (for expiry)
  std::vector<row_key> deleted;       // rows to remove from the disk (expired)
};

// A scan of a table's rows on disk for those last pushed before `before` (row_disk::expired).
// It goes in pages (from: the first id of this one), so writes queued behind it on the
// I/O writer's thread wait for one page, not for the whole table.
struct disk_sweep {
  std::uint32_t table = 0;
  std::uint64_t before = 0;
  std::uint64_t revived_at = 0;
  std::uint64_t from = 0;
};
// A page of a sweep: the expired ids among the rows it scanned, and where the next
// page starts (more: there is one).
struct swept_page {
  std::vector<std::uint64_t> ids;
  bool more = false;
  std::uint64_t next = 0;
};

// A scan of a table's rows on disk for those a map change gives to other shards
// (row_disk::take_moved): each page's rows leave the disk as they are returned, so a row
// handed over is nowhere here afterwards. Pages, as a sweep's, so writes queued behind
// it wait for one page.
struct disk_move {
  std::uint32_t table = 0;
  std::uint64_t from = 0;
  std::function<bool(std::uint64_t)> moves;  // by id: the new map gives it to another shard
  // Not empty: no scan, only these ids (ascending) are read by key and taken, a page of
  // them at a time, `from` then being a position in this list. How a giver that copied
  // the moved rows ahead takes the few changed since at the cut (shard_core::hand_off).
  std::vector<std::uint64_t> listed = {};
  // A listed move that copies the rows as the store's pin holds them, leaving them on
  // the disk (a seed's).
  bool keep = false;
};
// A page of it: the moved rows (the table's stride floats each, back to back), and where
// the next page starts (more: there is one).
struct moved_page {
  std::uint32_t table = 0;
  std::vector<std::uint64_t> ids;
  std::vector<float> rows;
  bool more = false;
  std::uint64_t next = 0;
};

struct row_tier_stats {
  std::uint64_t hits = 0;     // rows a request found in RAM when it arrived
  std::uint64_t misses = 0;   // rows it did not (read from disk or created)
  std::uint64_t created = 0;  // rows created (first touch)
  std::uint64_t read = 0;     // rows read from the disk tier (found there)
  std::uint64_t taken_back = 0;  // rows back in RAM from a write under way (no read)
  std::uint64_t written = 0;  // rows written to the disk tier
  std::uint64_t refused = 0;  // pushed rows dropped, not admitted yet (their gradients discarded)
  std::uint64_t expired = 0;  // rows dropped, not pushed to for their table's expire_after clocks
  std::uint64_t moved = 0;    // rows handed over to another shard (its map changed)
};

// The smallest RAM budget of a shard with a disk tier (--shard-memory; 0 is none).
constexpr std::uint64_t min_tier_budget = std::uint64_t{1} << 20;

class row_tier {
 public:
  // budget: bytes for the RAM tier's rows (sparse_table::bytes); 0: unlimited, no disk
  // tier (every row stays in RAM). Throws bad_request for a bad spec, or for row expiry
  // with a disk tier (rows on disk do not expire yet).
  row_tier(std::vector<sparse_table_spec> specs, std::uint64_t budget, eviction_policy policy);

  bool tiered() const { return budget_ > 0; }
  std::size_t num_tables() const { return tables_.size(); }
  sparse_table& table(std::uint32_t t) { return tables_.at(t); }
  const sparse_table& table(std::uint32_t t) const { return tables_.at(t); }

  // Admission (a table's admit_after > 1): counts a push's rows as sightings and returns
  // the positions of those seen fewer times than admit_after, whose gradients are dropped
  // (stats.refused). Rows below it are never created; admitted() says which a pull may
  // read, the others are answered with their first-touch value. One sketch
  // (libps/rows/count_min.hpp) over all tables; none without admission.
  std::vector<std::size_t> refuse(std::uint32_t table, std::span<const std::uint64_t> ids);
  bool admits_all(std::uint32_t table) const { return tables_.at(table).spec().admit_after <= 1; }
  bool admitted(std::uint32_t table, std::uint64_t id) const;
  // The shard's minimum clock is now `clock`: drops the rows of tables with expiry that
  // were not pushed to for expire_after clocks (swept every expire_after/4 clocks). With
  // a disk tier, the dropped rows' copies on disk are deleted by the next trim() (call it
  // at once: until then a read could find them),
  // and the sweeps to run over the disk's rows are returned: their answers go to swept().
  std::vector<disk_sweep> expire(std::uint64_t clock);
  // A disk sweep's page: the expired rows it listed that are not in RAM, being read or
  // being written are counted as expired, and deleted by the next trim(). Returns the
  // sweep's next page to ask for, if any (a table has one sweep under way at a time).
  std::optional<disk_sweep> swept(const disk_sweep& sweep, const swept_page& page);

  // A request for these rows: takes back rows from writes under way and adds
  // those neither held nor being read to `to_read`. True when all are held now. count:
  // the request just arrived (its rows count as hits or misses).
  bool want(std::uint32_t table, std::span<const std::uint64_t> ids, bool count, std::vector<row_key>& to_read);
  // The disk tier's answer to a read: per key found or not (then the row is created,
  // first touch); the found rows' stride floats back to back in `rows`. Throws
  // bad_request when the sizes do not match.
  // pushed: per key, the clock of the row's last push as stored (empty: unknown); a row
  // found expired is made afresh (and its copy deleted).
  void loaded(const std::vector<row_key>& keys, const std::vector<std::uint8_t>& found, const std::vector<float>& rows,
              const std::vector<std::uint64_t>& pushed = {});
  // Marks these rows (those held) as just used and returns the stamp from which they are
  // kept by trim, so a request waiting for some of its rows keeps the others; the ids
  // of those not held are appended to `absent`.
  std::uint64_t keep(std::uint32_t table, std::span<const std::uint64_t> ids, std::vector<std::uint64_t>& absent);
  // Evicts rows until the RAM tier is within budget, except rows used at or after
  // keep_from (then the budget is exceeded for now); the dirty ones come back as one
  // batch to write (none dirty: null), shared with this tier until written(seq).
  std::shared_ptr<const row_write> trim(std::uint64_t keep_from = UINT64_MAX);
  void written(std::uint64_t seq);
  // A benchmark's fill: row `id` created as on first touch, in RAM (no disk tier); or
  // `rows` rows written straight to the disk tier (row_disk::fill), counted as created.
  void create(std::uint32_t table, std::uint64_t id);
  void filled_on_disk(std::uint32_t table, std::uint64_t rows);
  // For a checkpoint of a tiered store: a copy of every row in RAM that the disk tier
  // lacks (changed since read), to write before the store's own checkpoint. The rows
  // stay dirty: they are written again when evicted, so no read ever needs this write.
  row_write dirty_rows() const;
  // A restored disk tier holds `rows` rows (counted as created), so many of each table
  // (a checkpoint of format 3 or older counts none per table: the tier's table_bytes then
  // leaves them out). Throws bad_request when the table counts do not match.
  void restored_on_disk(const std::vector<std::uint64_t>& rows_per_table, std::uint64_t rows);
  // Admission's counts, to checkpoint (empty: no table admits after more than 1 push),
  // and a checkpoint's counts taken in (added, so the counts of several shards of an
  // earlier map merge, never under the truth). restore_sightings throws bad_request
  // for counts of another size or a job without admission.
  std::vector<std::uint16_t> sightings() const;
  void restore_sightings(const std::vector<std::uint16_t>& counters);
  // A checkpoint's rows of a table (stride floats each), in RAM; counted as created.
  // Throws bad_request when the table is unknown or its rows are not of this stride
  // (a checkpoint of another model), or with a disk tier (a tiered shard restores its
  // rows from its own kind of checkpoint: row_disk's seed).
  void restore(std::uint32_t table, std::uint32_t stride, const std::vector<std::uint64_t>& ids,
               const std::vector<float>& rows);

  const row_tier_stats& stats() const { return stats_; }
  std::uint64_t held_bytes() const;
  // Bytes of rows in writes under way (kept until they land).
  std::uint64_t buffered_bytes() const { return buffered_bytes_; }
  std::uint64_t budget() const { return budget_; }
  // Rows created so far (each table's first touches) and what they take in values and
  // optimizer state, wherever they are.
  std::uint64_t rows_created() const { return stats_.created; }
  std::uint64_t rows_live() const { return stats_.created - stats_.expired - stats_.moved; }
  // The rows of `table` held here for which `moves` holds, taken out (sorted by id).
  // Only without a disk tier (throws bad_request naming it otherwise).
  table_rows take_rows(std::uint32_t table, const std::function<bool(std::uint64_t)>& moves);
  // With a disk tier, a map change gives rows to other shards: those in RAM for which
  // `moves` holds leave it, the changed ones as one write (returned; null when none
  // changed), so once it and the writes before it have landed the disk holds every
  // moved row exactly once, for disk_move scans to take. Reads of moved rows under way
  // are dropped when they land.
  // copied: of those rows, the ones to hand over from RAM as they leave (a giver that
  // copied the moved rows ahead sends the changed ones so, not through its disk), added
  // to `copies` by table; they are written all the same, so the disk holds every moved
  // row as before.
  std::shared_ptr<const row_write> flush_moved(const std::function<bool(const row_key&)>& moves,
                                               const std::function<bool(const row_key&)>& copied = {},
                                               std::vector<table_rows>* copies = nullptr);
  // Copies of the rows held in RAM that `pick` picks, by table (sorted by id).
  std::vector<table_rows> copy_held(const std::function<bool(const row_key&)>& pick) const;
  // A disk_move page took `rows` rows of `table` off the disk (counted as moved).
  void moved_from_disk(std::uint32_t table, std::uint64_t rows);
  // Rows another shard handed over (stride floats each): held in RAM as changed, since
  // no disk here has them (trim writes them when they are evicted); a row held already
  // takes the newer floats (the giver's chain's new head sends again what its dead head
  // sent). Those not held count as created unless `again` (rows sent before, by a giver
  // that copied them ahead of a map change, and changed there since). Throws bad_request
  // for an unknown table or a stride not the table's.
  void adopt(std::uint32_t table, std::uint32_t stride, const std::vector<std::uint64_t>& ids,
             const std::vector<float>& rows, bool again = false);
  std::uint64_t table_bytes() const;
  // Live rows of each table, wherever they are.
  const std::vector<std::uint64_t>& live_rows() const { return live_; }

 private:
  struct in_write {
    static constexpr std::size_t deleted = SIZE_MAX;
    std::uint64_t seq;     // the latest write of the row under way
    std::size_t offset;    // where the row lies in that batch's rows (deleted: it is deleted)
    std::uint64_t pushed;  // the clock of its last push
  };
  bool expired(std::uint32_t table, std::uint64_t last_push) const;
  // Throws bad_request unless `table` is known and its rows have `stride` floats (what: whose rows, e.g. "the checkpoint").
  sparse_table& table_of_stride(std::uint32_t table, std::uint32_t stride, const std::vector<std::uint64_t>& ids,
                                const std::vector<float>& rows, const std::string& what);
  void created(std::uint32_t table);
  // The table whose next victim was used longest ago, if used before keep_from.
  std::optional<std::uint32_t> oldest_table(std::uint64_t keep_from) const;
  // A batch built with seq next_write_ + 1 goes under way (none: it writes nothing).
  std::shared_ptr<const row_write> start_write(std::shared_ptr<row_write> w);
  // The row's floats in its latest write under way (none: nullptr).
  const float* row_in_write(const row_key& key) const;
  std::shared_ptr<std::uint64_t> clock_ = std::make_shared<std::uint64_t>(0);  // one eviction order across tables
  std::vector<sparse_table> tables_;
  std::uint64_t budget_;
  std::unordered_set<row_key, row_key_hash> reading_;  // keys asked of the disk, not answered yet
  std::unordered_set<row_key, row_key_hash> dropped_;  // of those, keys that moved to another shard meanwhile
  // Writes under way, in order (their seqs are consecutive), and where each row with one
  // lies in the latest. A row taken back and evicted unchanged needs no new write: it
  // stays readable from the one under way.
  std::deque<std::shared_ptr<const row_write>> in_flight_;
  std::unordered_map<row_key, in_write, row_key_hash> writing_;
  std::uint64_t buffered_bytes_ = 0;
  std::uint64_t next_write_ = 0;
  std::vector<std::uint64_t> live_;  // per table: created, less expired and moved
  std::unique_ptr<count_min_sketch> sightings_;  // admission's counts (some table admits after > 1)
  std::vector<std::uint64_t> swept_at_;          // per table, the clock of expiry's last sweep
  std::uint64_t now_ = 0;                        // the shard's minimum clock, as expire() was told
  std::uint64_t revived_at_ = 0;                 // the first clock it was told: restored rows live from it
  std::vector<row_key> deleting_;                // rows to delete from the disk with the next write
  std::vector<bool> sweeping_;                   // per table: a disk sweep under way
  row_tier_stats stats_;
};

}  // namespace ps
