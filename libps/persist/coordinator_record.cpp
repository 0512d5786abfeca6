#include "libps/persist/coordinator_record.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "libps/keys/keys.hpp"

namespace ps {

namespace {

using json = nlohmann::json;

json to_json(const coordinator_record& r) {
  json shards = json::array();
  for (const auto& s : r.shards)
    shards.push_back({{"id", s.id}, {"host", s.host}, {"port", s.port}, {"pid", s.pid}, {"chain", s.chain}});
  json results = json::array();
  for (const auto& [w, res] : r.results) results.push_back({{"worker", w}, {"ok", res.ok}, {"json", res.json}});
  json placement = json::array();
  for (const auto& [bucket, owner] : r.placement) placement.push_back({bucket, owner});
  return {{"job_fingerprint", r.job_fingerprint}, {"servers", r.servers},   {"workers", r.workers},
          {"epoch", r.epoch},                     {"placement", placement}, {"retired", r.retired},
          {"shards", shards},                     {"worker_done", r.worker_done}, {"results", results},
          {"barrier_generation", r.barrier_generation}, {"saves", r.saves},
          {"change", r.change}, {"change_shard", r.change_shard}, {"change_epoch", r.change_epoch}};
}

coordinator_record from_json(const json& j) {
  coordinator_record r;
  r.job_fingerprint = j.at("job_fingerprint").get<std::string>();
  r.servers = j.at("servers").get<std::uint32_t>();
  r.workers = j.at("workers").get<std::uint32_t>();
  r.epoch = j.at("epoch").get<std::uint64_t>();
  for (const auto& p : j.at("placement")) r.placement.emplace_back(p.at(0).get<std::uint64_t>(), p.at(1).get<std::uint32_t>());
  r.retired = j.at("retired").get<std::vector<std::uint32_t>>();
  for (const auto& s : j.at("shards"))
    r.shards.push_back({s.at("id").get<std::uint32_t>(), s.at("host").get<std::string>(),
                        s.at("port").get<std::uint16_t>(), s.at("pid").get<std::uint32_t>(),
                        s.value("chain", std::vector<std::uint32_t>{})});  // absent in records of jobs without chains
  r.worker_done = j.at("worker_done").get<std::vector<bool>>();
  for (const auto& res : j.at("results"))
    r.results[res.at("worker").get<std::uint32_t>()] = {res.at("ok").get<bool>(), res.at("json").get<std::string>()};
  r.barrier_generation = j.at("barrier_generation").get<std::uint64_t>();
  r.saves = j.at("saves").get<std::uint64_t>();
  r.change = j.value("change", std::string());  // absent in records saved before map changes were
  r.change_shard = j.value("change_shard", std::uint32_t{0});
  r.change_epoch = j.value("change_epoch", r.epoch);
  return r;
}

// What makes a parsed record unusable (empty: nothing).
std::string inconsistency(const coordinator_record& r) {
  for (std::size_t i = 0; i < r.shards.size(); ++i)
    if (r.shards[i].id != i) return "shard entry " + std::to_string(i) + " has id " + std::to_string(r.shards[i].id);
  for (const auto& s : r.shards) {
    // Copies of the job's start are below its server count, grown ones name their
    // process after it (actors/coordinator/chains.cpp, grown_position).
    const auto positions = r.servers + r.shards.size();
    std::set<std::uint32_t> seen;
    for (auto position : s.chain)
      if (position >= positions || !seen.insert(position).second)
        return "shard " + std::to_string(s.id) + "'s chain lists copy " + std::to_string(position) +
               (position < positions ? " twice"
                                     : ", beyond the " + std::to_string(positions) + " places of a job of " +
                                           std::to_string(r.servers) + " servers and " + std::to_string(r.shards.size()) +
                                           " shards");
  }
  for (auto id : r.retired)
    if (id >= r.shards.size()) return "retired shard " + std::to_string(id) + " is not among its shards";
  for (const auto& [w, res] : r.results)
    if (w >= r.worker_done.size()) return "a result of worker " + std::to_string(w) + ", which it does not list";
  if (r.shards.empty()) return "it lists no shards";
  if (!r.change.empty() && r.change != "join" && r.change != "leave")
    return "a map change of kind \"" + r.change + "\" (join or leave)";
  if (!r.change.empty() && r.change_shard >= r.shards.size())
    return "a map change of shard " + std::to_string(r.change_shard) + ", which it does not list";
  return {};
}

}  // namespace

std::string record_path(const std::string& dir) { return dir + "/coordinator.json"; }

void save_record(const std::string& dir, const coordinator_record& record) {
  const auto path = record_path(dir), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << to_json(record).dump() << '\n';
    out.flush();
    if (!out) throw bad_request("cannot write the coordinator's state to " + tmp + ": " + std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    throw bad_request("cannot rename " + tmp + " to " + path + ": " + std::strerror(errno));
}

coordinator_record load_record(const std::string& dir) {
  const auto path = record_path(dir);
  std::ifstream in(path);
  if (!in) throw bad_request("cannot resume: " + path + " cannot be read (" + std::strerror(errno) + ")");
  std::stringstream text;
  text << in.rdbuf();
  coordinator_record r;
  try {
    r = from_json(json::parse(text.str()));
  } catch (const std::exception& e) {
    throw bad_request("cannot resume: " + path + " is not a coordinator's state: " + e.what());
  }
  if (auto why = inconsistency(r); !why.empty()) throw bad_request("cannot resume: " + path + ": " + why);
  return r;
}

}  // namespace ps
