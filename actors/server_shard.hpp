#pragma once
// A server shard: owns the key buckets the partitioner gives it, folds pushes into its
// parameters with the job's update rule and answers pulls. It learns its id and the
// shard map by registering with the coordinator when told its published port (start).
#include <chrono>
#include <optional>
#include <string>

#include "actors/messages.hpp"
#include "libps/partitioner.hpp"
#include "libps/shard_store.hpp"

namespace ps {

struct shard_options {
  std::string host;  // where the shard is reachable (empty: embedded)
  std::chrono::milliseconds register_timeout{60000};
  std::chrono::milliseconds reply_delay{0};  // fault hook for tests: answer late
};

struct shard_state {
  std::uint32_t id = 0;
  std::optional<partitioner> map;
  std::optional<shard_store> store;
  std::string name = "shard ?";  // for error messages
};

shard_actor::behavior_type server_shard(shard_actor::stateful_pointer<shard_state> self,
                                        coordinator_actor coordinator, shard_options opts);

// Checks that every key of the ranges belongs to shard `id` under `map`; throws bad_request.
void check_ownership(const partitioner& map, std::uint32_t id, const std::vector<key_range>& ranges);

}  // namespace ps
