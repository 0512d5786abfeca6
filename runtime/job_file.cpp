// Job files: an app's part of the job and the job's settings as JSON, written by
// --role=describe and read by a coordinator that does not run the app (--job-file).
#include "runtime/job_file.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/app_registry.hpp"
#include "runtime/job_contract.hpp"

namespace ps {

namespace {

using nlohmann::json;

json table_json(const sparse_table_spec& t) {
  return {{"name", t.name},          {"dim", t.dim},           {"init_scale", t.init_scale},
          {"seed", t.seed},          {"admit_after", t.admit_after}, {"expire_after", t.expire_after},
          {"rule", t.rule.kind.name()}, {"lr", t.rule.lr},     {"momentum", t.rule.momentum},
          {"beta1", t.rule.beta1},   {"beta2", t.rule.beta2},  {"eps", t.rule.eps},
          {"rule_params", t.rule.params_text()}};
}

// Whether j holds a T exactly: an unsigned integer in T's range, a finite float in its
// range, a string, a list of unsigned integers (nlohmann's get<> casts whatever it finds).
template <class T>
bool holds(const json& j) {
  if constexpr (std::is_same_v<T, std::string>) {
    return j.is_string();
  } else if constexpr (std::is_same_v<T, float>) {
    return j.is_number() && std::isfinite(j.get<double>()) &&
           std::abs(j.get<double>()) <= std::numeric_limits<float>::max();
  } else if constexpr (std::is_unsigned_v<T>) {
    return j.is_number_unsigned() && j.get<std::uint64_t>() <= std::numeric_limits<T>::max();
  } else {
    if (!j.is_array()) return false;
    for (const auto& e : j)
      if (!holds<std::uint64_t>(e)) return false;
    return true;
  }
}

template <class T>
const char* kind_name() {
  if constexpr (std::is_same_v<T, std::string>) return "string";
  else if constexpr (std::is_same_v<T, float>) return "finite number";
  else if constexpr (std::is_unsigned_v<T>) return "non-negative integer in range";
  else return "list of non-negative integers";
}

// Field `name` of object `o` as T; throws naming where it is and what it should be.
template <class T>
T field(const json& o, const std::string& name, const std::string& where) {
  auto it = o.find(name);
  if (it == o.end()) throw bad_request(where + " has no \"" + name + "\"");
  if (!holds<T>(*it)) throw bad_request(where + ": \"" + name + "\" is " + it->dump() + ", not a " + kind_name<T>());
  return it->get<T>();
}

sparse_table_spec table_of(const json& o, const std::string& where) {
  if (!o.is_object()) throw bad_request(where + " is not an object");
  sparse_table_spec t;
  t.name = field<std::string>(o, "name", where);
  t.dim = field<std::uint32_t>(o, "dim", where);
  t.init_scale = field<float>(o, "init_scale", where);
  t.seed = field<std::uint64_t>(o, "seed", where);
  t.admit_after = field<std::uint32_t>(o, "admit_after", where);
  t.expire_after = field<std::uint64_t>(o, "expire_after", where);
  t.rule.kind = field<std::string>(o, "rule", where);  // throws naming the known rules
  t.rule.lr = field<float>(o, "lr", where);
  t.rule.momentum = field<float>(o, "momentum", where);
  t.rule.beta1 = field<float>(o, "beta1", where);
  t.rule.beta2 = field<float>(o, "beta2", where);
  t.rule.eps = field<float>(o, "eps", where);
  t.rule.set_params(field<std::string>(o, "rule_params", where));
  t.rule.validate();
  t.validate();
  return t;
}

tensor_spec tensor_of(const json& o, const std::string& where) {
  if (!o.is_object()) throw bad_request(where + " is not an object");
  auto begin = field<std::uint64_t>(o, "begin", where);
  auto size = field<std::uint64_t>(o, "size", where);
  if (size == 0 || begin + size < begin) throw bad_request(where + ": \"size\" must be at least 1 and fit after \"begin\"");
  auto shape = o.contains("shape") ? field<std::vector<std::uint64_t>>(o, "shape", where) : std::vector<std::uint64_t>{size};
  std::uint64_t product = 1;
  for (auto d : shape) {
    if (d == 0 || product > size / d) {  // a zero, or more than size: never size
      product = 0;
      break;
    }
    product *= d;
  }
  if (product != size) throw bad_request(where + ": \"shape\" does not hold \"size\" (" + std::to_string(size) + ") values");
  return {field<std::string>(o, "name", where), {begin, begin + size}, std::move(shape)};
}

// The list `name` of doc, each item read and named uniquely.
template <class T, class Read>
std::vector<T> list_of(const json& doc, const std::string& name, const std::string& source, Read read) {
  std::vector<T> out;
  auto it = doc.find(name);
  if (it == doc.end()) return out;
  if (!it->is_array()) throw bad_request(source + ": \"" + name + "\" is not a list");
  std::set<std::string> names;
  for (std::size_t i = 0; i < it->size(); ++i) {
    auto where = source + ": " + name + "[" + std::to_string(i) + "]";
    out.push_back(read((*it)[i], where));
    if (!names.insert(out.back().name).second) throw bad_request(where + ": another is named " + out.back().name + " too");
  }
  return out;
}

// What differs between the tensors and tables of the file and those of the program's own
// app of that name ("": nothing).
std::string app_difference(const job_file& file, const node_config& cfg) {
  auto own = settings_for_app(cfg, file.app);
  std::vector<tensor_spec> theirs = file.spec.tensors(), ours = own.spec.tensors();
  auto same_tensors = theirs.size() == ours.size() &&
                      std::equal(theirs.begin(), theirs.end(), ours.begin(), [](const auto& a, const auto& b) {
                        return a.name == b.name && a.keys == b.keys && a.shape == b.shape;
                      });
  if (!same_tensors) return "tensors";
  json a = json::array(), b = json::array();
  for (const auto& t : file.tables) a.push_back(table_json(t));
  for (const auto& t : own.tables) b.push_back(table_json(t));
  return a == b ? "" : "tables";
}

}  // namespace

std::string job_file_json(const job_file& file) {
  json settings = json::object(), tensors = json::array(), tables = json::array();
  for (const auto& s : file.spec.settings()) settings[s.name] = s.value;
  for (const auto& t : file.spec.tensors())
    tensors.push_back({{"name", t.name}, {"begin", t.keys.begin}, {"size", t.keys.size()}, {"shape", t.shape}});
  for (const auto& t : file.tables) tables.push_back(table_json(t));
  json doc{{"job_file", 1},           {"app", file.app},         {"version", file.spec.version},
           {"fingerprint", fingerprint_hex(file.spec)}, {"settings", settings}, {"tensors", tensors},
           {"tables", tables}};
  return doc.dump();
}

job_file parse_job_file(const std::string& text, const std::string& source) {
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    throw bad_request(source + " is not JSON: " + e.what());
  }
  if (!doc.is_object() || !doc.contains("job_file"))
    throw bad_request(source + " is not a job file (no \"job_file\"; write one with --role=describe)");
  if (doc["job_file"] != 1) throw bad_request(source + ": job file format " + doc["job_file"].dump() + ", this build reads 1");
  job_file f;
  f.app = field<std::string>(doc, "app", source);
  if (f.app.empty()) throw bad_request(source + ": \"app\" is empty");
  auto version = field<std::uint32_t>(doc, "version", source);
  if (auto why = version_mismatch(version, protocol_version); !why.empty()) throw bad_request(source + ": " + why);
  std::vector<job_setting> settings;
  auto s = doc.find("settings");
  if (s == doc.end() || !s->is_object()) throw bad_request(source + " has no \"settings\" object");
  for (const auto& [name, value] : s->items()) {
    if (!value.is_string()) throw bad_request(source + ": setting \"" + name + "\" is " + value.dump() + ", not a string");
    settings.push_back({name, value.get<std::string>()});
  }
  for (const auto& s : settings)
    if (s.name == "app" && s.value != f.app)
      throw bad_request(source + ": \"app\" is " + f.app + " but its setting app is " + s.value);
  f.tables = list_of<sparse_table_spec>(doc, "tables", source, table_of);
  f.spec = job_spec::from_parts(version, std::move(settings), list_of<tensor_spec>(doc, "tensors", source, tensor_of));
  return f;
}

