// A checkpoint's parameters as NumPy files (psnode --role=export).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "libps/persist/checkpoint.hpp"
#include "libps/core/job_spec.hpp"
#include "libps/rows/sparse_table.hpp"

namespace ps {

struct exported_file {
  std::string name;  // in the output directory
  std::vector<std::uint64_t> shape;
  std::string holds;  // what it is, for the manifest
};

// Writes into out_dir (made if missing): per dense tensor of `tensors` "<name>.npy" in
// its shape, or without tensors one file per contiguous run of keys
// ("keys_<begin>_<end>.npy"); per sparse table "<name>.ids.npy" (uint64, rows by id) and
// "<name>.npy" (float32, [rows, dim]: the values; without the table's spec each row's
// whole stride, optimizer state included); and "manifest.json" listing them with the
// checkpoint's clock and model. Throws bad_request naming what is wrong: a tensor whose
// keys the checkpoint lacks, rows kept in a disk tier, a directory that cannot be written.
std::vector<exported_file> export_checkpoint(const checkpoint& c, const std::vector<tensor_spec>& tensors,
                                             const std::vector<sparse_table_spec>& tables,
                                             const std::string& out_dir);

}  // namespace ps
