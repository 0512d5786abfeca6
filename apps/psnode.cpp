// psnode: one ActorPS node. --role=coordinator|server|worker; servers and workers find
// the coordinator with --coordinator=HOST:PORT. --role=local runs a whole job of --app
// here (a local cluster, like train_fmnist does). Settings: flags or an INI file
// (--config-file=config/cluster.ini); see docs/running.md. An app of one's own is its own
// binary with the same roles (runtime/app_main.hpp); psnode runs the built-in apps.
#include <cstdio>

#include "apps/apps.hpp"
#include "runtime/app_main.hpp"

int main(int argc, char** argv) {
  ps::register_builtin_apps();
  ps::node_config cfg;
  cfg.help = {"psnode", "one node of a cluster (--role=coordinator|server|worker), a whole job here (--role=local --app=NAME), or a checkpoint as .npy files (--role=export)",
              {"node", "job", "addresses", "fmnist", "consistency", "wire", "checkpoints", "tables", "faults", "security", "metrics"}, ps::app_names()};
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  if (cfg.role.empty()) {
    std::fprintf(stderr, "error: --role=coordinator|server|worker|local|export is required\n");
    return 2;
  }
  return ps::run_node(cfg);
}
