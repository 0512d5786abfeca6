#pragma once
// sparse_bench: the worker side of bench_sparse (apps/bench_sparse.cpp), a built-in app:
// fills a table of --table-rows rows, then pulls and pushes batches of distinct rows
// drawn from a Zipf law, per exponent in --zipfs, reporting one cell per (zipf, op).
#include <random>
#include <string>
#include <vector>

#include "apps/ctr/ctr_data.hpp"

#include "runtime/app_registry.hpp"

namespace ps {

app_definition sparse_bench_definition();

// One measured cell as the worker reports it.
struct sparse_cell {
  std::string op;  // pull | push
  double zipf = 0;
  std::uint64_t rows = 0;  // rows moved in the measured time
  double seconds = 0;
  std::uint64_t ram_hits = 0, ram_misses = 0;  // the shards' RAM tier during the cell
  std::uint64_t disk_bytes_read = 0;           // what the shards read from the device during it
  // The disk probe's reads per second right before and right after it (0: not probed).
  double disk_reads_before = 0, disk_reads_after = 0;
  std::vector<double> latencies_us;            // per request
  std::string encode() const;
  static sparse_cell decode(const std::string& text);  // throws bad_request
};

// The bytes a row of that dimension takes in a shard's RAM tier (Adagrad state beside
// it, plus the index): the unit of --shard-memory.
std::uint64_t sparse_bench_row_bytes(std::uint32_t dim);
// --disk-probe-bytes: the size of the disk probe's file.
std::uint64_t sparse_bench_probe_bytes(const node_config& cfg);
// The benchmark's table (Adagrad rows of --bench-dim floats).
sparse_table_spec sparse_bench_table(const node_config& cfg);
std::vector<double> sparse_bench_zipfs(const node_config& cfg);  // throws bad_request

// Batches of distinct rows of a table of `rows`, drawn from a Zipf law. Rank k is row
// (k * step) mod rows: the hot rows are spread over the table (and its disk blocks) as
// feature hashes are, each row once. Throws bad_request for 0 rows or exponent <= 0.
struct row_picker {
  zipf_sampler zipf;
  std::uint64_t n, step;
  row_picker(std::uint64_t rows, double exponent);
  std::vector<std::uint64_t> batch(std::mt19937_64& rng, std::size_t size) const;  // at most `rows`
};

}  // namespace ps
