#include "runtime/launch_env.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "libps/net/launch_layout.hpp"
#include "runtime/node.hpp"

namespace ps {

namespace {

std::optional<std::string> from_environment(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

// Flags the layout sets itself; given as well, they would say two things at once.
void refuse_layout_overlap(const node_config& cfg) {
  for (const char* flag : {"role", "servers", "workers"})
    if (cfg.given.count(flag))
      throw bad_request("--layout gives each rank its role and the job's size: drop --" + std::string(flag));
}

// What others dial to reach rank 0: --advertise or --host when given, else the host's name
// (endpoint_of would say 127.0.0.1: the coordinator has no route toward itself to ask).
std::string this_host(const node_config& cfg) {
  auto at = resolve_endpoint({cfg.host, cfg.port, cfg.listen, cfg.advertise});
  if (!at.advertise_host.empty()) return at.advertise_host;
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) throw bad_request("--rendezvous: this host has no name to write");
  return name;
}

}  // namespace

void apply_layout(node_config& cfg) {
  if (cfg.layout.empty()) {
    if (!cfg.rendezvous.empty()) throw bad_request("--rendezvous is for --layout (ranks from a launcher)");
    return;
  }
  auto layout = parse_layout(cfg.layout);
  refuse_layout_overlap(cfg);
  auto rank = launcher_rank_from(from_environment);
  if (!rank)
    throw bad_request("--layout needs a launcher's rank: run it under srun (sbatch) or mpirun (none of SLURM_PROCID, "
                      "OMPI_COMM_WORLD_RANK, PMI_RANK is set here)");
  if (auto wrong = layout_mismatch(layout, *rank); !wrong.empty())
    throw bad_request("rank " + std::to_string(rank->rank) + ": " + wrong);
  auto plan = plan_layout(layout, *rank, cfg.coordinator, cfg.port, !cfg.rendezvous.empty());
  cfg.role = plan.role;
  cfg.servers = layout.servers;
  cfg.workers = layout.workers;
  cfg.coordinator = plan.coordinator;
  cfg.port = plan.listen_port;
  cfg.launch_rank = rank->rank;
  cfg.launch_job_id = rank->job_id;
}

void write_rendezvous(const node_config& cfg, std::uint16_t port) {
  if (cfg.rendezvous.empty()) return;
  auto aside = cfg.rendezvous + ".partial." + std::to_string(getpid());
  {
    std::ofstream out(aside, std::ios::trunc);
    out << rendezvous_line(cfg.launch_job_id, this_host(cfg) + ":" + std::to_string(port)) << "\n";
    if (!out.flush()) throw bad_request("--rendezvous: cannot write " + aside);
  }
  std::error_code ec;
  std::filesystem::rename(aside, cfg.rendezvous, ec);
  if (ec) throw bad_request("--rendezvous: cannot rename " + aside + " to " + cfg.rendezvous + ": " + ec.message());
}

void await_rendezvous(node_config& cfg) {
  if (cfg.rendezvous.empty() || !cfg.coordinator.empty()) return;
  using clock = std::chrono::steady_clock;
  auto start = clock::now(), said = start;
  auto patience = std::chrono::milliseconds(cfg.failure_timeout_ms);
  for (;;) {
    std::ifstream in(cfg.rendezvous);
    std::string line;
    if (in && std::getline(in, line))
      if (auto address = rendezvous_address(line, cfg.launch_job_id)) {
        parse_host_port(*address);  // a damaged address is refused here, by name
        cfg.coordinator = *address;
        return;
      }
    auto now = clock::now();
    if (now - start >= patience)
      throw bad_request("--rendezvous=" + cfg.rendezvous + ": no address of this job (" +
                        (cfg.launch_job_id.empty() ? std::string("any") : cfg.launch_job_id) + ") from rank 0 within " +
                        std::to_string(cfg.failure_timeout_ms) + " ms (--ps.failure-timeout-ms)");
    if (now - said >= std::chrono::seconds(5)) {
      std::fprintf(stderr, "rank %zu: waiting for rank 0's address in %s\n", cfg.launch_rank.value_or(0),
                   cfg.rendezvous.c_str());
      said = now;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a file on a shared directory: no event to wait on
  }
}

}  // namespace ps
