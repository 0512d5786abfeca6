#include "libps/observe/cluster_status.hpp"

#include <algorithm>
#include <cstdio>
#include <limits>

#include <nlohmann/json.hpp>

#include "libps/keys/keys.hpp"

namespace ps {

namespace {

using json = nlohmann::json;

json shard_part(const status_shard& s) {
  json out{{"id", s.id}, {"address", s.address}, {"pid", s.pid}, {"copies", s.copies}};
  if (s.stats.empty()) {
    out["state"] = "not answering";
    out["error"] = s.error;
    return out;
  }
  json st = json::parse(s.stats, nullptr, false);
  if (st.is_discarded() || !st.is_object() || !st.contains("clocks") || !st["clocks"].is_array())
    throw bad_request("shard " + std::to_string(s.id) + " sent stats that are not a shard's JSON: " + s.stats.substr(0, 200));
  const double uptime = std::max(st.value("uptime_s", 0.0), 1e-9);
  out["state"] = "serving";
  for (const char* k : {"keys", "rows", "ram_bytes", "ram_hits", "ram_misses", "disk_bytes_read", "peak_rss", "pushes",
                        "pulls"})
    out[k] = st.value(k, std::uint64_t{0});
  // The RAM tier over the disk: rows a request found in RAM, of all it looked up.
  const auto lookups = out["ram_hits"].get<std::uint64_t>() + out["ram_misses"].get<std::uint64_t>();
  if (lookups > 0) out["ram_hit_rate"] = static_cast<double>(out["ram_hits"].get<std::uint64_t>()) / lookups;
  // Dense parameters and the tables' rows with their optimizer state.
  out["bytes"] = st.value("keys", std::uint64_t{0}) * sizeof(float) + st.value("table_bytes", std::uint64_t{0});
  out["push_rate"] = static_cast<double>(out["pushes"].get<std::uint64_t>()) / uptime;
  out["pull_rate"] = static_cast<double>(out["pulls"].get<std::uint64_t>()) / uptime;
  out["clocks"] = st["clocks"];
  return out;
}

// The lowest clock any answering shard has for worker w; null when none has it live.
json worker_clock(const json& shards, std::uint32_t w) {
  std::uint64_t low = std::numeric_limits<std::uint64_t>::max();
  bool seen = false;
  for (const auto& s : shards) {
    if (!s.contains("clocks") || w >= s["clocks"].size() || s["clocks"][w].is_null()) continue;
    low = std::min(low, s["clocks"][w].get<std::uint64_t>());
    seen = true;
  }
  return seen ? json(low) : json();
}

std::string cell(const json& v) {
  if (v.is_null()) return "-";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", v.get<double>());
    return buf;
  }
  return v.dump();
}

// Rows of cells as columns padded to their widest cell.
std::string aligned(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& r : rows)
    for (std::size_t c = 0; c < r.size(); ++c) {
      width.resize(std::max(width.size(), r.size()));
      width[c] = std::max(width[c], r[c].size());
    }
  std::string out;
  for (const auto& r : rows) {
    for (std::size_t c = 0; c < r.size(); ++c) {
      out += r[c];
      if (c + 1 < r.size()) out += std::string(width[c] - r[c].size() + 2, ' ');
    }
    out += '\n';
  }
  return out;
}

}  // namespace

std::string status_json(std::uint64_t epoch, const std::string& job, const std::vector<status_shard>& shards,
                        const std::vector<status_worker>& workers) {
  json out{{"epoch", epoch}, {"job", job}, {"shards", json::array()}, {"workers", json::array()}};
  for (const auto& s : shards) out["shards"].push_back(shard_part(s));
  json slowest;
  std::uint64_t slowest_clock = std::numeric_limits<std::uint64_t>::max();
  for (const auto& w : workers) {
    json clock = w.finished ? json() : worker_clock(out["shards"], w.id);
    out["workers"].push_back({{"id", w.id}, {"member", w.member}, {"state", w.finished ? "finished" : "running"},
                              {"clock", clock}});
    if (!clock.is_null() && clock.get<std::uint64_t>() < slowest_clock) {
      slowest_clock = clock.get<std::uint64_t>();
      slowest = w.id;
    }
  }
  for (auto& s : out["shards"]) s.erase("clocks");  // summarized per worker above
  out["slowest_worker"] = slowest;
  return out.dump();
}

std::string status_table(const std::string& status) {
  json st = json::parse(status);
  std::string out = "job: " + cell(st["job"]) + ", map epoch " + cell(st["epoch"]) + ", slowest worker " +
                    cell(st["slowest_worker"]) + "\n\n";
  std::vector<std::vector<std::string>> shards{{"shard", "address", "pid", "copies", "state", "keys", "rows", "bytes",
                                                "ram_bytes", "disk_read", "peak_rss", "push/s", "pull/s"}};
  for (const auto& s : st["shards"]) {
    std::vector<std::string> r;
    for (const char* k : {"id", "address", "pid", "copies", "state", "keys", "rows", "bytes", "ram_bytes",
                          "disk_bytes_read", "peak_rss", "push_rate", "pull_rate"})
      r.push_back(cell(s.value(k, json())));
    shards.push_back(std::move(r));
  }
  std::vector<std::vector<std::string>> workers{{"worker", "state", "clock", "member"}};
  for (const auto& w : st["workers"])
    workers.push_back({cell(w["id"]), cell(w["state"]), cell(w["clock"]), cell(w["member"])});
  return out + aligned(shards) + "\n" + aligned(workers);
}

}  // namespace ps
