// The checkpoint format: round trip, atomic writes, and refusal of damaged files.
#include <cstring>
#include <doctest/doctest.h>

#include <limits>

#include <unistd.h>

#include <zlib.h>

#include <cereal/archives/binary.hpp>
#include <cereal/types/string.hpp>
#include <cereal/types/vector.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "libps/persist/cereal_types.hpp"
#include "libps/persist/checkpoint.hpp"
#include <cereal/types/utility.hpp>

using namespace ps;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path = fs::temp_directory_path() / ("actorps-ckpt-" + std::to_string(getpid()));
  temp_dir() { fs::remove_all(path); }
  ~temp_dir() { fs::remove_all(path); }
  std::string str() const { return path.string(); }
};

checkpoint sample(std::uint64_t clock) {
  update_rule adam;
  adam.kind = "adam";
  shard_store a(adam), b(adam);
  a.push({{0, 5}, {100, 103}}, std::vector<float>{1, 2, 3, 4, 5, 6, 7, 8}.data(), 8);
  b.push({{4096, 4100}}, std::vector<float>{-1, 0.5f, 1e-30f, 7}.data(), 4);
  checkpoint c;
  c.header.model = "fmnist/mlp";
  c.header.epoch = 3;
  c.header.clock = clock;
  c.header.shard_ids = {0, 1};
  c.header.vnodes = 128;
  c.header.bucket_bits = 12;
  c.header.rule = "adam";
  c.header.state_slots = static_cast<std::uint32_t>(adam.state_slots());
  c.shards = {{0, a.snapshot(), {}, {}, 0}, {1, b.snapshot(), {}, {}, 0}};
  return c;
}

void flip_byte(const std::string& path, std::size_t from_end) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  auto size = static_cast<std::size_t>(f.tellg());
  f.seekg(static_cast<std::streamoff>(size - from_end));
  char ch;
  f.read(&ch, 1);
  ch ^= 0x5a;
  f.seekp(static_cast<std::streamoff>(size - from_end));
  f.write(&ch, 1);
}

}  // namespace

TEST_CASE("a checkpoint reads back exactly what was written, optimizer state included") {
  temp_dir dir;
  auto c = sample(20);
  auto path = write_checkpoint(dir.str(), c);
  CHECK(fs::path(path).filename() == "checkpoint-20.apsckpt");
  CHECK_FALSE(fs::exists(path + ".tmp"));  // renamed, not left behind
  auto back = read_checkpoint(path);
  CHECK(back.header.model == "fmnist/mlp");
  CHECK(back.header.epoch == 3);
  CHECK(back.header.clock == 20);
  CHECK(back.header.shard_ids == std::vector<std::uint32_t>{0, 1});
  REQUIRE(back.shards.size() == 2);
  for (std::size_t s = 0; s < 2; ++s) {
    REQUIRE(back.shards[s].segments.size() == c.shards[s].segments.size());
    for (std::size_t i = 0; i < c.shards[s].segments.size(); ++i) {
      CHECK(back.shards[s].segments[i].begin == c.shards[s].segments[i].begin);
      CHECK(back.shards[s].segments[i].values == c.shards[s].segments[i].values);
      CHECK(back.shards[s].segments[i].state == c.shards[s].segments[i].state);
    }
  }
  // Restoring into a fresh store gives the same pulls.
  update_rule adam;
  adam.kind = "adam";
  shard_store restored(adam);
  restored.restore(back.shards[0].segments);
  std::vector<float> got(8), want(8);
  restored.pull({{0, 5}, {100, 103}}, got.data(), 8);
  shard_store original(adam);
  original.restore(c.shards[0].segments);
  original.pull({{0, 5}, {100, 103}}, want.data(), 8);
  CHECK(got == want);
}

