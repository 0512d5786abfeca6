#pragma once
// What one seed of the whole-cluster simulation (`sim`) does: the cluster's shape and
// consistency model, the workers' speeds, and its fault plan (a server or a worker killed
// at a step, a worker leaving early, requests dropped, sent twice or late, the coordinator
// restarted). A pure function of the
// seed, so `sim --seeds=1 --from=S` replays seed S exactly.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libps/sim/faults.hpp"

namespace ps {

struct sim_plan {
  std::uint64_t seed = 0;
  std::uint32_t servers = 2;
  std::uint32_t workers = 2;
  std::uint64_t staleness = 0;  // 0 BSP, k SSP, infinite_staleness ASP
  std::uint64_t clocks = 6;     // iterations each worker runs (a leaver fewer)
  std::uint32_t replication = 1;  // copies per shard, at most `servers`
  // The server killed after this many scheduler steps: the head of its shard and the
  // copies it keeps of the shards before it (copy j of shard i lives on server i + j).
  // Only with two copies or more, so nothing may be lost.
  std::optional<std::uint32_t> kill_server;
  std::uint64_t kill_step = 0;
  // A server cut off from every other member after this many scheduler steps, for this
  // many events (messages delivered elsewhere and timers fired): what is sent to it or
  // from it waits, as TCP holds it, and is delivered when the partition heals (shorter
  // than the failure timeout: nobody is declared dead).
  std::optional<std::uint32_t> partition_server;
  std::uint64_t partition_step = 0, partition_events = 0;
  // A worker killed after this many scheduler steps (its client and its registration end
  // abruptly): what it had acknowledged counts, what it had sent may or may not. Never
  // the leaver, and never the last worker that would remain.
  std::optional<std::uint32_t> kill_worker;
  std::uint64_t kill_worker_step = 0;
  // A worker that finishes early, at this clock (it leaves the vector clock).
  std::optional<std::uint32_t> leaver;
  std::uint64_t leave_at = 0;
  // How often each worker is picked to act, relative to the others (slow workers lag).
  std::vector<std::uint32_t> speed;
  // Elasticity (one copy per shard, no server killed): a server joins after this many
  // scheduler steps, and/or shard `remove_shard` leaves (psctl remove-shard) after this
  // many, or once the join is done when both are planned.
  std::optional<std::uint64_t> join_step;
  std::optional<std::uint32_t> remove_shard;
  std::uint64_t remove_step = 0;
  // The coordinator killed after this many scheduler steps and started again with its
  // saved state (--resume) after this many more events; its members rejoin it. Only with
  // one copy per shard and no map change planned (neither is resumed yet).
  std::optional<std::uint64_t> restart_step;
  std::uint64_t restart_events = 0;
  // Rows on a disk tier: each shard keeps a few rows in RAM and the rest in its store
  // (sim --tiered; not drawn from the seed, so a seed's other choices stay the same).
  bool tiered = false;
  // Blocks travel as production's do by default: named in the messages, their values over
  // the data plane (the in-memory transport, actors/transport/memory.hpp), claimed at the
  // receiver. false (sim --no-data-plane): every value inside the messages.
  bool data_plane = true;
  fault_plan messages;       // drop, duplicate, delay of the clients' requests
  std::uint64_t retry_ms = 0;  // a request unanswered this long goes out again
};

// elastic: with one copy per shard, a join and a removal may be drawn too (last, so the
// other choices of a seed are the same either way).
sim_plan plan_for_seed(std::uint64_t seed, bool elastic = false);
// One JSON object naming every choice, for a failing seed's report.
std::string to_json(const sim_plan& p);

}  // namespace ps
