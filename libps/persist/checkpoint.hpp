#pragma once
// The checkpoint file format: a consistent snapshot of every shard at one clock boundary.
//
//   "APSCKPT\0" | u32 format version
//   u64 n | n bytes: the header (cereal binary)          | u32 CRC-32 of those n bytes
//   per shard: u64 n | n bytes: the shard (cereal binary) | u32 CRC-32
//   "END\0"
// Written to DIR/checkpoint-<clock>.apsckpt.tmp, fsynced, renamed, and the directory fsynced,
// so a crash leaves either the previous file set or the new one, never half a file under the
// final name. Reading checks everything and names the file and what is wrong.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libps/keys/partitioner.hpp"
#include "libps/persist/snapshot_types.hpp"

namespace ps {

// Where a shard's disk-tier rows go for the checkpoint at `clock`, relative to its
// directory: "checkpoint-<clock>.rows/shard-<id>".
std::string disk_rows_name(std::uint64_t clock, std::uint32_t shard);
// The directory of that checkpoint's rows on disk: "checkpoint-<clock>.rows" (rows laid
// out for another map go beside the shards' own, in a directory of their own in it).
std::string disk_rows_dir_name(std::uint64_t clock);
// Another shard's rows directory in the same checkpoint as `disk_rows` (a shard's).
std::string sibling_disk_rows(const std::string& disk_rows, std::uint32_t shard);
// Where a recovery of shard `dead` under the map of `epoch` lays the checkpoint's rows
// out (in its rows directory `rows_dir`): "for-epoch-<epoch>-shard-<dead>". Scratch: the
// replacement's disk tier takes the rows in (hard links) and removes it.
std::string recovery_layout_dir(const std::string& rows_dir, std::uint64_t epoch, std::uint32_t dead);
// Whether `disk_rows` (a shard's rows directory) lies in such a layout.
bool in_recovery_layout(const std::string& disk_rows);

struct checkpoint {
  checkpoint_header header;
  std::vector<shard_snapshot> shards;  // one per header.shard_ids entry, same order
};

// One shard's section, as bytes (shards send it to the checkpoint writer) and back;
// decoding throws bad_request.
std::string encode_shard(const shard_snapshot& s);
shard_snapshot decode_shard(const std::string& bytes);

// The checkpoint's state laid out for `map`'s shards (another count, another ring): each
// dense segment cut where ownership changes and handed to its owner with its optimizer
// state, each row moved to its row_owner. The header's shard_ids become map's. Rows on a
// disk tier are streamed from the old shards' stores into a new store per shard under
// rows_into (lay_out_saved_rows; blocking I/O, the whole table read once), which the new
// sections name; without rows_into such a checkpoint throws bad_request, as does one
// saved before format 4 (no rows per table).
// only: the one shard whose section is wanted (a recovery's): the result holds that
// section alone, and only its rows are laid out.
checkpoint reshard(const checkpoint& c, const partitioner& map, const std::string& rows_into = {},
                   std::optional<std::uint32_t> only = std::nullopt);

// Whether the checkpoint's shards own what `map`'s do: the same shards, ring and buckets,
// and the same owner for every balanced bucket (the header's placement, or the ring's own
// when it has none). When not, its state must be resharded before a shard takes its section.
bool same_map(const checkpoint_header& h, const partitioner& map);

// The checkpoint laid out for `map`: c itself when the maps agree, else
// reshard(c, map, rows_into).
checkpoint laid_out_for(checkpoint c, const partitioner& map, const std::string& rows_into = {},
                        std::optional<std::uint32_t> only = std::nullopt);

// Writes atomically (see above); returns the final path. Throws bad_request naming the
// directory or file on an I/O error, or when shards do not match header.shard_ids.
std::string write_checkpoint(const std::string& dir, const checkpoint& c);
// Throws bad_request "<path>: <what is wrong>" for a missing, truncated or corrupt file,
// or one whose shards' disk-tier rows are missing.
checkpoint read_checkpoint(const std::string& path);

struct latest_checkpoint {
  std::optional<checkpoint> found;
  std::string path;                  // of found
  std::vector<std::string> refused;  // newer files that were refused, each with the reason
};
// The newest checkpoint in dir that reads back intact; corrupt newer ones are skipped and
// reported. Throws bad_request when dir cannot be read.
latest_checkpoint load_latest(const std::string& dir);

}  // namespace ps

namespace ps {

// The checkpoint's values that are not finite (NaN or +-Inf), parameters and optimizer
// state alike: "" when there are none, else how many and where the first is.
std::string non_finite_values(const checkpoint& c);

// Why checkpoints cannot be written to dir ("" when they can): it is made if missing,
// and a file is created and removed in it. The text names the directory.
std::string unwritable_directory(const std::string& dir);

}  // namespace ps