TEST_CASE("damaged checkpoints are refused with the file and the problem, and the previous good one is used") {
  temp_dir dir;
  auto good = write_checkpoint(dir.str(), sample(10));
  auto bad = write_checkpoint(dir.str(), sample(20));
  flip_byte(bad, 20);  // inside the last shard's data
  CHECK_THROWS_WITH_AS(read_checkpoint(bad), doctest::Contains((bad + ": checksum of shard 1 does not match").c_str()), bad_request);
  auto latest = load_latest(dir.str());
  REQUIRE(latest.found.has_value());
  CHECK(latest.path == good);
  CHECK(latest.found->header.clock == 10);
  REQUIRE(latest.refused.size() == 1);
  CHECK(latest.refused[0].find("checksum of shard 1") != std::string::npos);
  // Truncated.
  auto cut = write_checkpoint(dir.str(), sample(30));
  fs::resize_file(cut, fs::file_size(cut) - 7);
  CHECK_THROWS_WITH_AS(read_checkpoint(cut), doctest::Contains((cut + ": truncated in").c_str()), bad_request);
  // Not a checkpoint at all, and a half-written temporary file: neither is taken.
  std::ofstream(dir.path / "checkpoint-40.apsckpt") << "this is not a checkpoint file";
  std::ofstream(dir.path / "checkpoint-50.apsckpt.tmp") << "partial";
  CHECK_THROWS_WITH_AS(read_checkpoint((dir.path / "checkpoint-40.apsckpt").string()), doctest::Contains("bad magic"), bad_request);
  latest = load_latest(dir.str());
  CHECK(latest.path == good);
  CHECK(latest.refused.size() == 3);
  // A clock in the name beyond 2^64: refused naming the file (it was an uncaught stoull).
  const auto huge = (dir.path / "checkpoint-99999999999999999999999.apsckpt").string();
  std::ofstream(huge) << "x";
  latest = load_latest(dir.str());
  CHECK(latest.path == good);
  REQUIRE(latest.refused.size() == 4);
  CHECK(latest.refused[0] == huge + ": the clock in its name, 99999999999999999999999, is beyond 2^64");
  CHECK_THROWS_WITH_AS(read_checkpoint((dir.path / "missing").string()), doctest::Contains("cannot open"), bad_request);
}

TEST_CASE("non-finite values in a checkpoint are counted and the first is named") {
  auto c = sample(10);
  CHECK(non_finite_values(c) == "");
  c.shards[0].segments[0].values[1] = std::numeric_limits<float>::quiet_NaN();
  c.shards[0].segments[0].values[2] = std::numeric_limits<float>::infinity();
  auto says = non_finite_values(c);
  CHECK(says.find("2 values are not finite") == 0);
  CHECK(says.find("shard " + std::to_string(c.shards[0].shard) + ": key " +
                  std::to_string(c.shards[0].segments[0].begin + 1) + " is nan") != std::string::npos);
}

TEST_CASE("restore refuses segments that do not fit the rule or overlap") {
  update_rule sgd;
  sgd.kind = "sgd";
  sgd.momentum = 0.9f;
  shard_store s(sgd);
  CHECK_THROWS_WITH_AS(s.restore({{0, 2, {1, 2}, {}}}), doctest::Contains("has 0 optimizer state values, the rule needs 2"), bad_request);
  CHECK_THROWS_WITH_AS(s.restore({{0, 2, {1, 2}, {0, 0}}, {1, 3, {1, 2}, {0, 0}}}), doctest::Contains("overlaps"), bad_request);
  CHECK_THROWS_WITH_AS(s.restore({{0, 2, {1}, {0, 0}}}), doctest::Contains("has 1 values"), bad_request);
}

namespace {

// An old file's pieces: a section (its length, the bytes, their CRC-32), fields as cereal
// binary, and the file around the sections.
void append_section(std::string& out, const std::string& bytes) {
  std::uint64_t n = bytes.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof(n));
  out += bytes;
  auto crc = static_cast<std::uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
  out.append(reinterpret_cast<const char*>(&crc), sizeof(crc));
}

template <class... Fields>
std::string bytes_of(const Fields&... fields) {
  std::ostringstream s;
  {
    cereal::BinaryOutputArchive ar(s);
    ar(fields...);
  }
  return s.str();
}

// Files before format version 5 named the rule by its number among the built-in rules.
std::uint8_t rule_code(const std::string& name) {
  for (std::uint8_t code = 0; code < 4; ++code)
    if (rule_name_of_code(code) == name) return code;
  FAIL("no code for rule " << name);
  return 0;
}

std::string file_start(std::uint32_t version) {
  std::string data("APSCKPT\0", 8);
  data.append(reinterpret_cast<const char*>(&version), sizeof(version));
  return data;
}

void file_end(const std::string& path, std::string& data) {
  data.append("END\0", 4);
  std::ofstream(path, std::ios::binary) << data;
}

