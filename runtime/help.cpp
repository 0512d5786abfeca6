// Each program's --help: its own flags by topic, with descriptions and defaults.
#include <map>

#include "libps/core/consistency.hpp"
#include "runtime/app_registry.hpp"
#include "runtime/node.hpp"

namespace ps {

namespace {

// The options of each topic, by full name ("model", "ps.rule").
const std::map<std::string, std::vector<std::string>>& help_topics() {
  static const std::map<std::string, std::vector<std::string>> topics{
    {"node", {"role", "coordinator", "app", "job-file", "layout", "rendezvous", "log-level"}},
    {"role", {"role", "coordinator", "job-file", "layout", "rendezvous", "log-level"}},  // an app's own binary: the binary is the app
    {"job", {"cluster", "servers", "workers", "epochs", "lr", "batch", "seed", "ps.rule", "ps.rule-params", "ps.momentum", "config-file"}},
    {"addresses", {"host", "port", "listen", "advertise", "ps.data-plane-port"}},
    {"fmnist", {"model", "data", "target-accuracy", "eval-every", "devices", "aggregation"}},
    {"consistency", {"consistency", "staleness", "pipeline", "slow-worker", "straggle", "trace"}},
    {"wire", {"compression", "topk-ratio", "pull-compression", "ps.chunk-bytes", "ps.push-chunk-bytes", "ps.inflight-bytes",
              "ps.crowded-inflight-bytes", "ps.tcp-push-chunk-bytes",
              "ps.transport", "ps.data-plane-bytes", "ps.shm-ring-bytes", "ps.shm-push-ring-bytes", "ps.direct-requests", "ps.caller-runs",
              "ps.busy-poll-us"}},
    {"checkpoints", {"checkpoint-dir", "checkpoint-every", "checkpoint-seconds", "restore", "restore-non-finite",
                     "replication", "out", "state-dir", "resume", "on-sigterm"}},
    {"tables", {"shard-memory", "shard-dir", "disk-readers", "eviction", "handoff"}},
    {"faults", {"faults", "ps.timeout-ms", "ps.heartbeat-ms", "ps.failure-timeout-ms", "ps.retry-ms"}},
    {"security", {"secret-file", "tls-cert", "tls-key", "tls-ca", "ps.max-message-bytes"}},
    {"metrics", {"metrics", "metrics-port", "health-port", "ps.metrics-ms", "ps.wait-report-ms"}},
  };
  return topics;
}

std::string text_of(caf::string_view v) { return {v.data(), v.size()}; }

std::string full_name(const caf::config_option& opt) {
  auto category = text_of(opt.category());
  auto name = text_of(opt.long_name());
  return category == "global" ? name : category + "." + name;
}

// The option's current value (its default before parsing) as a user would type it.
std::string default_text(const caf::config_option& opt) {
  auto value = opt.get();
  if (!value) return "";
  auto text = caf::to_string(*value);
  if (text.size() >= 2 && text.front() == '"' && text.back() == '"') text = text.substr(1, text.size() - 2);
  if (text.find('.') != std::string::npos && text.find_first_not_of("0123456789.-") == std::string::npos) {
    text.erase(text.find_last_not_of('0') + 1);  // 0.001000 -> 0.001
    if (text.back() == '.') text.pop_back();
  }
  return text;
}

std::string kind_name(app_flag_kind kind) {
  switch (kind) {
    case app_flag_kind::count: return "uint64";
    case app_flag_kind::number: return "real64";
    case app_flag_kind::counts: return "list of int64";
    case app_flag_kind::text: return "string";
  }
  return "value";
}

std::string flag_line(const std::string& name, const std::string& type, const std::string& description,
                      const std::string& fallback) {
  std::string flag = "  --" + name + "=<" + type + ">";
  if (flag.size() < 34) flag.append(34 - flag.size(), ' ');
  // A description that speaks of its default itself (a sentinel such as -1) says it best.
  bool said = description.find("default") != std::string::npos;
  return flag + " " + description + (fallback.empty() || said ? "" : " (default: " + fallback + ")") + "\n";
}

}  // namespace

std::string node_config::help_text() const {
  std::map<std::string, const caf::config_option*> by_name;
  for (const auto& opt : custom_options_) by_name[full_name(opt)] = &opt;
  std::string out = help.name + ": " + help.synopsis + "\n\nusage: " + help.name +
                    " [--flag=value ...]   (--long-help lists every option, CAF's too; "
                    "--config-file=FILE reads them from an INI file)\n";
  for (const auto& topic : help.topics) {
    out += "\n" + topic + ":\n";
    for (const auto& name : help_topics().at(topic))
      if (auto it = by_name.find(name); it != by_name.end())
        out += flag_line(name, text_of(it->second->type_name()), text_of(it->second->description()),
                         default_text(*it->second));
  }
  for (const auto& app : help.apps) {
    if (find_app_definition(app).flags.empty()) continue;
    out += "\n" + app + " app:\n";
    for (const auto& flag : find_app_definition(app).flags) out += flag_line(flag.name, kind_name(flag.kind), flag.help, flag.fallback);
  }
  return out;
}

std::string node_config::effective_config() const {
  std::map<std::string, std::vector<std::string>> sections;  // category -> "name = value"
  for (const auto& opt : custom_options_) {
    auto name = text_of(opt.long_name());
    if (name == "help" || name == "long-help" || name == "dump-config" || name == "config-file") continue;  // CAF's
    auto value = opt.get();
    if (!value) continue;
    auto text = caf::to_string(*value);
    // What was not given stays a comment with the value it has: given back, a default would
    // count as given (some mean "decide later": --ps.bucket-bits, --staleness=-1, "").
    bool was_given = given.count(full_name(opt)) > 0;
    sections[text_of(opt.category())].push_back((was_given ? "" : "; ") + name + " = " + text);
  }
  auto app_name = !app.empty() ? app : help.apps.size() == 1 ? help.apps.front() : std::string();
  std::string out = "; the settings of " + (help.name.empty() ? std::string("this program") : help.name) +
                    ": what was given, and as comments the\n; values the rest have (an INI file: --config-file=FILE runs the same job)\n";
  if (!app_name.empty()) {
    const auto& def = find_app_definition(app_name);
    auto bound = staleness_bound(def.default_consistency);
    out += "; app " + app_name + ": update rule " + (rule.empty() ? def.default_rule : rule) + ", consistency " +
           consistency_name(bound) + " (staleness " + staleness_to_string(bound) + ")\n";
  }
  for (const auto& [category, lines] : sections) {
    out += "[" + category + "]\n";
    for (const auto& l : lines) out += l + "\n";
  }
  return out;
}

}  // namespace ps
