#pragma once
// The disk tier of a shard's sparse tables: RocksDB (Debian's librocksdb-dev, the store
// HugeCTR's and Paddle's SSD tiers use), opened so that reads go to the device, not to
// the page cache (use_direct_reads; flushes and compactions direct too), with a small
// block cache: the RAM tier above it (libps/rows/row_tier.hpp) is the cache. Blocking calls:
// only an I/O actor's own thread makes them. The store is scratch: made fresh in its own
// directory under the one given and removed when closed (durability is the job of
// checkpoints and replicas); opening one also removes those that processes no longer
// running left behind.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "libps/rows/row_store.hpp"

namespace rocksdb {
class DB;
class Env;
class Snapshot;
}

namespace ps {

// Why `dir` cannot hold a disk tier (not a writable directory, or its file system does
// not do O_DIRECT, e.g. tmpfs); empty when it can.
std::string direct_io_problem(const std::string& dir);

// The RocksDB store of a shard's disk tier (the row_store interface's calls are
// documented there; what is RocksDB's own is said here).
class row_disk final : public row_store {
 public:
  // strides: floats per row of each table, by index. name: made part of the directory's
  // name (a shard's name). env: RocksDB's access to files (none: the default; tests give
  // one whose disk fills up). seed: a checkpoint of a store (save) to start from (empty:
  // none); its table files are hard-linked where the file system allows, not copied.
  // Throws bad_request naming the path when it cannot be opened.
  row_disk(const std::string& dir, const std::string& name, std::vector<std::size_t> strides,
           rocksdb::Env* env = nullptr, const std::string& seed = {});
  ~row_disk();
  row_disk(const row_disk&) = delete;
  row_disk& operator=(const row_disk&) = delete;

  // Reads rows: found[i] says whether keys[i] was there; the found rows' floats are
  // appended to rows in order. Throws bad_request naming the path on an I/O error or a
  // stored row of the wrong size. Safe to call from several threads at once (RocksDB's
  // reads are): a device serves many random reads in flight far faster than one at a
  // time, so the shard's I/O runs several readers (--disk-readers, default_readers).
  // pushed[i]: the clock of the row's last push as written (0: written without one).
  // pinned: read the store as pin() left it (throws bad_request when nothing is pinned).
  void read(const std::vector<row_key>& keys, std::vector<std::uint8_t>& found, std::vector<float>& rows,
            std::vector<std::uint64_t>& pushed, bool pinned = false) override;
  // Of at most `page` of the table's rows from id sweep.from on, the ids of those last
  // pushed before sweep.before, rows pushed before sweep.revived_at counting as pushed
  // then (rows restored from a checkpoint live from the clock the job resumed at), and
  // where the next page starts. Throws bad_request naming the path.
  swept_page expired(const disk_sweep& sweep, std::size_t page = std::size_t{1} << 16) override;
  // Of at most `page` of the table's rows from move.from on, those move.moves picks, with
  // their floats, deleted from the store in the same call; and where the next page starts.
  // Throws bad_request naming the path.
  moved_page take_moved(const disk_move& move, std::size_t page = move_page) override;
  // Deletes every row of move.table from move.from on that move.moves picks, in one call
  // (page by page, no row copied out), and returns how many: what a copy of a chain kept
  // of a map change once the change is over, so no later scan hands it over again.
  std::uint64_t drop_moved(disk_move move) override;
  // Writes rows (one batch, no write-ahead log); throws bad_request naming the path
  // (a full disk among them).
  void write(const row_write& w) override;
  // Writes rows 0..count-1 of a table that `keep` accepts, as first touch makes them, in
  // bulk (sorted SST files ingested whole): how a benchmark fills a large table quickly.
  // Returns the rows written. Throws bad_request.
  std::uint64_t fill(std::uint32_t table, std::uint64_t count, const sparse_table_spec& spec,
                     const std::function<bool(std::uint64_t)>& keep) override;
  // Writes rows (the RAM tier's changed ones), then makes a checkpoint of the whole store
  // in `dir` (which must not exist; its parent is made): RocksDB's checkpoint hard-links
  // the table files, so checkpoints share the files that did not change (incremental).
  // Throws bad_request naming the paths.
  void save(const row_write& rows, const std::string& dir) override;
  // Writes rows (the RAM tier's changed ones), then pins the store as it is now (a
  // RocksDB snapshot), so a chain's tail can seed a new copy with the rows it held at
  // that moment, page by page, while it goes on writing. A new pin replaces the last.
  // Throws bad_request naming the path.
  void pin(const row_write& rows) override;
  // Of at most `page` of the pinned store's rows of the table from id `from` on: their
  // floats, and where the next page starts. Throws bad_request naming the path, or when
  // nothing is pinned.
  moved_page pinned_page(std::uint32_t table, std::uint64_t from, std::size_t page = move_page) const override;
  void unpin() override;
  // Writes what is buffered in memory to files and waits for it (tests: a store whose
  // rows are all in files). Throws bad_request naming the path.
  void flush() override;
  // Bytes of the store's files on disk.
  std::uint64_t bytes_on_disk() const override;
  const std::string& path() const override { return path_; }