// A file as a build of format version 1 wrote it (dense tensors only): the header and
// each shard's section (shard, segments) as cereal binary, each with its CRC-32.
void write_v1_file(const std::string& path, const checkpoint& c) {
  std::uint32_t version = 1;
  auto data = file_start(version);
  const auto& h = c.header;
  append_section(data, bytes_of(version, h.model, h.epoch, h.clock, h.shard_ids, h.vnodes, h.bucket_bits, rule_code(h.rule), h.state_slots));
  for (const auto& s : c.shards) {
    std::ostringstream seg;
    {
      cereal::BinaryOutputArchive ar(seg);
      ar(s.shard, cereal::make_size_tag(static_cast<cereal::size_type>(s.segments.size())));
      for (const auto& g : s.segments) ar(g.begin, g.end, g.values, g.state);
    }
    append_section(data, seg.str());
  }
  file_end(path, data);
}

// A file as format version 3 wrote it: shard sections without counts per table or of admission.
void write_v3_file(const std::string& path, const checkpoint& c) {
  std::uint32_t version = 3;
  auto data = file_start(version);
  const auto& h = c.header;
  append_section(data, bytes_of(version, h.model, h.epoch, h.clock, h.shard_ids, h.vnodes, h.bucket_bits,
                                rule_code(h.rule), h.state_slots, h.placement));
  for (const auto& s : c.shards)
    append_section(data, bytes_of(s.shard, s.segments, s.tables, s.disk_rows, s.disk_row_count));
  file_end(path, data);
}

}  // namespace

TEST_CASE("a checkpoint holds each shard's sparse table rows; files of format version 1 still read") {
  temp_dir dir;
  auto c = sample(40);
  c.shards[1].tables = {{0, 3, {7, 1ull << 40}, {1, 2, 3, 4, 5, 6}}, {2, 2, {}, {}}};
  auto back = read_checkpoint(write_checkpoint(dir.str(), c));
  REQUIRE(back.shards[1].tables.size() == 2);
  CHECK(back.shards[1].tables[0].ids == c.shards[1].tables[0].ids);
  CHECK(back.shards[1].tables[0].rows == c.shards[1].tables[0].rows);
  CHECK(back.shards[1].tables[1].table == 2);
  CHECK(back.shards[0].tables.empty());

  auto old = (dir.path / "checkpoint-5.apsckpt").string();
  auto dense = sample(5);
  write_v1_file(old, dense);
  auto v1 = read_checkpoint(old);
  CHECK(v1.header.clock == 5);
  CHECK(v1.header.rule == "adam");  // a number in the file
  REQUIRE(v1.shards.size() == 2);
  CHECK(v1.shards[0].segments.size() == dense.shards[0].segments.size());
  CHECK(v1.shards[0].segments[0].values == dense.shards[0].segments[0].values);
  CHECK(v1.shards[1].tables.empty());

  c.shards[1].tables[0].rows.pop_back();  // 5 values for 2 rows of 3
  auto wrong = write_checkpoint(dir.str(), c);
  CHECK_THROWS_WITH_AS(read_checkpoint(wrong), doctest::Contains("shard 1: table 0 holds 5 values for 2 rows of 3"), bad_request);
}

TEST_CASE("a shard's rows on a disk tier are named relative to the checkpoint; a file whose rows directory is missing is refused") {
  temp_dir dir;
  auto c = sample(50);
  c.shards[0].disk_rows = disk_rows_name(50, 0);
  c.shards[0].disk_row_count = 12;
  auto path = write_checkpoint(dir.str(), c);
  const auto missing = "shard 0: its rows on disk, " + (dir.path / "checkpoint-50.rows/shard-0").string() + ", are missing";
  CHECK_THROWS_WITH_AS(read_checkpoint(path), doctest::Contains(missing.c_str()), bad_request);
  fs::create_directories(dir.path / "checkpoint-50.rows/shard-0");
  auto back = read_checkpoint(path);
  CHECK(back.shards[0].disk_rows == (dir.path / "checkpoint-50.rows/shard-0").string());
  CHECK(back.shards[0].disk_row_count == 12);
  CHECK(back.shards[1].disk_rows.empty());
  // A chain's copy of shard 1 finds its rows beside shard 0's.
  CHECK(sibling_disk_rows(back.shards[0].disk_rows, 1) == (dir.path / "checkpoint-50.rows/shard-1").string());
}

