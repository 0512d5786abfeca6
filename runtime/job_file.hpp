#pragma once
// A job file: an app's part of the job (its name, dense tensors and sparse tables) with the
// job's settings, as one JSON object, so that a coordinator which does not run the app
// holds the job all the same (psnode --role=coordinator --job-file=FILE). Any app's
// program writes it with --role=describe: a Python script, an out-of-tree binary, psnode.
#include <string>
#include <vector>

#include "libps/core/job_spec.hpp"
#include "libps/rows/sparse_table.hpp"
#include "runtime/node.hpp"

namespace ps {

struct job_file {
  std::string app;
  job_spec spec;  // the job's settings and tensors
  std::vector<sparse_table_spec> tables;
};

// The file's text: one line of JSON ({"job_file": 1, "app", "fingerprint", "settings",
// "tensors", "tables"}).
std::string job_file_json(const job_file& file);
// Throws bad_request naming `source` and what is wrong (not JSON, a missing or mistyped
// field, a bad table or tensor, another protocol version).
job_file parse_job_file(const std::string& text, const std::string& source);
// The file at `path`; throws bad_request when it cannot be read or parsed.
job_file read_job_file(const std::string& path);

// Makes cfg the coordinator of the job the file describes: its app registered as declared
// there (unless this program has an app of that name: that one is used), and every job
// setting not given on cfg's command line taken from the file. Throws bad_request when cfg
// names another app, or the file holds an app flag of its own (only the app's program
// knows it: run the coordinator there).
void take_job_file(const job_file& file, node_config& cfg);

// --role=describe: cfg's job as a job file on stdout; 0.
int run_describe_role(const node_config& cfg, const job_settings& settings);

}  // namespace ps
