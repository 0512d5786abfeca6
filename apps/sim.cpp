// sim: the whole cluster on CAF's deterministic scheduler, one seeded schedule and fault
// plan per seed (apps/sim_cluster.hpp says what runs and which invariants are checked).
//   sim [--seeds=1000] [--from=1] [--break=dedupe|ssp-gate] [--elastic] [--tiered] [--no-data-plane]
//       [--log-level=error]
// Blocks travel over the in-memory transport, as production's go over its data plane;
// --no-data-plane keeps every value inside the messages.
// --elastic: plans with one copy per shard may also have a server join and a shard leave
// (psctl remove-shard) while the workers push; off by default until every such seed passes.
// One JSON line per failing seed, with the command that replays it, then
//   {"seeds":N,"failures":K,"trace_hash":"...","messages":M,"data_plane_bytes":B,"seconds":T}
// where trace_hash covers every run's message trace (the same seeds give the same hash).
// Exit 0 when no seed failed, 1 when some did, 2 for a bad command line. --break turns a
// safety mechanism off (libps/sim/sabotage.hpp) to show that the simulator finds what it prevents.
// --log-level=warning replays a seed with the coordinator's news (failovers, the restart)
// and the members' warnings.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/sim_cluster.hpp"
#include "libps/keys/keys.hpp"
#include "libps/observe/log.hpp"
#include "libps/sim/sabotage.hpp"
#include "libps/observe/text.hpp"

namespace {

constexpr const char* usage_text =
  "usage: sim [--seeds=N] [--from=S] [--break=dedupe|ssp-gate] [--elastic] [--tiered] [--no-data-plane]\n"
  "           [--log-level=error]\n";

struct options {
  std::uint64_t seeds = 1000, from = 1;
  std::string broken;
  bool elastic = false;
  bool tiered = false;
  bool data_plane = true;
  ps::log_level log = ps::log_level::error;  // the members' news would drown the results
};

std::uint64_t number_flag(const std::string& arg, const std::string& flag) {
  auto text = arg.substr(flag.size());
  std::size_t used = 0;
  unsigned long long n = 0;
  try {
    n = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (text.empty() || used != text.size() || text[0] == '-')
    throw ps::bad_request(flag + " wants a whole number, got \"" + text + "\"");
  return n;
}

options parse(const std::vector<std::string>& args) {
  options o;
  for (const auto& a : args) {
    if (a.rfind("--seeds=", 0) == 0)
      o.seeds = number_flag(a, "--seeds=");
    else if (a.rfind("--from=", 0) == 0)
      o.from = number_flag(a, "--from=");
    else if (a.rfind("--break=", 0) == 0)
      o.broken = a.substr(8);
    else if (a == "--elastic")
      o.elastic = true;
    else if (a == "--tiered")
      o.tiered = true;
    else if (a == "--no-data-plane")
      o.data_plane = false;
    else if (a.rfind("--log-level=", 0) == 0) {
      auto level = ps::parse_log_level(a.substr(12));
      if (!level) throw ps::bad_request("--log-level is error, warning, info or debug, not \"" + a.substr(12) + "\"");
      o.log = *level;
    }
    else
      throw ps::bad_request("unknown argument \"" + a + "\"");
  }
  if (o.seeds == 0) throw ps::bad_request("--seeds must be at least 1");
  return o;
}

std::string replay_command(std::uint64_t seed, const options& o) {
  return "build/bin/sim --seeds=1 --from=" + std::to_string(seed) + (o.broken.empty() ? "" : " --break=" + o.broken) +
         (o.elastic ? " --elastic" : "") + (o.tiered ? " --tiered" : "") +
         (o.data_plane ? "" : " --no-data-plane");
}

std::string hex(std::uint64_t x) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(x));
  return buf;
}

int run(const options& o) {
  if (!o.broken.empty()) ps::sabotage::turn_on(o.broken);
  ps::set_log_level(o.log);
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto last_progress = t0;
  std::uint64_t failures = 0, messages = 0, plane_bytes = 0, combined = 0xcbf29ce484222325ull;
  std::uint64_t kills_in_changes = 0;  // plans that kill a server process and also add or remove a shard
  for (std::uint64_t seed = o.from; seed < o.from + o.seeds; ++seed) {
    auto plan = ps::plan_for_seed(seed, o.elastic);
    plan.tiered = o.tiered;
    plan.data_plane = o.data_plane;
    kills_in_changes += plan.kill_server && (plan.join_step || plan.remove_shard);
    auto out = ps::run_simulation(plan);
    combined = (combined ^ out.trace_hash) * 0x100000001b3ull;
    messages += out.messages;
    plane_bytes += out.plane_bytes;
    if (!out.failure.empty()) {
      ++failures;
      nlohmann::ordered_json line{{"seed", seed}, {"failure", out.failure},
                                  {"plan", nlohmann::json::parse(ps::to_json(plan))},
                                  {"replay", replay_command(seed, o)}};
      std::printf("%s\n", line.dump().c_str());
      std::fflush(stdout);
    }
    if (clock::now() - last_progress > std::chrono::seconds(10)) {
      last_progress = clock::now();
      std::fprintf(stderr, "sim: %llu of %llu seeds, %llu failed\n",
                   static_cast<unsigned long long>(seed - o.from + 1), static_cast<unsigned long long>(o.seeds),
                   static_cast<unsigned long long>(failures));
    }
  }
  double seconds = std::chrono::duration<double>(clock::now() - t0).count();
  nlohmann::ordered_json summary{{"seeds", o.seeds}, {"failures", failures}, {"trace_hash", hex(combined)},
                                 {"messages", messages}, {"data_plane_bytes", plane_bytes}, {"seconds", seconds}};
  if (o.elastic) summary["kill_and_change_plans"] = kills_in_changes;
  if (!o.broken.empty()) summary["break"] = o.broken;
  std::printf("%s\n", summary.dump().c_str());
  return failures > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("%s", usage_text);
    return 0;
  }
  try {
    auto o = parse(args);
    return run(o);
  } catch (const ps::bad_request& e) {
    std::fprintf(stderr, "sim: %s\n%s", e.what(), usage_text);
    return 2;
  }
}
