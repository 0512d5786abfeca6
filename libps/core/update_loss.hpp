#pragma once
// What a recovered shard reports of the updates lost with the shard it replaces: the
// shard core makes it, the coordinator's observer hears it (a wire message).
#include <cstdint>
#include <string>

namespace ps {

// A replacement shard's account, per worker, of the updates that died with the shard it
// replaces: clocks from_clock .. from_clock+lost_clocks-1 (at most that many under SSP/ASP,
// where the checkpoint may hold some of them).
struct update_loss {
  std::uint32_t shard = 0;
  std::uint32_t worker = 0;
  std::uint64_t from_clock = 0;
  std::uint64_t lost_clocks = 0;
  bool at_most = false;
};
// "shard 1: worker 0: updates of clocks 16..19 were lost with the dead shard (lost_clocks=4)".
std::string describe(const update_loss& loss, const std::string& shard_name);

}  // namespace ps
