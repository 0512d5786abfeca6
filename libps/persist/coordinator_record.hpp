#pragma once
// What a coordinator must know to resume its job after its process died (--state-dir,
// --resume; docs/checkpoints-and-faults.md): the job it runs (the spec's fingerprint),
// the shard map (epoch, placement after joins, shards that left, each shard's address),
// which workers finished and their results, and how many barriers have been released.
// The parameters and the clock vectors are not here: they live with the shards, which
// outlive the coordinator.
//
// Kept as one JSON file, DIR/coordinator.json, so an operator can read it. Each save
// writes DIR/coordinator.json.tmp and renames it over the old one: a reader sees the old
// file or the new, never half of one. No fsync: the file survives the death of the
// coordinator's process (SIGKILL), which is what --resume is for, not a crash of the machine.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ps {

struct coordinator_record {
  struct shard {
    std::uint32_t id = 0;
    std::string host;  // empty: embedded in the coordinator's process (cannot be resumed)
    std::uint16_t port = 0;
    std::uint32_t pid = 0;
    // With --replication >= 2: the chain in order, each copy by the place it was started
    // at (0: the shard's own server, or its replacement; j: the copy kept by the server
    // j places on). A closed gap leaves it shorter; a resume rebuilds it from the copies
    // that come back.
    std::vector<std::uint32_t> chain;
  };
  struct result {
    bool ok = false;
    std::string json;
  };
  std::string job_fingerprint;
  std::uint32_t servers = 0, workers = 0;  // what the job was started with
  std::uint64_t epoch = 1;
  std::vector<std::pair<std::uint64_t, std::uint32_t>> placement;  // after joins: bucket -> owner
  std::vector<std::uint32_t> retired;                              // shards that left the map
  std::vector<shard> shards;                                       // by id, retired ones included
  std::vector<bool> worker_done;                                   // by id, joiners included
  std::map<std::uint32_t, result> results;                         // the workers that reported
  std::uint64_t barrier_generation = 0;                            // barriers released so far
  // A map change under way when saved ("join" or "leave", and the shard; empty: none):
  // the map above is already the new one, and a resumed coordinator finishes the
  // handoffs before the job goes on (a shard that has handed over answers again at once).
  std::string change;
  std::uint32_t change_shard = 0;
  // The epoch of that change's map: its handoffs are asked for under it (a chain that
  // closed during the change raised the epoch above; records without it: the epoch).
  std::uint64_t change_epoch = 0;
  std::uint64_t saves = 0;                                         // this record's number of saves
};

// DIR/coordinator.json.
std::string record_path(const std::string& dir);

// Writes the record (tmp file, then rename); throws bad_request naming the path and the
// system's reason when it cannot.
void save_record(const std::string& dir, const coordinator_record& record);

// Reads DIR/coordinator.json; throws bad_request naming the file and what is wrong with
// it (missing, not JSON, a field missing or of the wrong type, ids out of order).
coordinator_record load_record(const std::string& dir);

}  // namespace ps
