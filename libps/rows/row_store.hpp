#pragma once
// The disk tier's store of a shard's sparse-table rows, as the shard's I/O actors use it
// (actors/row_io): one interface, so that the actors and the rows' bookkeeping (row_tier,
// which decides what to read and write and never touches the store) do not depend on how
// rows are stored. row_disk (RocksDB, libps/rows/row_disk.hpp) is the implementation a shard
// runs; another store (in memory for a simulation, a remote one) implements these calls.
// Blocking calls: only an I/O actor's own thread makes them.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "libps/rows/row_tier.hpp"

namespace ps {

class row_store {
 public:
  static constexpr std::size_t move_page = std::size_t{1} << 14;  // rows (a listed move's: ids) a page
  static constexpr std::size_t default_readers = 16;              // reader threads (--disk-readers)

  virtual ~row_store() = default;

  // Reads rows: found[i] says whether keys[i] was there; the found rows' floats are
  // appended to rows in order; pushed[i]: the clock of the row's last push as written
  // (0: written without one). pinned: read the store as pin() left it. Safe to call from
  // several threads at once. Throws bad_request naming the store on an I/O error.
  virtual void read(const std::vector<row_key>& keys, std::vector<std::uint8_t>& found, std::vector<float>& rows,
                    std::vector<std::uint64_t>& pushed, bool pinned = false) = 0;
  // Of at most `page` of the table's rows from sweep.from on, the ids of those last pushed
  // before sweep.before (see disk_sweep), and where the next page starts.
  virtual swept_page expired(const disk_sweep& sweep, std::size_t page = std::size_t{1} << 16) = 0;
  // Of at most `page` of the table's rows from move.from on, those move.moves picks, with
  // their floats, deleted from the store in the same call; and where the next page starts.
  virtual moved_page take_moved(const disk_move& move, std::size_t page = move_page) = 0;
  // Deletes every row of move.table from move.from on that move.moves picks; how many.
  virtual std::uint64_t drop_moved(disk_move move) = 0;
  // Writes rows (one batch).
  virtual void write(const row_write& w) = 0;
  // Writes rows 0..count-1 of a table that `keep` accepts, as first touch makes them
  // (a benchmark's fill); returns the rows written.
  virtual std::uint64_t fill(std::uint32_t table, std::uint64_t count, const sparse_table_spec& spec,
                             const std::function<bool(std::uint64_t)>& keep) = 0;
  // Writes rows, then saves the whole store in `dir` (which must not exist): a checkpoint
  // of the disk tier, which a store can start from.
  virtual void save(const row_write& rows, const std::string& dir) = 0;
  // Writes rows, then pins the store as it is now, so that a chain's tail can seed a new
  // copy page by page while it goes on writing. A new pin replaces the last.
  virtual void pin(const row_write& rows) = 0;
  // Of at most `page` of the pinned store's rows of the table from id `from` on: their
  // floats, and where the next page starts. Throws bad_request when nothing is pinned.
  virtual moved_page pinned_page(std::uint32_t table, std::uint64_t from, std::size_t page = move_page) const = 0;
  virtual void unpin() = 0;
  // Makes what is buffered durable in the store's files and waits for it.
  virtual void flush() = 0;
  // Bytes of the store on disk.
  virtual std::uint64_t bytes_on_disk() const = 0;
  // Where the store is (named in errors).
  virtual const std::string& path() const = 0;
};

}  // namespace ps
