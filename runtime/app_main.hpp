#pragma once
// One binary per app, with every role. An app's main is one line:
//
//   int main(int argc, char** argv) { return ps::run_app(my_app, argc, argv); }
//
// and the binary runs the whole job here (the default role; --cluster=embedded puts every
// role in this process, --cluster=processes starts copies of this binary as servers and
// workers), or one role of a job spread over hosts (--role=coordinator|server|worker with
// --coordinator=HOST:PORT; the binary is the app, so no --app), or writes a checkpoint out
// as .npy files (--role=export). Its --help lists the common flags and the app's own only.
// psnode is the same program for the built-in apps, which it picks by --app.
#include "runtime/app_registry.hpp"

namespace ps {

// Registers `app` (unless an app of its name is registered already) and runs this process
// as its flags say. Returns the process's exit status (PROTOCOL.md's table; 2: bad flags).
int run_app(const app_definition& app, int argc, char** argv);

// run_app for an app an interpreter runs (the Python module): copies of the process for
// --cluster=processes are `program leading... flags` (python3 train.py --role=server ...),
// args are the flags (no program name first), and the process goes on after the job.
int run_app(const app_definition& app, const std::vector<std::string>& args, std::string program,
            std::vector<std::string> leading);

// What run_app and psnode share: runs the role of the parsed cfg (the app is cfg.app),
// with --metrics-port served for the roles that watch a job. Returns the exit status.
// process_ends: the caller exits right after, so the actor system's teardown is bounded
// (10 s: a peer that cannot be reached must not hold the exit).
int run_node(node_config& cfg, bool process_ends = true);

}  // namespace ps
