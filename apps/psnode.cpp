// psnode: one ActorPS node. --role=coordinator|server|worker; servers and workers find
// the coordinator with --coordinator=HOST:PORT. --role=local runs a whole job of --app
// here (a local cluster, like train_fmnist does). Settings: flags or an INI file
// (--config-file=config/cluster.ini); see docs/running.md.
#include <cstdio>

#include "apps/apps.hpp"
#include "apps/prometheus_export.hpp"
#include "runtime/signals.hpp"

int main(int argc, char** argv) {
  ps::register_builtin_apps();
  ps::node_config cfg;
  cfg.help = {"psnode", "one node of a cluster (--role=coordinator|server|worker), a whole job here (--role=local --app=NAME), or a checkpoint as .npy files (--role=export)",
              {"node", "job", "addresses", "fmnist", "consistency", "wire", "checkpoints", "tables", "faults", "security", "metrics"}, ps::app_names()};
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  ps::apply_runtime_defaults(cfg);
  try {
    if (cfg.role.empty()) throw ps::bad_request("--role=coordinator|server|worker|local|export is required");
    bool runs_app = cfg.role == "worker" || cfg.role == "local";
    // The coordinator holds the job's spec, and the app is part of it.
    if ((runs_app || cfg.role == "coordinator") && cfg.app.empty())
      throw ps::bad_request("--role=" + cfg.role + " needs --app=fmnist|kvcheck|bench|clocksum");
    auto app = runs_app ? ps::find_app(cfg.app) : ps::app_fn{};
    // A server learns the job from the coordinator; it may be started without --app.
    auto settings = cfg.app.empty() ? ps::job_settings{} : ps::settings_for_app(cfg, cfg.app);
    if (cfg.role == "export") return ps::run_export_role(cfg, settings);  // no actors
    caf::actor_system sys{cfg};
    ps::catch_stop_signals();
    std::unique_ptr<ps::prometheus_export> exporter;
    int status = cfg.role == "local"         ? ps::run_local_role(sys, cfg, app, settings, ps::metrics_listener(cfg, exporter))
                 : cfg.role == "coordinator" ? ps::run_coordinator_role(sys, cfg, settings, ps::metrics_listener(cfg, exporter))
                 : cfg.role == "server"      ? ps::run_server_role(sys, cfg)
                                             : ps::run_worker_role(sys, cfg, app);
    ps::bound_teardown(status, 10);  // the last line is out: the actor system's teardown follows
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
