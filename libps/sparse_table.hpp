#pragma once
// A sparse table: embedding rows of `dim` floats by 64-bit id (feature hashes, unbounded
// in number), created on first touch, each with its update rule's optimizer state beside
// it. The first-touch value depends only on (seed, table name, id), so every copy of a
// shard, a restart and a migration create the same row. Plain class: a shard holds one
// per table and decides nothing else here (issue 14's RAM tier starts from it).
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "libps/update_rule.hpp"

namespace ps {

struct sparse_table_spec {
  std::string name;
  std::uint32_t dim = 16;
  float init_scale = 0.01f;  // first-touch values are uniform in [-init_scale, init_scale)
  update_rule rule;          // Adagrad is the usual choice for embeddings
  std::uint64_t seed = 1;
  // Throws bad_request naming what is wrong (no name, dim 0 or above 4096, bad scale or rule).
  void validate() const;
};

// Row `id`'s first-touch value: dim floats, uniform in [-scale, scale), a function of
// (seed, table, id) and nothing else (the same on every platform).
void initial_row(std::uint64_t seed, const std::string& table, std::uint64_t id, float scale, float* out,
                 std::uint32_t dim);

class sparse_table {
 public:
  explicit sparse_table(sparse_table_spec spec);  // throws bad_request for a bad spec

  const sparse_table_spec& spec() const { return spec_; }
  // Rows `ids` into out (ids.size() * dim floats, in order; an id may repeat). Rows never
  // touched are created.
  void pull(std::span<const std::uint64_t> ids, float* out);
  // Folds grads (ids.size() * dim floats) into the rows with the table's rule, creating
  // rows never touched first. A repeated id is updated once per occurrence; clients merge
  // duplicates first (merge_rows) so a request carries each id once.
  void push(std::span<const std::uint64_t> ids, const float* grads);

  std::size_t rows() const { return index_.size(); }
  // Bytes the rows and their state take (values and optimizer state; the index's own
  // memory is counted at 32 bytes per row).
  std::uint64_t bytes() const;

 private:
  float* row(std::uint64_t id);  // creates it on first touch
  sparse_table_spec spec_;
  std::size_t stride_;  // floats per row: the value and each state slot
  std::unordered_map<std::uint64_t, std::size_t> index_;  // id -> offset in arena_
  std::vector<float> arena_;
};

// One request's rows with duplicates merged: the distinct ids in first-seen order, the
// sum of each one's gradients (for a push), and for each input position the slot of its
// id among the distinct ones (to spread a pull's answer back).
struct merged_rows {
  std::vector<std::uint64_t> ids;
  std::vector<float> grads;          // ids.size() * dim; empty when no gradients were given
  std::vector<std::uint32_t> slot;   // per input id
};
merged_rows merge_rows(std::span<const std::uint64_t> ids, const float* grads, std::uint32_t dim);

}  // namespace ps
