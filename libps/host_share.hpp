#pragma once
// What a process may take of its host when its peers there share it. A process knows the
// processes of its job on its host (its peers at a loopback or its own address); while they
// and it outnumber the host's CPUs the host is crowded: the CPUs rarely idle, so waiting
// is better spent sleeping (libps/busy_poll.hpp), and another request in flight over TCP
// adds no overlap, only bytes for the caches (BENCHMARKS.md, "Bytes in flight on a crowded
// host"). Shared-memory rings keep their own room and are not held to it.
#include <cstddef>
#include <cstdint>

namespace ps {

inline bool host_crowded(std::size_t peers_here, unsigned cpus) { return peers_here + 1 > cpus; }

// Bytes a client keeps in flight over TCP to one shard on a crowded host, at most
// (--ps.crowded-inflight-bytes): one default push chunk. With 2 servers x 2 workers on 2
// vCPUs, 8 MiB per shard (32 MiB in flight, the size of the L3 cache) moved 1 MiB pushes
// at window 8 at 0.5-0.6 of window 1; 1 MiB per shard kept them level.
inline constexpr std::uint64_t default_crowded_inflight_bytes = 1u << 20;

}  // namespace ps
