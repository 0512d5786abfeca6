#pragma once
// The operator's view of a running job (psctl status): what the coordinator knows of its
// members and what each shard says of itself (its stats JSON), put together as one JSON
// object, and that object as a table for a terminal. Plain data in, text out: the
// coordinator gathers, psctl prints.
#include <cstdint>
#include <string>
#include <vector>

namespace ps {

struct status_shard {
  std::uint32_t id = 0;
  std::string address;  // host:port, or "in the coordinator's process" (embedded)
  std::uint32_t pid = 0;
  std::string stats;  // the shard's stats JSON; empty when it did not answer
  std::string error;  // why it did not
  std::uint32_t copies = 1;  // in its chain (--replication): fewer than configured once a copy died
};

struct status_worker {
  std::uint32_t id = 0;
  std::string member;  // as the coordinator describes it ("worker 2 (joined, pid 812)")
  bool finished = false;
};

// {"epoch","job","shards":[{"id","address","pid","copies","state","keys","rows","bytes","ram_bytes",
// "disk_bytes_read","peak_rss","pushes","pulls","push_rate","pull_rate","min_clock"}],
// "workers":[{"id","member","state","clock"}],"slowest_worker"}. A worker's clock is the
// lowest any shard has seen from it (null once it left or finished); the slowest is the
// running worker with the lowest clock (null when none runs). Throws bad_request when a
// shard's stats are not the JSON a shard sends.
std::string status_json(std::uint64_t epoch, const std::string& job, const std::vector<status_shard>& shards,
                        const std::vector<status_worker>& workers);

// status_json's object as aligned text: a line for the job, a table of shards, one of workers.
std::string status_table(const std::string& status);

}  // namespace ps
