// NumPy files (libps/persist/npy) and a checkpoint's export (libps/persist/checkpoint_export).
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "libps/persist/checkpoint_export.hpp"
#include "libps/persist/npy.hpp"

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

ps::checkpoint two_shards() {
  ps::checkpoint c;
  c.header.clock = 7;
  c.header.model = "test/model";
  c.header.shard_ids = {0, 1};
  ps::shard_snapshot a, b;
  a.shard = 0;
  a.segments.push_back({0, 3, {1, 2, 3}, {}});
  b.shard = 1;
  b.segments.push_back({3, 5, {4, 5}, {}});
  b.segments.push_back({10, 12, {10, 11}, {}});
  b.tables.push_back({0, 3, {42, 7}, {4.2f, 4.3f, 0.5f, 0.7f, 0.8f, 0.9f}});  // dim 2 + 1 state float per row
  c.shards = {a, b};
  return c;
}

}  // namespace

TEST_CASE("npy: the header is what numpy.load expects, and the data starts on a 64-byte boundary") {
  auto h = ps::npy_header("<f4", {3, 2});
  CHECK(h.size() % 64 == 0);
  CHECK(h.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
  CHECK(static_cast<std::size_t>(static_cast<unsigned char>(h[8]) | static_cast<unsigned char>(h[9]) << 8) == h.size() - 10);
  CHECK(h.find("{'descr': '<f4', 'fortran_order': False, 'shape': (3,2), }") == 10);
  CHECK(h.back() == '\n');
  CHECK(ps::npy_header("<u8", {5}).find("'shape': (5,)") != std::string::npos);
  CHECK_THROWS_WITH_AS(ps::write_npy("x.npy", {2, 2}, std::vector<float>{1, 2, 3}), doctest::Contains("3 values for a shape of 4"),
                       ps::bad_request);
}

TEST_CASE("export: tensors by the job's names and shapes, tables by id without their optimizer state") {
  std::filesystem::remove_all("export-test");
  std::vector<ps::tensor_spec> tensors{{"w", {0, 4}, {2, 2}}, {"b", {10, 12}, {}}};
  ps::sparse_table_spec emb;
  emb.name = "emb";
  emb.dim = 2;
  auto files = ps::export_checkpoint(two_shards(), tensors, {emb}, "export-test");
  REQUIRE(files.size() == 4);
  CHECK(files[0].name == "w.npy");
  CHECK(files[0].shape == std::vector<std::uint64_t>{2, 2});
  auto w = read_file("export-test/w.npy");
  auto header = ps::npy_header("<f4", {2, 2});
  REQUIRE(w.size() == header.size() + 16);
  std::vector<float> values(4);
  std::memcpy(values.data(), w.data() + header.size(), 16);
  CHECK(values == std::vector<float>{1, 2, 3, 4});  // keys 0..3 from two shards, in order
  auto rows = read_file("export-test/emb.npy");
  std::vector<float> row_values(4);
  std::memcpy(row_values.data(), rows.data() + ps::npy_header("<f4", {2, 2}).size(), 16);
  CHECK(row_values == std::vector<float>{0.7f, 0.8f, 4.2f, 4.3f});  // id 7 first; the state float dropped
  CHECK(read_file("export-test/manifest.json").find("\"clock\": 7") != std::string::npos);
  std::filesystem::remove_all("export-test");
}

TEST_CASE("export: without the job's tensors, one file per run of keys; a tensor the checkpoint lacks is named") {
  std::filesystem::remove_all("export-test");
  auto files = ps::export_checkpoint(two_shards(), {}, {}, "export-test");
  CHECK(files[0].name == "keys_0_5.npy");
  CHECK(files[1].name == "keys_10_12.npy");
  CHECK(files[2].name == "table_0.ids.npy");
  CHECK(files[3].shape == std::vector<std::uint64_t>{2, 3});  // whole rows: value and state
  std::vector<ps::tensor_spec> missing{{"gap", {4, 8}, {}}};
  CHECK_THROWS_WITH_AS(ps::export_checkpoint(two_shards(), missing, {}, "export-test"),
                       doctest::Contains("no value for key 5 of tensor gap"), ps::bad_request);
  std::filesystem::remove_all("export-test");
}
