#pragma once
// What a snapshot of shards holds: the checkpoint's header and each shard's section (dense
// segments, sparse rows, a disk tier's rows). Types only, so that the row tier, cereal's
// encoding and the checkpoint file format share them without depending on each other.
#include <cstdint>
#include <string>
#include <vector>

#include "libps/keys/partitioner.hpp"
#include "libps/core/shard_store.hpp"

namespace ps {

// 2: a shard's section also holds its sparse tables' rows. 3: the header holds the map's
// placement after shards joined or left. 4: a shard's section holds its disk tier's rows
// per table and row admission's counts. 5: the header names the update rule (before, a number:
// rule_name_of_code). Files of versions 1 to 4 still read.
inline constexpr std::uint32_t checkpoint_format_version = 5;

struct checkpoint_header {
  std::uint32_t version = checkpoint_format_version;
  std::string model;            // what was trained, e.g. "fmnist/mlp"
  std::uint64_t epoch = 0;      // shard map epoch
  std::uint64_t clock = 0;      // every update with clock < this is in, none later
  std::vector<std::uint32_t> shard_ids;
  std::uint32_t vnodes = 0, bucket_bits = 0;
  std::string rule = "sum";     // the update rule's name (before version 5, a number)
  std::uint32_t state_slots = 0;
  // After joins or removals: the dense buckets' owners (partitioner::placement); empty:
  // the ring's own placement for shard_ids.
  partitioner::placement_list placement = {};
};

// A sparse table's rows in a shard's snapshot: ids and each row's `stride` floats (its
// value, then its optimizer state), back to back.
struct table_rows {
  std::uint32_t table = 0;  // index among the job's tables
  std::uint32_t stride = 0;
  std::vector<std::uint64_t> ids;
  std::vector<float> rows;
};

struct shard_snapshot {
  std::uint32_t shard = 0;
  std::vector<stored_segment> segments;
  std::vector<table_rows> tables;  // none: the job has no tables (or the file is of version 1)
  // A shard with a disk tier: its rows are a RocksDB checkpoint in this directory (in the
  // file, relative to the checkpoint's directory; read_checkpoint makes it absolute), with
  // this many rows; `tables` is then empty.
  std::string disk_rows;
  std::uint64_t disk_row_count = 0;
  std::vector<std::uint64_t> disk_table_rows = {};  // of disk_row_count, per table (version 4 on)
  // Row admission's counts (row_tier::sightings; empty: no table admits after more than
  // one push, or a file before version 4, whose ids not yet admitted count from zero).
  std::vector<std::uint16_t> sightings = {};
};

}  // namespace ps
