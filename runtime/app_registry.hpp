#pragma once
// Apps register by name: what their workers run, the update rule and consistency they are
// written for, their own flags and their part of the job spec (the dense tensors they
// push and pull, and those flags).
// psnode --app=NAME, the launchers and out-of-tree programs (examples/hello_kv.cpp) find
// them here; the built-in ones come with ps::register_builtin_apps() (apps/apps.hpp).
#include <functional>
#include <string>
#include <vector>

#include "runtime/node.hpp"
#include "libps/core/job_spec.hpp"

namespace ps {

struct app_definition {
  std::string name;
  std::string summary;              // one line, listed when an unknown app is asked for
  app_fn run;                       // a worker's part; returns its JSON result
  std::string default_rule = "sum";           // when --ps.rule is not given
  std::string default_consistency = "asp";    // when neither --consistency nor --staleness is
  std::function<std::vector<tensor_spec>(const node_config&)> tensors;  // may be empty
  std::vector<app_flag> flags;      // its own flags (runtime/node.hpp), read with cfg.app_count(...)
  std::function<std::vector<sparse_table_spec>(const node_config&)> tables = {};  // sparse tables; may be empty
  // Its workers start at their registration's start_clock (data position and random state
  // follow from the clock), so a --restore resumes at the checkpoint's clock. Apps that
  // do not run the whole job again on the restored state (rowcheck's --prior-runs).
  bool resumes = false;
};

// Throws bad_request for an empty name, a missing run function, a name taken already, or
// a flag that a built-in option or another app declares differently.
void register_app(app_definition app);
// Every registered app's flags, each name once. A program declares them when it parses
// its flags, so apps register before (ps::register_builtin_apps()).
std::vector<app_flag> registered_app_flags();
// Throws bad_request naming the registered apps when there is none of that name.
const app_definition& find_app_definition(const std::string& name);
app_fn find_app(const std::string& name);
// The update rule a member runs: --ps.rule, else its app's default (sum without an app,
// or for an app not registered).
std::string effective_rule(const node_config& cfg);
std::vector<std::string> app_names();

// The job settings and spec of app `name` under cfg: its defaults where cfg does not set
// the rule or the consistency, its tensors, and buckets sized to them unless
// --ps.bucket-bits is given (libps/keys/partitioner.hpp).
job_settings settings_for_app(const node_config& cfg, const std::string& name);

}  // namespace ps
