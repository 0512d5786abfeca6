// Roles from a cluster launcher: --layout=servers:S,workers:W and the rank that Slurm's
// srun, Open MPI's mpirun or a PMI launcher gives each process in its environment. Rank 0
// coordinates, ranks 1..S serve, the rest work, so one identical command on every rank runs
// a whole job. Plain decisions: the environment comes in as a lookup, the rendezvous file's
// reading and writing are the caller's (runtime/launch_env.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace ps {

// The coordinator's port under a layout when neither --coordinator nor --port names one.
inline constexpr std::uint16_t default_layout_port = 7070;

struct job_layout {
  std::size_t servers = 0, workers = 0;
  std::size_t ranks() const { return 1 + servers + workers; }
  std::string text() const;  // "servers:S,workers:W"
};

// "servers:4,workers:8" (either order, each once, each >= 1); throws bad_request naming
// what is wrong.
job_layout parse_layout(const std::string& text);

// What a launcher told this process about itself.
struct launcher_rank {
  std::string launcher;            // "openmpi" | "pmi" | "slurm"
  std::string rank_var, size_var;  // the variables it was read from, for messages
  std::size_t rank = 0, size = 0;
  std::string job_id;              // the launcher's job ("": not known)
  std::vector<std::string> nodes;  // Slurm: the job's hosts, first one first; MPI: none
};

using env_lookup = std::function<std::optional<std::string>(const std::string&)>;

// The launcher whose rank variables are set: Open MPI's, then PMI's, then Slurm's (an
// mpirun inside an sbatch script inherits the batch step's SLURM_PROCID, never the other
// way round). nullopt: no launcher. Throws bad_request when a variable is not a count or the
// rank is not below the size.
std::optional<launcher_rank> launcher_rank_from(const env_lookup& env);

// Slurm's host list: "n[01-03,7],gpu5" -> n01 n02 n03 n7 gpu5 (zero padding kept).
// Throws bad_request on malformed text.
std::vector<std::string> expand_host_list(const std::string& text);

// "" or why the launcher's ranks do not fit the layout, naming both counts.
std::string layout_mismatch(const job_layout& layout, const launcher_rank& rank);

// What this rank runs and where the coordinator is.
struct layout_plan {
  std::string role;           // coordinator | server | worker
  std::size_t index = 0;      // among its role: server 0, worker 1, ...
  std::string coordinator;    // HOST:PORT; "" when a rendezvous file will say
  std::uint16_t listen_port = 0;  // rank 0: the coordinator's port (0: any, told by the file); others 0
};

// Throws bad_request when the coordinator cannot be found: MPI names no host for rank 0,
// so it needs --coordinator=HOST:PORT or a rendezvous file. `coordinator_flag` and
// `port_flag` are --coordinator and --port as given ("" and 0: not given).
layout_plan plan_layout(const job_layout& layout, const launcher_rank& rank, const std::string& coordinator_flag,
                        std::uint16_t port_flag, bool has_rendezvous);

// The rendezvous file's one line, and its reading: the coordinator's address if the line is
// of the job `job_id` (any job when either is ""), nullopt for another job's or a torn line.
std::string rendezvous_line(const std::string& job_id, const std::string& coordinator);
std::optional<std::string> rendezvous_address(const std::string& line, const std::string& job_id);

}  // namespace ps
