#pragma once
// ActorPS's API for programs outside the tree (installed with `cmake --install`; use with
// find_package(ActorPS REQUIRED) and target ActorPS::actorps). An app is a function a
// worker runs against the key-value client; register it by name and run a job of it,
// embedded (every role in this process) or as psnode processes.
//
//   ps::register_app({"name", "summary", run, "sum", "asp", tensors});
//   ps::node_config cfg;  cfg.parse_args(argc, argv);  cfg.cluster = "embedded";
//   caf::actor_system sys{cfg};
//   auto res = ps::run_job(sys, cfg, ps::find_app("name"), "name", ps::settings_for_app(cfg, "name"), report);
//
// Or let the binary be the app, with every role (embedded, local processes, one role of a
// job across hosts): int main(int argc, char** argv) { return ps::run_app(app, argc, argv); }
//
// In the app: ctx.kv.push(keys, values), ctx.kv.pull(keys).get(), ctx.barrier(), ctx.id.
// A server-side update rule of the app's own: ps::register_rule({"name", "formula",
// state_slots, apply}) before the job, then name it as the app's rule or with --ps.rule.
#include "runtime/node.hpp"           // node_config, run_job, job_result, worker_context
#include "actors/kv_client.hpp"      // kv_client, kv_future, key_set
#include "runtime/app_registry.hpp"  // register_app, find_app, settings_for_app
#include "runtime/app_main.hpp"      // run_app: one binary per app, with every role
#include "actors/training.hpp"       // batch_loader, training_plan, run_training: the pipelined stages
#include "runtime/signals.hpp"       // catch_stop_signals
#include "libps/core/update_rule.hpp"     // register_rule, rule_registration