TEST_CASE("checkpoint: a directory under a checkpoint's name is refused, named, not read") {
  std::filesystem::remove_all("ckpt-dir-test");
  std::filesystem::create_directories("ckpt-dir-test/checkpoint-3.apsckpt");
  CHECK_THROWS_WITH_AS(ps::read_checkpoint("ckpt-dir-test/checkpoint-3.apsckpt"),
                       doctest::Contains("checkpoint-3.apsckpt: not a regular file"), ps::bad_request);
  auto latest = ps::load_latest("ckpt-dir-test");
  CHECK_FALSE(latest.found);
  REQUIRE(latest.refused.size() == 1);
  CHECK(latest.refused[0].find("not a regular file") != std::string::npos);
  std::filesystem::remove_all("ckpt-dir-test");
}

TEST_CASE("a shard section whose lengths claim more than its bytes is refused before anything is allocated") {
  auto bytes = encode_shard(sample(5).shards[0]);
  CHECK(decode_shard(bytes).segments.size() == sample(5).shards[0].segments.size());
  // The first length field (after the shard id) claims 2^40 segments; cereal would size
  // the vector first (found by tests/fuzz/fuzz_checkpoint).
  std::string lying = bytes;
  const std::uint64_t huge = 1ull << 40;
  std::memcpy(lying.data() + sizeof(std::uint32_t), &huge, sizeof huge);
  try {
    decode_shard(lying);
    FAIL("decoded");
  } catch (const ps::bad_request& e) {
    CHECK(std::string(e.what()).find("remain") != std::string::npos);
  }
}

TEST_CASE("reshard: every key and row of a 2-shard checkpoint lands once, at its owner among 3, state slots with it") {
  checkpoint c;
  c.header.shard_ids = {0, 1};
  // Shard 0 held keys [0, 5000) with 2 state slots, shard 1 keys [5000, 9000) and 50 rows of table 0.
  auto segment = [](key_type b, key_type e) {
    stored_segment s{b, e, {}, {}};
    for (auto k = b; k < e; ++k) s.values.push_back(static_cast<float>(k));
    for (int slot = 0; slot < 2; ++slot)
      for (auto k = b; k < e; ++k) s.state.push_back(static_cast<float>(k) + 0.5f * static_cast<float>(slot + 1));
    return s;
  };
  c.shards.push_back(shard_snapshot{0, {segment(0, 5000)}, {}, {}, 0});
  table_rows rows{0, 2, {}, {}};
  for (std::uint64_t id = 0; id < 50; ++id) {
    rows.ids.push_back(id * 7919);
    rows.rows.insert(rows.rows.end(), {static_cast<float>(id), -static_cast<float>(id)});
  }
  c.shards.push_back(shard_snapshot{1, {segment(5000, 9000)}, {rows}, {}, 0});
  ps::partitioner map(1, {0, 1, 2}, 16, 6);
  auto out = reshard(c, map);
  REQUIRE(out.shards.size() == 3);
  CHECK(out.header.shard_ids == std::vector<std::uint32_t>{0, 1, 2});
  std::uint64_t keys = 0, rows_seen = 0;
  for (const auto& s : out.shards) {
    for (const auto& seg : s.segments) {
      const auto len = seg.end - seg.begin;
      REQUIRE(seg.state.size() == 2 * len);
      for (auto k = seg.begin; k < seg.end; ++k) {
        CHECK(map.owner(k) == s.shard);
        CHECK(seg.values[k - seg.begin] == static_cast<float>(k));
        CHECK(seg.state[len + (k - seg.begin)] == static_cast<float>(k) + 1.0f);  // the second slot
      }
      keys += len;
    }
    for (const auto& t : s.tables)
      for (std::size_t r = 0; r < t.ids.size(); ++r, ++rows_seen) {
        CHECK(map.row_owner(t.table, t.ids[r]) == s.shard);
        CHECK(t.rows[2 * r] == static_cast<float>(t.ids[r] / 7919));
      }
  }
  CHECK(keys == 9000);
  CHECK(rows_seen == 50);
  // A recovery's layout: the one section it asks for, as the full layout has it.
  auto one = reshard(c, map, {}, 2);
  REQUIRE(one.shards.size() == 1);
  CHECK(one.shards[0].shard == 2);
  CHECK(one.shards[0].segments.size() == out.shards[2].segments.size());
  CHECK(one.shards[0].tables.size() == out.shards[2].tables.size());
  CHECK_THROWS_WITH_AS(reshard(c, map, {}, 7), doctest::Contains("shard 7 is not in the map"), ps::bad_request);
  // Rows on a disk tier are laid out only where the caller gives a place for new stores
  // (a restoring job), and only from files that count them per table (format 4 on).
  c.shards[1].disk_rows = "/somewhere/shard-1";
  c.shards[1].disk_table_rows = {3, 4};
  CHECK_THROWS_WITH_AS(reshard(c, map), doctest::Contains("when a job restores from the checkpoint"), ps::bad_request);
  c.shards[1].disk_table_rows.clear();
  CHECK_THROWS_WITH_AS(reshard(c, map, "/somewhere/onto-3-shards"), doctest::Contains("restore it onto as many shards"),
                       ps::bad_request);
}

