#include "runtime/job_contract.hpp"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "libps/core/consistency.hpp"
#include "libps/keys/partitioner.hpp"
#include "libps/observe/text.hpp"
#include "libps/sim/faults.hpp"
#include "runtime/app_registry.hpp"

namespace ps {

namespace {

std::string render(const std::string& v) { return v; }
template <class T>
std::string render(const T& v) { return setting_text(v); }

[[noreturn]] void unreadable(const std::string& name, const std::string& text) {
  throw bad_request("the job spec's " + name + " = \"" + text + "\" is not a value this build reads");
}
void parse_into(const std::string& name, const std::string& text, std::string& out) {
  (void)name;
  out = text;
}
void parse_into(const std::string& name, const std::string& text, std::size_t& out) {
  auto v = parse_count(text);
  if (!v) unreadable(name, text);
  out = static_cast<std::size_t>(*v);
}
void parse_into(const std::string& name, const std::string& text, double& out) {
  auto v = parse_number(text);
  if (!v) unreadable(name, text);
  out = *v;
}
// One job setting: its flag name, how a member renders the value it was given, and how
// it takes the spec's value.
struct field {
  std::string name;
  std::function<std::string(const node_config&)> given;
  std::function<void(node_config&, const std::string&)> adopt;
};

template <class T>
field plain(std::string name, T node_config::*member) {
  return {name, [member](const node_config& c) { return render(c.*member); },
          [name, member](node_config& c, const std::string& text) { parse_into(name, text, c.*member); }};
}

// consistency and staleness are adopted together from their effective values (an
// effective bound, not a flag, is what the job runs with).
void adopt_consistency(node_config& c, const std::string& text) {
  if (text != "bsp" && text != "ssp" && text != "asp") unreadable("consistency", text);
  c.consistency = text;
}
void adopt_staleness(node_config& c, const std::string& text) {
  if (text == "inf" || c.consistency == "bsp" || c.consistency == "asp") {
    c.staleness = -1;
    return;
  }
  auto v = parse_count(text);
  if (!v) unreadable("staleness", text);
  c.staleness = static_cast<std::int64_t>(*v);
}

// The rule's own hyper-parameters compare as every one of them, in the rule's order, after
// its defaults: "alpha=0.1" given and "alpha=0.1,beta=1" in the spec are the same job.
std::string rule_params_given(const node_config& c) {
  try {
    return rule_from(c, effective_rule(c)).params_text();
  } catch (const std::exception&) {
    return c.rule_params;  // refused where the config is checked, naming what is wrong
  }
}
void adopt_rule_params(node_config& c, const std::string& text) { c.rule_params = text; }

// The fault plan is the job's: a member not given --faults follows the coordinator's (a
// server's kills, a worker's kills, slowness and message faults), and plans compare as
// their canonical text.
std::string faults_given(const node_config& c) {
  try {
    return to_string(parse_faults(c.faults));
  } catch (const std::exception&) {
    return c.faults;  // refused where the config is checked, naming the clause
  }
}
void adopt_faults(node_config& c, const std::string& text) { c.faults = text; }

const std::vector<field>& fields() {
  static const std::vector<field> all = {
    plain("app", &node_config::app),
    plain("model", &node_config::model),
    plain("epochs", &node_config::epochs),
    plain("lr", &node_config::lr),
    plain("batch", &node_config::batch),
    plain("seed", &node_config::seed),
    plain("data", &node_config::data),
    {"consistency", [](const node_config& c) { return c.consistency; }, adopt_consistency},
    {"staleness", [](const node_config& c) { return render(c.staleness); }, adopt_staleness},
    plain("ps.rule", &node_config::rule),
    {"ps.rule-params", rule_params_given, adopt_rule_params},
    plain("ps.momentum", &node_config::momentum),
    plain("compression", &node_config::compression),
    plain("topk-ratio", &node_config::topk_ratio),
    plain("pull-compression", &node_config::pull_compression),
    plain("replication", &node_config::replication),
    plain("servers", &node_config::servers),
    plain("workers", &node_config::workers),
    plain("checkpoint-every", &node_config::checkpoint_every),
    plain("checkpoint-seconds", &node_config::checkpoint_seconds),
    plain("ps.vnodes", &node_config::vnodes),
    plain("ps.bucket-bits", &node_config::bucket_bits),
    {"faults", faults_given, adopt_faults},
  };
  return all;
}

// The job settings of app `app`: the fixed ones and the app's own flags.
std::vector<field> fields_of(const std::string& app) {
  auto out = fields();
  for (const auto& flag : find_app_definition(app).flags)
    out.push_back({flag.name, [name = flag.name](const node_config& c) { return c.app_flag_text(name); },
                   [name = flag.name](node_config& c, const std::string& text) { c.set_app_flag(name, text); }});
  return out;
}

}  // namespace

job_spec spec_of(const node_config& cfg, const std::string& app, const job_settings& settings,
                 std::vector<tensor_spec> tensors) {
  job_spec spec;
  for (const auto& f : fields_of(app)) spec.set(f.name, f.given(cfg));
  // What the job runs with: launchers name the app themselves (train_fmnist: fmnist), and
  // the rule, consistency and buckets are the effective ones, after the app's defaults.
  spec.set("app", app);
  spec.set("consistency", consistency_name(settings.staleness));
  spec.set("staleness", staleness_to_string(settings.staleness));
  spec.set("ps.rule", settings.rule.kind.name());
  spec.set("ps.rule-params", settings.rule.params_text());
  spec.set("ps.bucket-bits", std::to_string(settings.bucket_bits));
  for (auto& t : tensors) spec.add_tensor(std::move(t));
  return spec;
}

std::vector<job_setting> given_settings(const node_config& cfg) {
  std::vector<job_setting> out;
  for (const auto& f : cfg.app.empty() ? fields() : fields_of(cfg.app))
    if (cfg.given.count(f.name)) out.push_back({f.name, f.given(cfg)});
  return out;
}

void adopt(node_config& cfg, const job_spec& spec) {
  auto app = cfg.app.empty() ? spec.get("app").value_or("") : cfg.app;
  for (const auto& f : app.empty() ? fields() : fields_of(app)) {
    if (cfg.given.count(f.name)) continue;
    if (auto v = spec.get(f.name)) f.adopt(cfg, *v);
  }
  cfg.validate();
}

std::string fingerprint_text(const job_spec& spec) { return fingerprint_hex(spec); }

partitioner job_map(const node_config& cfg, const job_settings& settings) {
  std::vector<std::uint32_t> ids(cfg.servers);
  for (std::uint32_t i = 0; i < ids.size(); ++i) ids[i] = i;
  return partitioner(1, ids, static_cast<std::uint32_t>(cfg.vnodes), settings.bucket_bits, dense_ranges(settings.spec));
}

std::vector<std::uint64_t> shard_keys(const node_config& cfg, const job_settings& settings) {
  return shard_keys(job_map(cfg, settings), settings);
}

std::vector<std::uint64_t> final_shard_keys(const node_config& cfg, const job_settings& settings, const job_result& res) {
  return res.map ? shard_keys(*res.map, settings) : shard_keys(cfg, settings);
}

std::vector<std::uint64_t> shard_keys(const partitioner& map, const job_settings& settings) {
  const auto& ids = map.shard_ids();
  std::vector<std::uint64_t> out(ids.empty() ? 0 : *std::max_element(ids.begin(), ids.end()) + 1, 0);
  for (const auto& t : settings.spec.tensors())
    for (const auto& p : map.split(key_set::single(t.keys))) out[p.shard] += p.keys.size();
  return out;
}


}  // namespace ps
