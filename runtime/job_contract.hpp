#pragma once
// The job contract between node_config and libps/core/job_spec: which flags are job settings,
// the spec a coordinator builds from its own configuration, the settings a member was
// given explicitly (compared with the spec), and adopting the spec's values for the rest.
#include <vector>

#include "runtime/node.hpp"
#include "libps/core/job_spec.hpp"

namespace ps {

// The spec of the job cfg describes: app `app`, every job setting at its effective value
// (the app's defaults and the bucket size applied through `settings`) and its tensors.
job_spec spec_of(const node_config& cfg, const std::string& app, const job_settings& settings,
                 std::vector<tensor_spec> tensors);

// The job settings this member was given on its command line or in its INI file, at the
// values it parsed.
std::vector<job_setting> given_settings(const node_config& cfg);

// Sets every job setting cfg was not given to the spec's value and validates the result;
// throws bad_request when the spec holds a value this build cannot parse.
void adopt(node_config& cfg, const job_spec& spec);

// The job's fingerprint as 16 hex digits (logs and JSON lines).
std::string fingerprint_text(const job_spec& spec);

// How many of the spec's tensor keys each of cfg.servers shards owns (by shard id) under
// the map the job's settings give.
// The map a job of these settings starts with (the coordinator's first epoch).
partitioner job_map(const node_config& cfg, const job_settings& settings);
std::vector<std::uint64_t> shard_keys(const node_config& cfg, const job_settings& settings);
// The same for `map` (after shards joined or left: by shard id, 0 for one that left).
std::vector<std::uint64_t> shard_keys(const partitioner& map, const job_settings& settings);
// The job's last line's shard_keys: by the map at its end (res.map), else the first one.
std::vector<std::uint64_t> final_shard_keys(const node_config& cfg, const job_settings& settings, const job_result& res);

}  // namespace ps
