// psctl status's summary (libps/observe/cluster_status.hpp): workers' clocks from the shards'
// vectors, a shard that does not answer, stats that are not a shard's.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "libps/observe/cluster_status.hpp"
#include "libps/keys/keys.hpp"

using namespace ps;
using json = nlohmann::json;

namespace {

std::string shard_stats(std::uint64_t keys, std::uint64_t table_bytes, json clocks) {
  return json{{"keys", keys}, {"rows", 3}, {"table_bytes", table_bytes}, {"pushes", 50}, {"pulls", 20},
              {"uptime_s", 10.0}, {"clocks", std::move(clocks)}, {"ram_hits", table_bytes ? 3 : 0},
              {"ram_misses", table_bytes ? 1 : 0}}
    .dump();
}

}  // namespace

TEST_CASE("status: a worker's clock is the lowest a shard saw; the slowest running worker is named") {
  std::vector<status_shard> shards{{0, "10.0.0.1:4000", 11, shard_stats(100, 64, json{5, 9, nullptr}), ""},
                                   {1, "10.0.0.2:4000", 12, shard_stats(200, 0, json{6, 7, nullptr}), ""},
                                   {2, "10.0.0.3:4000", 13, "", "request timed out", 2}};
  std::vector<status_worker> workers{{0, "worker 0 (pid 21)", false}, {1, "worker 1 (pid 22)", false},
                                     {2, "worker 2 (joined, pid 23)", true}};
  auto st = json::parse(status_json(4, "running", shards, workers));
  CHECK(st["epoch"] == 4);
  REQUIRE(st["shards"].size() == 3);
  CHECK(st["shards"][0]["bytes"] == 100 * 4 + 64);
  CHECK(st["shards"][0]["push_rate"] == doctest::Approx(5.0));
  CHECK(st["shards"][0]["ram_hit_rate"] == doctest::Approx(0.75));
  CHECK_FALSE(st["shards"][1].contains("ram_hit_rate"));  // it looked up no rows
  CHECK(st["shards"][1]["address"] == "10.0.0.2:4000");
  CHECK(st["shards"][2]["state"] == "not answering");
  CHECK(st["shards"][2]["error"] == "request timed out");
  CHECK(st["shards"][0]["copies"] == 1);
  CHECK(st["shards"][2]["copies"] == 2);  // a chain of two
  CHECK(st["workers"][0]["clock"] == 5);
  CHECK(st["workers"][1]["clock"] == 7);
  CHECK(st["workers"][2]["clock"].is_null());
  CHECK(st["workers"][2]["state"] == "finished");
  CHECK(st["slowest_worker"] == 0);
  auto table = status_table(st.dump());
  CHECK(table.find("map epoch 4") != std::string::npos);
  CHECK(table.find("copies") != std::string::npos);
  CHECK(table.find("not answering") != std::string::npos);
  CHECK(table.find("worker 2 (joined, pid 23)") != std::string::npos);
}

TEST_CASE("status: no running worker has no slowest; stats that are not a shard's are refused by shard") {
  auto st = json::parse(status_json(1, "running", {}, {{0, "worker 0", true}}));
  CHECK(st["slowest_worker"].is_null());
  CHECK(st["shards"].empty());
  std::vector<status_shard> bad{{3, "h:1", 1, "{\"keys\": 1}", ""}};
  CHECK_THROWS_WITH_AS(status_json(1, "running", bad, {}), doctest::Contains("shard 3"), bad_request);
}
