#pragma once
// The checkpoint writer: shards send their state when the minimum clock crosses a multiple
// of --checkpoint-every; once every shard's part for a clock is in, the file (libps/
// checkpoint.hpp) goes to a file writer running on a thread of its own (writing and fsync
// block), and the observer hears what was written. Lives in the coordinator's process.
#include <map>
#include <set>
#include <memory>

#include "actors/messages.hpp"
#include "libps/persist/checkpoint.hpp"

// A complete checkpoint goes to the file writer by reference: both live in one process.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<const ps::checkpoint>)

namespace ps {

// Writes one complete checkpoint and answers with its path (or the error).
using checkpoint_file_writer_actor =
  caf::typed_actor<caf::replies_to<write_atom, std::shared_ptr<const checkpoint>>::with<std::string>>;

// The real file writer: write_checkpoint into dir.
checkpoint_file_writer_actor::behavior_type checkpoint_file_writer(checkpoint_file_writer_actor::pointer self,
                                                                   std::string dir);

struct checkpointer_options {
  std::string dir;
  checkpoint_header header;  // model, epoch, shard ids, map settings, rule (clock filled per file)
  observer_actor observer;   // hears "checkpoint written: ..." and refusals as news; none: stderr
  // A test's deterministic stand-in; none: a checkpoint_file_writer on a thread of its
  // own, linked to the checkpointer (it ends with it).
  checkpoint_file_writer_actor file_writer;
};

struct checkpointer_state {
  // The shards of each map and its placement, by the epoch at which that map began (a
  // failover's epoch keeps the shape it follows).
  struct map_shape {
    std::vector<std::uint32_t> shard_ids;
    partitioner::placement_list placement;
    bool operator==(const map_shape&) const = default;
  };
  std::map<std::uint64_t, map_shape> shapes;
  // (clock, the epoch its map's shape began at) -> shard -> state: a file holds the parts
  // of one map, so a part taken before a shard joined never meets one taken after.
  std::map<std::pair<std::uint64_t, std::uint64_t>, std::map<std::uint32_t, shard_snapshot>> pending;
  std::uint64_t epoch = 0;  // of the newest shard map heard of
  bool map_changing = false;
  std::set<std::pair<std::uint64_t, std::uint64_t>> dropped;  // rounds with a part that came while the map changed
  checkpoint_file_writer_actor file_writer;
  std::size_t writing = 0;  // files handed to the writer, not yet answered
  std::vector<caf::typed_response_promise<caf::ok_atom>> flushes;  // waiting for writing == 0
  std::map<std::uint64_t, std::vector<caf::typed_response_promise<std::string>>> awaits;  // by clock
  std::map<std::uint64_t, std::string> written;  // clock -> path of the file written
  static inline const char* name = "checkpointer";
};

checkpointer_actor::behavior_type checkpointer(checkpointer_actor::stateful_pointer<checkpointer_state> self,
                                               checkpointer_options opts);

}  // namespace ps
