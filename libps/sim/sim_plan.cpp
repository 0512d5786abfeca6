#include "libps/sim/sim_plan.hpp"

#include <random>

#include <nlohmann/json.hpp>

#include "libps/core/consistency.hpp"

namespace ps {

namespace {

// A uniform pick in [lo, hi].
std::uint64_t between(std::mt19937_64& rng, std::uint64_t lo, std::uint64_t hi) {
  return lo + rng() % (hi - lo + 1);
}

bool one_in(std::mt19937_64& rng, std::uint64_t n) { return rng() % n == 0; }

void plan_message_faults(std::mt19937_64& rng, sim_plan& p) {
  if (one_in(rng, 2)) {
    p.messages.drop_p = 0.02 * static_cast<double>(between(rng, 1, 5));
    p.messages.drop_seed = rng();
  }
  if (one_in(rng, 2)) {
    p.messages.duplicate_p = 0.05 * static_cast<double>(between(rng, 1, 4));
    p.messages.duplicate_seed = rng();
  }
  if (one_in(rng, 4)) p.messages.delay_ms = between(rng, 1, 20);
  // Lost requests need resends; duplicates come from them too (a reply lost, the request sent again).
  if (p.messages.drop_p > 0 || one_in(rng, 2)) p.retry_ms = between(rng, 20, 200);
}

}  // namespace

sim_plan plan_for_seed(std::uint64_t seed, bool elastic) {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  sim_plan p;
  p.seed = seed;
  p.workers = static_cast<std::uint32_t>(between(rng, 2, 3));
  const std::uint64_t models[] = {0, 1, 2, infinite_staleness};
  p.staleness = models[rng() % 4];
  p.clocks = between(rng, 4, 8);
  p.servers = one_in(rng, 3) ? 3 : 2;
  p.replication = static_cast<std::uint32_t>(between(rng, 1, p.servers));
  if (p.replication >= 2 && !one_in(rng, 3)) {
    p.kill_server = static_cast<std::uint32_t>(rng() % p.servers);
    p.kill_step = between(rng, 0, 400);
  }
  if (one_in(rng, 3)) {
    p.leaver = static_cast<std::uint32_t>(rng() % p.workers);
    p.leave_at = between(rng, 1, p.clocks - 1);
  }
  if (one_in(rng, 4)) {
    auto w = static_cast<std::uint32_t>(rng() % p.workers);
    bool survivor = false;  // a worker that neither dies nor leaves early reads the final sums
    for (std::uint32_t o = 0; o < p.workers; ++o) survivor |= o != w && p.leaver != o;
    if (p.leaver != w && survivor) {
      p.kill_worker = w;
      p.kill_worker_step = between(rng, 0, 600);
    }
  }
  for (std::uint32_t w = 0; w < p.workers; ++w) p.speed.push_back(one_in(rng, 3) ? 1 : 4);
  if (one_in(rng, 4)) {
    p.partition_server = static_cast<std::uint32_t>(rng() % p.servers);
    p.partition_step = between(rng, 0, 400);
    p.partition_events = between(rng, 20, 200);
  }
  plan_message_faults(rng, p);
  // Drawn last, so the earlier choices of every seed stay what they were.
  if (elastic && one_in(rng, 2)) {
    if (!one_in(rng, 3)) p.join_step = between(rng, 0, 400);
    if (!one_in(rng, 3)) {
      p.remove_shard = static_cast<std::uint32_t>(rng() % p.servers);
      p.remove_step = between(rng, 0, 400);
    }
    // A removal ends its process: a kill on top of it must leave one process with a
    // copy, or the keys are lost by design (no checkpoints here), so it needs three.
    if (p.remove_shard && p.servers + (p.join_step ? 1 : 0) < 3) p.kill_server.reset();
  }
  if ((elastic || (!p.join_step && !p.remove_shard)) && one_in(rng, 4)) {
    p.restart_step = between(rng, 0, 400);
    p.restart_events = between(rng, 0, 150);
  }
  return p;
}

std::string to_json(const sim_plan& p) {
  nlohmann::json j{{"servers", p.servers},
                   {"workers", p.workers},
                   {"staleness", staleness_to_string(p.staleness)},
                   {"clocks", p.clocks},
                   {"replication", p.replication},
                   {"speed", p.speed},
                   {"messages", to_string(p.messages)},
                   {"retry_ms", p.retry_ms}};
  if (p.kill_server) j["kill"] = {{"server", *p.kill_server}, {"step", p.kill_step}};
  if (p.leaver) j["leave"] = {{"worker", *p.leaver}, {"clock", p.leave_at}};
  if (p.partition_server)
    j["partition"] = {{"server", *p.partition_server}, {"step", p.partition_step}, {"events", p.partition_events}};
  if (p.kill_worker) j["kill_worker"] = {{"worker", *p.kill_worker}, {"step", p.kill_worker_step}};
  if (p.join_step) j["join"] = {{"step", *p.join_step}};
  if (p.remove_shard) j["remove"] = {{"shard", *p.remove_shard}, {"step", p.remove_step}};
  if (p.restart_step) j["restart"] = {{"step", *p.restart_step}, {"events", p.restart_events}};
  if (p.tiered) j["tiered"] = true;
  if (!p.data_plane) j["data_plane"] = false;
  return j.dump();
}

}  // namespace ps
