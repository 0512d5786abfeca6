#pragma once
// A shard's disk tier on threads of its own, answering by message, so the shard never
// waits on the disk: row_io (spawned detached, linked to its shard) opens the store (a
// directory that cannot hold it ends the shard with an error naming the path) and hands
// writes, in the order asked, to a writer and a read's keys, a few at a time, to whichever
// of its readers is idle (all detached; --disk-readers), so many reads are in flight at
// once and none waits behind a write. Reads need no order with writes: the shard reads a
// row only when no write of it is under way (libps/rows/row_tier.hpp).
#include <caf/all.hpp>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "libps/rows/row_store.hpp"
#include "libps/rows/row_tier.hpp"
#include "actors/messages.hpp"

namespace ps {

// Rows read: per key found or not; the found rows' floats back to back.
struct disk_rows {
  std::shared_ptr<const std::vector<row_key>> keys;  // as asked
  std::vector<std::uint8_t> found;
  std::vector<float> rows;
  std::vector<std::uint64_t> pushed;  // per key: the clock of its last push as stored
};

// A benchmark's fill (row_store::fill).
struct fill_order {
  std::uint32_t table = 0;
  std::uint64_t count = 0;
  sparse_table_spec spec;
  std::function<bool(std::uint64_t)> keep;
};

}  // namespace ps

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const ps::fill_order>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const ps::disk_rows>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const ps::row_write>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const std::vector<ps::row_key>>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ps::disk_sweep)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const ps::swept_page>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ps::disk_move)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const ps::moved_page>)