job_file read_job_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw bad_request("--job-file=" + path + ": cannot read it");
  std::stringstream text;
  text << in.rdbuf();
  return parse_job_file(text.str(), "--job-file=" + path);
}

void take_job_file(const job_file& file, node_config& cfg) {
  if (!cfg.app.empty() && cfg.app != file.app)
    throw bad_request("--app=" + cfg.app + " differs from the job file's app, " + file.app + ": give one of them");
  auto known = app_names();
  if (std::find(known.begin(), known.end(), file.app) != known.end()) {
    if (auto what = app_difference(file, cfg); !what.empty())
      throw bad_request("the job file's " + what + " differ from those of this program's app " + file.app +
                        ": describe the job with this program, or run the coordinator without --job-file");
  } else {
    app_definition declared;
    declared.name = file.app;
    declared.summary = "declared by a job file";
    declared.run = [app = file.app](worker_context&) -> std::string {
      throw bad_request("app " + app + " was declared by a job file: its workers run in its own program");
    };
    declared.default_rule = file.spec.get("ps.rule").value_or("sum");
    declared.default_consistency = file.spec.get("consistency").value_or("asp");
    declared.tensors = [tensors = file.spec.tensors()](const node_config&) { return tensors; };
    declared.tables = [tables = file.tables](const node_config&) { return tables; };
    register_app(std::move(declared));
  }
  cfg.app = file.app;
  adopt(cfg, file.spec);
  // A setting the coordinator's spec lacks is a flag of the app's own, which only its
  // program parses.
  auto spec = settings_for_app(cfg, cfg.app).spec;
  for (const auto& s : file.spec.settings())
    if (!spec.get(s.name))
      throw bad_request("the job file's setting " + s.name + "=" + s.value + " is a flag of app " + file.app +
                        "'s own, which this program does not know: start the coordinator with the app's program "
                        "(--role=coordinator)");
}

int run_describe_role(const node_config& cfg, const job_settings& settings) {
  std::printf("%s\n", job_file_json({cfg.app, settings.spec, settings.tables}).c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace ps