TEST_CASE("a checkpoint cut after a shard joined carries the map's placement; its state is laid out again only for another map") {
  temp_dir dir;
  const std::vector<key_range> tensors{{0, 9000}};
  ps::partitioner before(1, {0, 1}, 16, 6, tensors);
  auto after = before.with_shard(2);  // placed: the newcomer took buckets from both
  auto c = sample(40);
  c.header.vnodes = 16;
  c.header.bucket_bits = 6;
  CHECK(same_map(c.header, before));  // no placement in the header: the ring's own
  CHECK_FALSE(same_map(c.header, after));
  // Laid out for the newer map: each key once, at its owner there; the header says so.
  auto moved = laid_out_for(c, after);
  CHECK(moved.header.shard_ids == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(moved.header.placement == after.placement());
  CHECK(same_map(moved.header, after));
  std::uint64_t keys = 0;
  for (const auto& s : moved.shards)
    for (const auto& seg : s.segments) {
      for (auto k = seg.begin; k < seg.end; ++k) CHECK(after.owner(k) == s.shard);
      keys += seg.end - seg.begin;
    }
  CHECK(keys == 8 + 4);  // sample()'s keys: [0, 5), [100, 103) and [4096, 4100)
  CHECK(laid_out_for(c, before).shards.size() == 2);  // the same map: as it was
  // The placement survives the file (format version 3).
  fs::create_directories(dir.path);
  auto path = write_checkpoint(dir.str(), moved);
  auto back = read_checkpoint(path);
  CHECK(back.header.placement == after.placement());
  CHECK(same_map(back.header, after));
}

TEST_CASE("a checkpoint holds each shard's disk-tier rows per table and admission's counts; files of format version 3 still read") {
  temp_dir dir;
  auto c = sample(60);
  c.shards[0].disk_rows = disk_rows_name(60, 0);
  c.shards[0].disk_row_count = 12;
  c.shards[0].disk_table_rows = {5, 7};
  c.shards[1].sightings = {0, 3, 65535, 9};
  fs::create_directories(dir.path / "checkpoint-60.rows/shard-0");
  auto back = read_checkpoint(write_checkpoint(dir.str(), c));
  CHECK(back.shards[0].disk_table_rows == std::vector<std::uint64_t>{5, 7});
  CHECK(back.shards[1].sightings == c.shards[1].sightings);
  CHECK(back.shards[0].sightings.empty());

  c.shards[0].disk_table_rows = {5, 6};
  CHECK_THROWS_WITH_AS(read_checkpoint(write_checkpoint(dir.str(), c)),
                       doctest::Contains("shard 0: its disk tier's rows per table do not add up to its 12 rows"), bad_request);

  auto old = (dir.path / "checkpoint-61.apsckpt").string();
  write_v3_file(old, c);
  auto v3 = read_checkpoint(old);
  CHECK(v3.header.clock == 60);
  CHECK(v3.header.rule == "adam");
  CHECK(v3.shards[0].disk_row_count == 12);
  CHECK(v3.shards[0].disk_table_rows.empty());
  CHECK(v3.shards[1].sightings.empty());
  CHECK(v3.shards[1].segments[0].values == c.shards[1].segments[0].values);
}

TEST_CASE("reshard: each new shard gets the sum of admission's counts, so no id counts under its sightings") {
  auto c = sample(70);
  c.shards[0].sightings = {1, 2, 65535, 0};
  c.shards[1].sightings = {4, 0, 7, 0};
  ps::partitioner map(1, {0, 1, 2}, 16, 6);
  auto out = reshard(c, map);
  REQUIRE(out.shards.size() == 3);
  for (const auto& s : out.shards) CHECK(s.sightings == std::vector<std::uint16_t>{5, 2, 65535, 0});
  c.shards[1].sightings.pop_back();
  CHECK_THROWS_WITH_AS(reshard(c, map), doctest::Contains("saved counters"), bad_request);
}
