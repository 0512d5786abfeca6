#pragma once
// Server-side update rules, as a table. A push carries a gradient g for a run of
// parameters w; the rule folds g into w (and the rule's optimizer state) element by
// element, so a tensor split into chunks is updated exactly as if it had arrived whole.
// sum, sgd, adagrad and adam are built in; an app adds its own with one register_rule call
// (or a static ps::rule_registration) in one file, with hyper-parameters of its own if it
// needs them, and the wire, the configuration and checkpoints carry the rule by its name
// (the wire and the job spec carry its hyper-parameters too).
#include <cstddef>
#include <string>
#include <vector>

namespace ps {

struct update_rule;

// A hyper-parameter of a rule's own, set with --ps.rule-params=NAME=VALUE,...
struct rule_param {
  std::string name;
  float fallback = 0;  // the value when not given
};

// One row of the table.
struct rule_def {
  std::string name;
  std::string formula;  // one line, for help texts and errors
  // Floats of optimizer state kept per parameter, given the rule's hyper-parameters.
  std::size_t (*state_slots)(const update_rule& r) = nullptr;
  // Folds n gradients into n parameters; state[k] points at slot k of the same n.
  void (*apply)(const update_rule& r, float* w, float* const* state, const float* g, std::size_t n) = nullptr;
  // Its own hyper-parameters (beyond lr, momentum, beta1, beta2, eps); apply reads them
  // with r.param(i), i their place here.
  std::vector<rule_param> params = {};
  // Throws bad_request naming a hyper-parameter out of range (nullptr: any value goes).
  void (*check)(const update_rule& r) = nullptr;
};

// Adds a rule; throws bad_request when the name is empty or taken, or a function is missing.
// Register before the job starts, in every process that holds shards (the same binary).
void register_rule(rule_def def);
// A rule's registration from a file's static initialisation:
//   static ps::rule_registration clipped{{"clipped_sgd", "...", slots, apply}};
struct rule_registration {
  explicit rule_registration(rule_def def) { register_rule(std::move(def)); }
};
// The registered rules' names, in registration order (the built-in ones first).
std::vector<std::string> rule_names();

// A registered rule, by name. Converts from its name and throws bad_request naming the
// unknown name and the known ones; compares by identity.
class rule_handle {
 public:
  rule_handle(const std::string& name);  // NOLINT: a rule is written by its name
  rule_handle(const char* name) : rule_handle(std::string(name)) {}  // NOLINT
  const std::string& name() const { return def_->name; }
  const rule_def& def() const { return *def_; }
  bool operator==(const rule_handle& other) const { return def_ == other.def_; }

 private:
  const rule_def* def_;
};

struct update_rule {
  rule_handle kind = "sum";
  float lr = 0.01f;
  float momentum = 0.0f;  // sgd
  float beta1 = 0.9f;     // adam
  float beta2 = 0.999f;   // adam
  float eps = 1e-8f;      // adagrad, adam
  // The rule's own hyper-parameters, in the order of its definition's params; empty: all
  // at their fallbacks.
  std::vector<float> params;

  // Throws bad_request when a parameter is out of range (lr <= 0, momentum outside [0,1), ...),
  // or the rule's own are not the ones it defines.
  void validate() const;

  // Hyper-parameter i of the rule's own (its fallback when none were set).
  float param(std::size_t i) const { return params.empty() ? kind.def().params.at(i).fallback : params.at(i); }
  // Sets the rule's own from "NAME=VALUE,..." (names in any order, the rest at their
  // fallbacks; "" sets none). Throws bad_request naming an unknown or repeated name (and
  // the known ones) or a value that is not a number.
  void set_params(const std::string& text);
  // "NAME=VALUE,..." for every one of the rule's own, in its order ("" for a rule without
  // any): what the job spec compares.
  std::string params_text() const;

  // Floats of optimizer state kept per parameter.
  std::size_t state_slots() const { return kind.def().state_slots(*this); }

  // The built-in rules:
  // sum:     w += g                                    (ps-lite's default server handle)
  // sgd:     v = momentum*v + g;  w -= lr*v
  // adagrad: h += g*g;            w -= lr*g/(sqrt(h)+eps)
  // adam:    t += 1; m = b1*m+(1-b1)*g; v = b2*v+(1-b2)*g*g;
  //          w -= lr*(m/(1-b1^t)) / (sqrt(v/(1-b2^t))+eps)   (t is kept per parameter)
  // state[k] points at slot k of the same n parameters.
  void apply(float* w, float* const* state, const float* g, std::size_t n) const {
    kind.def().apply(*this, w, state, g, n);
  }
};

// Checkpoints before format 5 named the rule by a number: the built-in rules in the order
// above. Throws bad_request for a number that named no rule.
std::string rule_name_of_code(unsigned code);

}  // namespace ps
