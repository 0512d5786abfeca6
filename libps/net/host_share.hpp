#pragma once
// What a process may take of its host when its peers there share it. A process knows the
// processes of its job on its host (its peers at a loopback or its own address); while they
// and it outnumber the host's CPUs the host is crowded: the CPUs rarely idle, so waiting
// is better spent sleeping (libps/net/busy_poll.hpp), and another request in flight over TCP
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

// Push chunks to shards reached over TCP while the host is not crowded, at most
// (--ps.tcp-push-chunk-bytes): a spare CPU then sums one chunk at the shard while the next
// travels. 1 server x 1 worker on 2 vCPUs, 1 MiB pushes at window 1: 2.6-3.0 GB/s in
// 512 KiB chunks against 1.8-2.1 in 1 MiB ones. On a crowded host smaller chunks only add
// messages (2x2: 2.7-4.4 GB/s against 4.1-6.9), and a ring sums in place as it fills.
inline constexpr std::uint64_t default_tcp_push_chunk_bytes = 512u << 10;

}  // namespace ps
