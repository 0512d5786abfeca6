#include "runtime/app_registry.hpp"

#include <map>
#include <mutex>

#include "libps/keys/partitioner.hpp"
#include "runtime/job_contract.hpp"

namespace ps {

namespace {

struct registry {
  std::mutex mtx;
  std::map<std::string, app_definition> apps;
};

registry& the_registry() {
  static registry r;
  return r;
}

}  // namespace

void register_app(app_definition app) {
  if (app.name.empty()) throw bad_request("register_app: an app needs a name");
  if (!app.run) throw bad_request("register_app: app " + app.name + " has no run function");
  auto& r = the_registry();
  std::lock_guard<std::mutex> guard(r.mtx);
  if (r.apps.count(app.name)) throw bad_request("register_app: an app named " + app.name + " is registered already");
  for (const auto& flag : app.flags) {
    if (flag.name.empty()) throw bad_request("register_app: app " + app.name + " declares a flag without a name");
    for (const auto& [other_name, other] : r.apps)
      for (const auto& theirs : other.flags)
        if (theirs.name == flag.name && (theirs.kind != flag.kind || theirs.fallback != flag.fallback))
          throw bad_request("register_app: app " + app.name + "'s flag --" + flag.name + " differs from app " +
                            other_name + "'s flag of that name");
  }
  auto name = app.name;
  r.apps.emplace(std::move(name), std::move(app));
}

const app_definition& find_app_definition(const std::string& name) {
  auto& r = the_registry();
  std::lock_guard<std::mutex> guard(r.mtx);
  if (auto it = r.apps.find(name); it != r.apps.end()) return it->second;  // entries never move
  std::string known;
  for (const auto& [n, a] : r.apps) known += (known.empty() ? "" : ", ") + n + " (" + a.summary + ")";
  throw bad_request("unknown app \"" + name + "\" (the apps: " + (known.empty() ? "none registered" : known) + ")");
}

app_fn find_app(const std::string& name) { return find_app_definition(name).run; }

std::string effective_rule(const node_config& cfg) {
  if (!cfg.rule.empty()) return cfg.rule;
  auto& r = the_registry();
  std::lock_guard<std::mutex> guard(r.mtx);
  auto it = r.apps.find(cfg.app);
  return it == r.apps.end() ? "sum" : it->second.default_rule;
}

std::vector<app_flag> registered_app_flags() {
  auto& r = the_registry();
  std::lock_guard<std::mutex> guard(r.mtx);
  std::map<std::string, app_flag> by_name;
  for (const auto& [name, app] : r.apps)
    for (const auto& flag : app.flags) by_name.emplace(flag.name, flag);
  std::vector<app_flag> out;
  for (auto& [name, flag] : by_name) out.push_back(std::move(flag));
  return out;
}

std::vector<std::string> app_names() {
  auto& r = the_registry();
  std::lock_guard<std::mutex> guard(r.mtx);
  std::vector<std::string> out;
  for (const auto& entry : r.apps) out.push_back(entry.first);
  return out;
}

job_settings settings_for_app(const node_config& cfg, const std::string& name) {
  const auto& app = find_app_definition(name);
  auto s = settings_from(cfg, app.default_rule, app.default_consistency);
  auto tensors = app.tensors ? app.tensors(cfg) : std::vector<tensor_spec>{};
  std::uint64_t keys = 0;
  for (const auto& t : tensors) keys += t.keys.size();
  // Buckets small enough that the tensors spread evenly (libps/keys/partitioner.hpp), unless set.
  if (!cfg.given.count("ps.bucket-bits") && keys > 0) s.bucket_bits = partitioner::bucket_bits_for(keys, cfg.servers);
  s.spec = spec_of(cfg, name, s, std::move(tensors));
  if (app.tables) s.tables = app.tables(cfg);
  for (const auto& t : s.tables) t.validate();
  return s;
}

}  // namespace ps