namespace ps {

using read_rows_atom = caf::atom_constant<caf::atom("readrows")>;
using write_rows_atom = caf::atom_constant<caf::atom("writerows")>;
using save_rows_atom = caf::atom_constant<caf::atom("saverows")>;
using sweep_rows_atom = caf::atom_constant<caf::atom("sweeprows")>;
using move_rows_atom = caf::atom_constant<caf::atom("moverows")>;
using pin_rows_atom = caf::atom_constant<caf::atom("pinrows")>;
using drop_rows_atom = caf::atom_constant<caf::atom("droprows")>;
using copy_rows_atom = caf::atom_constant<caf::atom("copyrows")>;
using unpin_rows_atom = caf::atom_constant<caf::atom("unpinrows")>;

using row_io_actor = caf::typed_actor<
  caf::replies_to<read_rows_atom, std::shared_ptr<const std::vector<row_key>>>::with<std::shared_ptr<const disk_rows>>,
  // Answers with the write's seq once written.
  caf::replies_to<write_rows_atom, std::shared_ptr<const row_write>>::with<std::uint64_t>,
  // Answers with the rows written.
  caf::replies_to<fill_atom, std::shared_ptr<const fill_order>>::with<std::uint64_t>,
  // A checkpoint (row_store::save): after every write asked before it, the RAM tier's
  // changed rows, then the store's checkpoint into the directory; answers once done.
  caf::replies_to<save_rows_atom, std::shared_ptr<const row_write>, std::string>::with<caf::ok_atom>,
  // A page of expiry's scan of a table's rows on disk (row_store::expired), after the
  // writes asked before it.
  caf::replies_to<sweep_rows_atom, disk_sweep>::with<std::shared_ptr<const swept_page>>,
  // A page of a map change's scan (row_store::take_moved), after the writes asked before it.
  caf::replies_to<move_rows_atom, disk_move>::with<std::shared_ptr<const moved_page>>,
  // A chain's tail seeding a new copy: after every write asked before it, the RAM tier's
  // changed rows, then the store pinned as it is (row_store::pin); pages of the pinned
  // rows of a table from an id on (row_store::pinned_page); the pin let go.
  caf::replies_to<pin_rows_atom, std::shared_ptr<const row_write>>::with<caf::ok_atom>,
  caf::replies_to<copy_rows_atom, std::uint32_t, std::uint64_t>::with<std::shared_ptr<const moved_page>>,
  caf::reacts_to<unpin_rows_atom>,
  // What a copy kept of a map change, deleted once the change is over (row_store::drop_moved),
  // after the writes asked before it; answers with the rows deleted.
  caf::replies_to<drop_rows_atom, disk_move>::with<std::uint64_t>>;

// Writes, checkpoints, fills, sweeps, moves and a seed's pages, in the order asked (row_io hands them on).
using row_writer_actor = caf::typed_actor<
  caf::replies_to<sweep_rows_atom, disk_sweep>::with<std::shared_ptr<const swept_page>>,
  caf::replies_to<pin_rows_atom, std::shared_ptr<const row_write>>::with<caf::ok_atom>,
  caf::replies_to<copy_rows_atom, std::uint32_t, std::uint64_t>::with<std::shared_ptr<const moved_page>>,
  caf::reacts_to<unpin_rows_atom>,
  caf::replies_to<drop_rows_atom, disk_move>::with<std::uint64_t>,
  caf::replies_to<move_rows_atom, disk_move>::with<std::shared_ptr<const moved_page>>,
  caf::replies_to<write_rows_atom, std::shared_ptr<const row_write>>::with<std::uint64_t>,
  caf::replies_to<fill_atom, std::shared_ptr<const fill_order>>::with<std::uint64_t>,
  caf::replies_to<save_rows_atom, std::shared_ptr<const row_write>, std::string>::with<caf::ok_atom>>;

using row_reader_actor = caf::typed_actor<
  caf::replies_to<read_rows_atom, std::shared_ptr<const std::vector<row_key>>>::with<std::shared_ptr<const disk_rows>>>;

// How the I/O runs: readers and writer on threads of their own (false: on the scheduler,
// as the simulation needs to keep its schedule deterministic; they then block it while
// they work), and the rows in a page of a map change's scan or a seed (the simulation's
// are small, so pushes fall between them).
struct row_io_settings {
  bool on_threads = true;
  std::size_t page_rows = row_store::move_page;
  std::size_t readers = row_store::default_readers;  // --disk-readers
};

// Spawns one of the disk tier's I/O actors, linked to `self`: detached (a thread of its
// own) when `settings` says so, else on the scheduler.
template <class Self, class Fun, class... Ts>
auto spawn_io(Self* self, const row_io_settings& settings, Fun fun, Ts&&... xs) {
  return settings.on_threads ? self->template spawn<caf::detached + caf::linked>(fun, std::forward<Ts>(xs)...)
                             : self->template spawn<caf::linked>(fun, std::forward<Ts>(xs)...);
}

// A read under way: its keys cut into units of read_unit_keys that idle readers take in
// turn, so every reader has work while any unit is left. (Parts handed to readers round
// robin left the device at 5 reads in flight of 16 readers, as tools/diskstat.sh showed:
// a reader sat on its queued parts while others idled, and each part's reads ran one
// after another; BENCHMARKS.md.)
struct read_job {
  std::shared_ptr<const std::vector<row_key>> keys;
  caf::typed_response_promise<std::shared_ptr<const disk_rows>> promise;
  std::vector<std::shared_ptr<const disk_rows>> parts;  // by unit, as answered
  std::size_t left = 0;                                 // units not answered yet
};
struct read_unit {
  std::shared_ptr<read_job> job;
  std::size_t index = 0;
  std::shared_ptr<const std::vector<row_key>> keys;
};
constexpr std::size_t read_unit_keys = 4;

struct row_io_state {
  std::shared_ptr<row_store> disk;
  std::vector<row_reader_actor> readers;
  std::vector<std::size_t> idle_readers;  // indexes into readers
  std::deque<read_unit> units;            // waiting for an idle reader, oldest first
  row_writer_actor writer;
  static inline const char* name = "row_io";
};

// dir: where the store's directory is made; name: the shard's (in errors and the
// directory's name); strides: floats per row of each table; seed: a checkpoint's rows to
// start from (empty: none). A seed laid out for a recovery (in_recovery_layout) is
// removed once the store took its rows in: nothing else reads it, and it would otherwise
// stay on disk, a copy of the dead shard's rows per recovery.
row_io_actor::behavior_type row_io(row_io_actor::stateful_pointer<row_io_state> self, std::string dir,
                                   std::string name, std::vector<std::size_t> strides, std::string seed,
                                   row_io_settings settings = {});

}  // namespace ps
