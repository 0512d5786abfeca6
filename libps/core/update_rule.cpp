#include "libps/core/update_rule.hpp"

#include <charconv>
#include <cmath>
#include <deque>
#include <mutex>

#include "kernels/kernels.hpp"
#include "libps/keys/keys.hpp"
#include "libps/observe/text.hpp"

namespace ps {
namespace {

std::size_t no_slots(const update_rule&) { return 0; }
std::size_t one_slot(const update_rule&) { return 1; }
std::size_t momentum_slots(const update_rule& r) { return r.momentum > 0 ? 1 : 0; }
std::size_t adam_slots(const update_rule&) { return 3; }  // m, v and the step t

// One implementation each: the host kernels (kernels/sgd.cu, adagrad.cu, adam.cu, sum.cu).
void apply_sum(const update_rule&, float* w, float* const*, const float* g, std::size_t n) { kernels::add(w, g, n); }

void apply_sgd(const update_rule& r, float* w, float* const* state, const float* g, std::size_t n) {
  if (r.momentum > 0)
    kernels::sgd_momentum(w, state[0], g, r.lr, r.momentum, n);
  else
    kernels::sgd(w, g, r.lr, n);
}

void apply_adagrad(const update_rule& r, float* w, float* const* state, const float* g, std::size_t n) {
  kernels::adagrad(w, state[0], g, r.lr, r.eps, n);
}

void apply_adam(const update_rule& r, float* w, float* const* state, const float* g, std::size_t n) {
  kernels::adam(w, state[0], state[1], state[2], g, r.lr, r.beta1, r.beta2, r.eps, n);
}

// The table. A deque, so that the handles' pointers stay valid as rules are added; the
// built-in rules are in it before anyone can look (a function's static).
struct rule_table {
  std::mutex lock;
  std::deque<rule_def> rules{
    {"sum", "w += g", no_slots, apply_sum},
    {"sgd", "v = momentum*v + g; w -= lr*v", momentum_slots, apply_sgd},
    {"adagrad", "h += g*g; w -= lr*g/(sqrt(h)+eps)", one_slot, apply_adagrad},
    {"adam", "bias-corrected m and v; w -= lr*m^/(sqrt(v^)+eps)", adam_slots, apply_adam},
  };
};

rule_table& table() {
  static rule_table t;
  return t;
}

template <class Named>
std::string known_names(const Named& rows) {
  std::string out;
  for (const auto& r : rows) out += (out.empty() ? "" : ", ") + r.name;
  return out;
}

// The shortest text that reads back as the same float ("0.01", not 0.00999999977648258).
std::string shortest(float v) {
  char buf[32];
  auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

std::size_t param_index(const rule_def& def, const std::string& name) {
  for (std::size_t i = 0; i < def.params.size(); ++i)
    if (def.params[i].name == name) return i;
  throw bad_request("update rule " + def.name + " has no hyper-parameter \"" + name + "\"" +
                    (def.params.empty() ? " (it has none of its own)" : " (it has " + known_names(def.params) + ")"));
}

}  // namespace

void register_rule(rule_def def) {
  if (def.name.empty()) throw bad_request("register_rule: a rule needs a name");
  if (!def.state_slots || !def.apply)
    throw bad_request("register_rule: rule \"" + def.name + "\" needs state_slots and apply");
  auto& t = table();
  std::lock_guard guard(t.lock);
  for (const auto& r : t.rules)
    if (r.name == def.name) throw bad_request("register_rule: update rule \"" + def.name + "\" is registered already");
  t.rules.push_back(std::move(def));
}

std::vector<std::string> rule_names() {
  auto& t = table();
  std::lock_guard guard(t.lock);
  std::vector<std::string> out;
  for (const auto& r : t.rules) out.push_back(r.name);
  return out;
}

rule_handle::rule_handle(const std::string& name) {
  auto& t = table();
  std::lock_guard guard(t.lock);
  for (const auto& r : t.rules)
    if (r.name == name) {
      def_ = &r;
      return;
    }
  throw bad_request("unknown update rule \"" + name + "\" (expected " + known_names(t.rules) + ")");
}

void update_rule::validate() const {
  auto bad = [](const std::string& what, float v) {
    throw bad_request("update rule: " + what + " out of range: " + std::to_string(v));
  };
  if (!(lr > 0) || !std::isfinite(lr)) bad("lr (must be > 0)", lr);
  if (!(momentum >= 0 && momentum < 1)) bad("momentum (must be in [0, 1))", momentum);
  if (!(beta1 >= 0 && beta1 < 1)) bad("beta1 (must be in [0, 1))", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) bad("beta2 (must be in [0, 1))", beta2);
  if (!(eps > 0) || !std::isfinite(eps)) bad("eps (must be > 0)", eps);
  const auto& def = kind.def();
  if (!params.empty() && params.size() != def.params.size())
    throw bad_request("update rule " + def.name + ": " + std::to_string(params.size()) + " hyper-parameters given, it has " +
                      std::to_string(def.params.size()));
  for (std::size_t i = 0; i < params.size(); ++i)
    if (!std::isfinite(params[i])) bad(def.params[i].name + " (must be finite)", params[i]);
  if (def.check) def.check(*this);
}

void update_rule::set_params(const std::string& text) {
  const auto& def = kind.def();
  std::vector<float> values;
  for (const auto& p : def.params) values.push_back(p.fallback);
  std::vector<bool> seen(def.params.size(), false);
  for (const auto& item : split(text, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos)
      throw bad_request("update rule " + def.name + ": \"" + item + "\" is not NAME=VALUE in --ps.rule-params");
    auto i = param_index(def, item.substr(0, eq));
    if (seen[i]) throw bad_request("update rule " + def.name + ": " + def.params[i].name + " is given twice");
    auto v = parse_number(item.substr(eq + 1));
    if (!v) throw bad_request("update rule " + def.name + ": " + def.params[i].name + " = \"" + item.substr(eq + 1) +
                              "\" is not a number");
    values[i] = static_cast<float>(*v);
    seen[i] = true;
  }
  params = def.params.empty() ? std::vector<float>{} : std::move(values);
}

std::string update_rule::params_text() const {
  std::string out;
  const auto& def = kind.def();
  for (std::size_t i = 0; i < def.params.size(); ++i)
    out += (i ? "," : "") + def.params[i].name + "=" + shortest(param(i));
  return out;
}

std::string rule_name_of_code(unsigned code) {
  static const char* const built_in[] = {"sum", "sgd", "adagrad", "adam"};
  if (code >= std::size(built_in)) throw bad_request("unknown update rule code " + std::to_string(code));
  return built_in[code];
}

}  // namespace ps
