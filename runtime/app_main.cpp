// One binary per app: the role a process runs, for app binaries and psnode alike.
#include "runtime/app_main.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "runtime/health_endpoint.hpp"
#include "runtime/job_file.hpp"
#include "runtime/launch_env.hpp"
#include "runtime/prometheus_export.hpp"
#include "runtime/signals.hpp"

namespace ps {

namespace {

std::string names_joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : "|") + n;
  return out;
}

}  // namespace

int run_node(node_config& cfg, bool process_ends) {
  apply_runtime_defaults(cfg);
  try {
    bool runs_app = cfg.role == "worker" || cfg.role == "local";
    if (!cfg.job_file.empty()) take_job_file(read_job_file(cfg.job_file), cfg);
    // The coordinator holds the job's spec, and the app is part of it.
    if ((runs_app || cfg.role == "coordinator" || cfg.role == "describe") && cfg.app.empty())
      throw bad_request("--role=" + cfg.role + " needs --app=" + names_joined(app_names()) +
                        (cfg.role == "coordinator" ? " or --job-file=FILE" : ""));
    auto app = runs_app ? find_app(cfg.app) : app_fn{};
    // A server learns the job from the coordinator: it neither needs the app nor computes its
    // settings (an app's tensors may depend on files only its workers have).
    auto settings = cfg.app.empty() || cfg.role == "server" ? job_settings{} : settings_for_app(cfg, cfg.app);
    if (cfg.role == "export") return run_export_role(cfg, settings);  // no actors
    if (cfg.role == "describe") return run_describe_role(cfg, settings);
    if (cfg.role != "coordinator") await_rendezvous(cfg);  // --layout under MPI: rank 0's address
    caf::actor_system sys{cfg};
    catch_stop_signals();
    serve_health(cfg.health_port);
    if (cfg.role == "local") health_ready();
    std::unique_ptr<prometheus_export> exporter;
    int status = cfg.role == "local"         ? run_local_role(sys, cfg, app, settings, metrics_listener(cfg, exporter))
                 : cfg.role == "coordinator" ? run_coordinator_role(sys, cfg, settings, metrics_listener(cfg, exporter))
                 : cfg.role == "server"      ? run_server_role(sys, cfg)
                                             : run_worker_role(sys, cfg, app);
    if (process_ends)
      bound_teardown(status, 10);  // the last line is out: the actor system's teardown follows
    else
      restore_stop_signals();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

namespace {

// The app registered (once) and run as its flags say; copies of the process are started
// as set_child_program says.
int run_registered(const app_definition& app, int argc, char** argv, bool process_ends) {
  try {
    auto known = app_names();
    if (std::find(known.begin(), known.end(), app.name) == known.end()) register_app(app);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  node_config cfg;
  cfg.help = {app.name,
              app.summary + " (the whole job here: --cluster=embedded|processes; one role of a job across hosts: "
                            "--role=coordinator|server|worker --coordinator=HOST:PORT; --role=export)",
              {"role", "job", "addresses", "consistency", "wire", "checkpoints", "tables", "faults", "security", "metrics"},
              {app.name}};
  cfg.app = app.name;  // before the flags are checked: the app's defaults (its rule) apply
  if (!cfg.parse_args(argc, argv)) return cfg.cli_helptext_printed ? 0 : 2;
  if (cfg.app != app.name) {
    std::fprintf(stderr, "error: this binary runs the app %s, not --app=%s (psnode runs the built-in apps)\n",
                 app.name.c_str(), cfg.app.c_str());
    return 2;
  }
  if (cfg.role.empty()) cfg.role = "local";
  if (cfg.role == "local" || cfg.role == "coordinator" || cfg.role == "server" || cfg.role == "worker" ||
      cfg.role == "export" || cfg.role == "describe")
    return run_node(cfg, process_ends);
  std::fprintf(stderr,
               "error: --role is coordinator, server, worker, local (the default), export or describe, not \"%s\"\n",
               cfg.role.c_str());
  return 2;
}

}  // namespace

int run_app(const app_definition& app, int argc, char** argv) {
  try {
    set_child_program(std::filesystem::read_symlink("/proc/self/exe").string());  // processes: copies of this binary
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return run_registered(app, argc, argv, true);
}

int run_app(const app_definition& app, const std::vector<std::string>& args, std::string program,
            std::vector<std::string> leading) {
  set_child_program(std::move(program), std::move(leading));
  std::vector<std::string> store{app.name};
  store.insert(store.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : store) argv.push_back(s.data());
  return run_registered(app, static_cast<int>(argv.size()), argv.data(), false);
}

}  // namespace ps
