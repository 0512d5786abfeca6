// The coordinator's saved state (--state-dir): what is saved is what is loaded, and a
// damaged or missing file is refused by name.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "libps/persist/coordinator_record.hpp"
#include "libps/keys/keys.hpp"

using namespace ps;

namespace {

struct scratch_dir {
  std::string path;
  scratch_dir() {
    char tmpl[] = "/tmp/ps-record-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~scratch_dir() { std::filesystem::remove_all(path); }
};

coordinator_record sample() {
  coordinator_record r;
  r.job_fingerprint = "abc123";
  r.servers = 2;
  r.workers = 2;
  r.epoch = 4;
  r.placement = {{3, 2}, {17, 0}};
  r.retired = {1};
  r.shards = {{0, "127.0.0.1", 4001, 11, {0, 1}}, {1, "127.0.0.1", 4002, 12, {}}, {2, "10.0.0.3", 4003, 13, {1}}};
  r.worker_done = {true, false, false};
  r.results[0] = {true, R"({"app":"clocksum","sum":12})"};
  r.barrier_generation = 7;
  r.saves = 9;
  r.change = "join";
  r.change_shard = 2;
  return r;
}

}  // namespace

TEST_CASE("coordinator record: what is saved is loaded, and a save replaces the file whole") {
  scratch_dir dir;
  auto r = sample();
  save_record(dir.path, r);
  auto back = load_record(dir.path);
  CHECK(back.job_fingerprint == "abc123");
  CHECK(back.servers == 2);
  CHECK(back.epoch == 4);
  CHECK(back.placement == r.placement);
  CHECK(back.retired == std::vector<std::uint32_t>{1});
  REQUIRE(back.shards.size() == 3);
  CHECK(back.shards[2].host == "10.0.0.3");
  CHECK(back.shards[2].port == 4003);
  CHECK(back.shards[2].pid == 13);
  CHECK(back.shards[0].chain == std::vector<std::uint32_t>{0, 1});
  CHECK(back.shards[1].chain.empty());
  CHECK(back.shards[2].chain == std::vector<std::uint32_t>{1});  // a chain closed over its head
  CHECK(back.worker_done == std::vector<bool>{true, false, false});
  REQUIRE(back.results.count(0) == 1);
  CHECK(back.results[0].json == R"({"app":"clocksum","sum":12})");
  CHECK(back.barrier_generation == 7);
  CHECK(back.change == "join");
  CHECK(back.change_shard == 2);
  r.epoch = 5;
  r.worker_done[1] = true;
  save_record(dir.path, r);
  back = load_record(dir.path);
  CHECK(back.epoch == 5);
  CHECK(back.worker_done[1]);
  CHECK_FALSE(std::filesystem::exists(record_path(dir.path) + ".tmp"));
}

TEST_CASE("coordinator record: missing, truncated or inconsistent files are refused, naming the file") {
  scratch_dir dir;
  CHECK_THROWS_WITH_AS(load_record(dir.path), doctest::Contains("coordinator.json cannot be read"), bad_request);
  save_record(dir.path, sample());
  std::filesystem::resize_file(record_path(dir.path), 40);
  CHECK_THROWS_WITH_AS(load_record(dir.path), doctest::Contains("is not a coordinator's state"), bad_request);
  auto r = sample();
  r.shards[1].id = 5;
  save_record(dir.path, r);
  CHECK_THROWS_WITH_AS(load_record(dir.path), doctest::Contains("shard entry 1 has id 5"), bad_request);
  r = sample();
  r.results[9] = {true, "{}"};
  save_record(dir.path, r);
  CHECK_THROWS_WITH_AS(load_record(dir.path), doctest::Contains("worker 9"), bad_request);
  r = sample();
  r.change = "split";
  save_record(dir.path, r);
  CHECK_THROWS_WITH_AS(load_record(dir.path), doctest::Contains(R"(a map change of kind "split")"), bad_request);
  r = sample();
  r.change_shard = 3;
  save_record(dir.path, r);
  CHECK_THROWS_WITH_AS(load_record(dir.path), doctest::Contains("a map change of shard 3"), bad_request);
  r = sample();
  r.shards[0].chain = {1, 1};
  save_record(dir.path, r);
  CHECK_THROWS_WITH_AS(load_record(dir.path), doctest::Contains("shard 0's chain lists copy 1 twice"), bad_request);
  r.shards[0].chain = {0, r.servers + 2};  // a copy grown in the process of shard 2: its place is after the start's
  save_record(dir.path, r);
  CHECK(load_record(dir.path).shards[0].chain == r.shards[0].chain);
  r.shards[0].chain = {0, r.servers + 3};
  save_record(dir.path, r);
  CHECK_THROWS_WITH_AS(load_record(dir.path), doctest::Contains("copy 5, beyond the 5 places"),
                       bad_request);
  CHECK_THROWS_WITH_AS(save_record(dir.path + "/no/such/dir", r), doctest::Contains("cannot write"), bad_request);
}
