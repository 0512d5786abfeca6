// fault_drill: a shard's process is killed in the middle of a job whose shards are kept
// in chains of 2 copies, and nothing acknowledged is lost. The fault injector is the
// public --faults flag (libps/sim/faults.hpp), and it is part of the job spec: every
// member follows the coordinator's plan. With no arguments it runs
//   fault_drill --servers=2 --workers=2 --replication=2 --faults="kill server=1 at=4"
// as processes (a kill ends the whole process, so not --cluster=embedded). Every clock
// each worker w pushes w + 1 to every key and ticks; at the end all pull and check the
// exact sums of every clock, and that they failed over to shard 1's copy. Exits 0 only then.
#include <actorps/actorps.hpp>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr ps::key_type num_keys = 1000;
constexpr std::uint64_t clocks = 12;

std::string drill(ps::worker_context& ctx) {
  auto keys = ps::key_set::single({0, num_keys});
  const std::vector<float> mine(num_keys, static_cast<float>(ctx.id + 1));
  for (std::uint64_t c = ctx.start_clock; c < clocks; ++c) {
    ctx.kv.push(keys, mine).get();       // acknowledged by the chain's last copy
    ctx.kv.advance_clock(c + 1).get();  // the kill comes once shard 1's clock reaches 4
  }
  ctx.kv.leave_clock_vector().get();
  ctx.barrier();  // every worker's pushes are in
  auto sums = ctx.kv.pull(keys).get();
  ctx.barrier();  // nobody leaves while another still pulls
  const float expected = clocks * ctx.num_workers * (ctx.num_workers + 1) / 2.0f;
  for (ps::key_type k = 0; k < num_keys; ++k)
    if (sums[k] != expected)
      throw std::runtime_error("key " + std::to_string(k) + " holds " + std::to_string(sums[k]) + ", not " +
                               std::to_string(expected) + ": updates were lost");
  if (ctx.kv.recovery_times_ms().empty()) throw std::runtime_error("no failover seen: the fault plan did not run");
  return nlohmann::json{{"worker", ctx.id}, {"sum", expected}, {"failover_ms", ctx.kv.recovery_times_ms()},
                        {"right", true}}
    .dump();
}

}  // namespace

int main(int argc, char** argv) {
  // The drill's flags, unless given otherwise on the command line.
  std::vector<char*> args(argv, argv + argc);
  std::vector<std::string> drill_flags{"--servers=2", "--workers=2", "--replication=2", "--faults=kill server=1 at=4"};
  for (auto& flag : drill_flags) {
    auto name = flag.substr(0, flag.find('=') + 1);
    bool given = false;
    for (int i = 1; i < argc; ++i) given |= std::strncmp(argv[i], name.c_str(), name.size()) == 0;
    if (!given) args.push_back(flag.data());
  }
  return ps::run_app({"fault_drill", "a shard killed under replication 2, exact sums", drill, "sum", "bsp",
                      [](const ps::node_config&) { return std::vector<ps::tensor_spec>{{"w", {0, num_keys}, {num_keys}}}; },
                      {}},
                     static_cast<int>(args.size()), args.data());
}
