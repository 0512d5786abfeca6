#pragma once
// The job contract: what the coordinator holds and hands every member that registers.
// A member adopts each job setting it was not given and refuses to start when one it
// was given differs (every difference named with both values). Settings are kept as
// canonical text, so the comparison is exact and the spec crosses the wire as strings.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "libps/keys/keys.hpp"

namespace ps {

// The version of the messages between members. A member of another version is refused
// with both versions named (checkpoint files carry their own, libps/persist/checkpoint.hpp).
// 3: observer events typed, a worker's end is a worker_result, checkpoint atoms split.
// 4: members rejoin a resumed coordinator; barriers are numbered; a worker's end is acknowledged.
// 5: a rule's own hyper-parameters travel with it (rule_msg::params).
inline constexpr std::uint32_t protocol_version = 5;

struct job_setting {
  std::string name;   // the flag's name without dashes, e.g. "model", "ps.vnodes"
  std::string value;  // canonical text (node_config's rendering of the parsed value)
};

// A dense tensor of the job's model: its keys and shape (the keys it owns are
// key_range.size() = product of shape).
struct tensor_spec {
  std::string name;
  key_range keys;
  std::vector<std::uint64_t> shape;
};

struct setting_difference {
  std::string name;
  std::string job_value;
  std::string given_value;
};

class job_spec {
 public:
  std::uint32_t version = protocol_version;

  // Sets (or replaces) a setting; names are kept sorted so equal specs print equally.
  void set(const std::string& name, std::string value);
  std::optional<std::string> get(const std::string& name) const;
  const std::vector<job_setting>& settings() const { return settings_; }

  void add_tensor(tensor_spec t);  // throws bad_request when its keys overlap another's
  const std::vector<tensor_spec>& tensors() const { return tensors_; }
  std::uint64_t num_keys() const;

  // FNV-1a over the version, settings and tensors: equal for equal specs, so members and
  // logs can tell in one number that they run the same job.
  std::uint64_t fingerprint() const;

  // The settings a member was given that differ from this spec's, in name order. A
  // given setting the spec does not hold is a difference too (job value "(not set)").
  std::vector<setting_difference> differences(const std::vector<job_setting>& given) const;

  // Rebuilds a spec from its parts (as they cross the wire); throws bad_request.
  static job_spec from_parts(std::uint32_t version, std::vector<job_setting> settings,
                             std::vector<tensor_spec> tensors);

 private:
  std::vector<job_setting> settings_;
  std::vector<tensor_spec> tensors_;
};

// The spec's fingerprint as 16 hex digits (logs, JSON lines, the coordinator's saved state).
std::string fingerprint_hex(const job_spec& spec);

// The spec's tensors' keys, ascending (they never overlap).
std::vector<key_range> dense_ranges(const job_spec& spec);

// "" when every key of `keys` lies in one of the tensors (or none is declared: the app
// declares no dense tensors), else what lies outside and the tensors nearest to it:
// "keys [10, 15) are outside every declared tensor (nearest: hello [0, 10))".
// `keys` ascending; `tensors` sorted by their first key (kv_client sorts them once), since
// this runs on every request.
std::string keys_outside(const std::vector<key_range>& keys, const std::vector<tensor_spec>& tensors);

// One line naming every difference: "--model=mlp (the job has softmax), --lr=0.5 (the
// job has 0.1)".
std::string describe_differences(const std::vector<setting_difference>& diffs);

// Empty when the versions meet; else the refusal, naming both.
std::string version_mismatch(std::uint32_t member_version, std::uint32_t job_version);

}  // namespace ps
