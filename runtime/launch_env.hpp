#pragma once
// --layout: a process started by srun, sbatch or mpirun takes its role, the job's size and
// the coordinator's address from its launcher's environment (libps/net/launch_layout.hpp
// decides; this reads the environment and the rendezvous file).
#include <cstdint>

namespace ps {

struct node_config;

// Sets cfg's role, servers, workers, coordinator and port from --layout and the launcher's
// rank. Throws bad_request naming what is wrong: --layout with --role, no launcher, ranks
// that do not fit the layout. Nothing when --layout is not given.
void apply_layout(node_config& cfg);

// Under --layout with --rendezvous: rank 0 writes its address once it listens (whole or not
// at all: written aside, then renamed), every other rank waits for it, saying so every 5 s,
// for --ps.failure-timeout-ms (then bad_request naming the file).
void write_rendezvous(const node_config& cfg, std::uint16_t port);
void await_rendezvous(node_config& cfg);

}  // namespace ps
