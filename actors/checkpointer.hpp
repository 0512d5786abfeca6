#pragma once
// The checkpoint writer: shards send their state when the minimum clock crosses a multiple
// of --checkpoint-every; once every shard's part for a clock is in, it writes one file
// (libps/checkpoint.hpp) and tells the observer. Lives in the coordinator's process.
#include <map>

#include "actors/messages.hpp"
#include "libps/checkpoint.hpp"

namespace ps {

struct checkpointer_options {
  std::string dir;
  checkpoint_header header;  // model, epoch, shard ids, map settings, rule (clock filled per file)
  caf::actor observer;       // gets (report_atom, UINT32_MAX, "checkpoint ...") lines; none: stderr
};

struct checkpointer_state {
  std::map<std::uint64_t, std::map<std::uint32_t, shard_snapshot>> pending;  // clock -> shard -> state
  std::uint64_t epoch = 0;  // of the newest shard map heard of
  static inline const char* name = "checkpointer";
};

caf::behavior checkpointer(caf::stateful_actor<checkpointer_state>* self, checkpointer_options opts);

}  // namespace ps
