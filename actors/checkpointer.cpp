#include "actors/checkpointer.hpp"

#include <cstdio>

namespace ps {

caf::behavior checkpointer(caf::stateful_actor<checkpointer_state>* self, checkpointer_options opts) {
  auto tell = [=](const std::string& text) {
    if (opts.observer)
      caf::anon_send(opts.observer, report_atom::value, UINT32_MAX, text);
    else
      std::fprintf(stderr, "%s\n", text.c_str());
  };
  return {
    // A failover bumped the epoch: later files say so in their header.
    [=](view_atom, const cluster_view& view) { self->state.epoch = std::max(self->state.epoch, view.epoch); },
    [=](checkpoint_atom, std::uint32_t shard, std::uint64_t clock, const encoded_block& data) {
      auto& st = self->state;
      try {
        auto snap = snapshot_of(data);
        if (snap.shard != shard) throw bad_request("holds the state of shard " + std::to_string(snap.shard));
        st.pending[clock][shard] = std::move(snap);
      } catch (const bad_request& e) {
        tell("checkpoint at clock " + std::to_string(clock) + ": part from shard " + std::to_string(shard) +
             " refused: " + e.what());
        return;
      }
      auto& parts = st.pending[clock];
      if (parts.size() < opts.header.shard_ids.size()) return;
      checkpoint c;
      c.header = opts.header;
      c.header.clock = clock;
      c.header.epoch = std::max(opts.header.epoch, st.epoch);
      for (auto id : opts.header.shard_ids) c.shards.push_back(std::move(parts[id]));
      // Older clocks still incomplete can never complete consistently now: drop them.
      st.pending.erase(st.pending.begin(), st.pending.upper_bound(clock));
      try {
        auto path = write_checkpoint(opts.dir, c);
        tell("checkpoint written: " + path + " (clock " + std::to_string(clock) + ")");
      } catch (const bad_request& e) {
        tell(std::string("checkpoint at clock ") + std::to_string(clock) + " not written: " + e.what());
      }
    },
  };
}

}  // namespace ps