 private:
  // Calls f(id, stored value) for at most `page` of the table's rows from id `first` on,
  // in id order; returns the id the next page starts at (none: the table's end). Throws
  // bad_request naming the path.
  // pinned: read the store as pin() left it.
  std::optional<std::uint64_t> scan(std::uint32_t table, std::uint64_t first, std::size_t page,
                                    const std::function<void(std::uint64_t, std::string_view)>& f,
                                    bool pinned = false) const;
  // The floats' bytes of a stored row of `stored` bytes (its push clock may follow them);
  // throws bad_request for any other size (a corrupt store).
  std::size_t row_bytes(const row_key& k, std::size_t stored) const;
  // Deletes, of at most `page` of move.table's rows from move.from on, those move.moves
  // picks, each shown to `taken` first (id, stored value); returns where the next page
  // starts (none: the table's end). Throws bad_request naming the path.
  std::optional<std::uint64_t> delete_picked(const disk_move& move, std::size_t page,
                                             const std::function<void(std::uint64_t, std::string_view)>& taken);
  void check_table(std::uint32_t table) const;  // throws bad_request naming the path
  // take_moved of a listed move: the rows of up to `page` listed ids held here.
  moved_page take_listed(const disk_move& move, std::size_t page);
  // Appends a stored row (its floats; a push clock after them is left out) to a page.
  void add_row(moved_page& page, std::uint64_t id, std::string_view value) const;
  std::string path_;
  std::vector<std::size_t> strides_;
  std::unique_ptr<rocksdb::DB> db_;
  const rocksdb::Snapshot* pinned_ = nullptr;
};

// The rows a checkpoint saved from a disk tier (row_disk::save's directory), opened
// read-only and loaded whole (an export's use): per table (strides: floats per row of
// each, as the store's), ids ascending. Throws bad_request naming the path when it is
// missing or corrupt, or holds a row of another size.
std::vector<table_rows> read_saved_rows(const std::string& dir, const std::vector<std::size_t>& strides);

// Whose a row is under a shard map: the id of its owner shard; none: a shard's whose
// rows are not being laid out (a recovery lays out only the dead shard's).
using row_owner_fn = std::function<std::optional<std::uint32_t>(const row_key&)>;
// The rows of saved stores (row_disk::save's directories, one per shard of a checkpoint)
// laid out for other shards: each row, bytes as stored, goes to its owner's fresh store,
// into/shard-<id> (saved_rows_path) for each id in `shards`, which a disk tier can start
// from as from a checkpoint's. `into` is made afresh. Streams: it holds one batch of rows
// per new shard, not the table. Returns each new shard's rows per table (`tables` of them).
// Throws bad_request naming the path: a missing or corrupt store, a row of a table the job
// does not have, a row whose owner is not among `shards`, a store that cannot be written.
// own(i, row): whether saved[i] held the row as its shard's own under the saved map (none:
// every row); a row left over in another's store (a copy's of an earlier map change,
// never read there) is skipped, so it cannot land beside its owner's copy of the row.
using saved_row_fn = std::function<bool(std::size_t, const row_key&)>;
std::map<std::uint32_t, std::vector<std::uint64_t>> lay_out_saved_rows(const std::vector<std::string>& saved,
                                                                       std::size_t tables, const row_owner_fn& owner,
                                                                       const std::vector<std::uint32_t>& shards,
                                                                       const std::string& into, const saved_row_fn& own = {});
std::string saved_rows_path(const std::string& into, std::uint32_t shard);

// This process's bytes read from storage devices (/proc/self/io read_bytes) and its
// peak resident memory (VmHWM in /proc/self/status), in bytes; 0 where unreadable.
std::uint64_t process_disk_read_bytes();
std::uint64_t process_peak_rss();

}  // namespace ps
