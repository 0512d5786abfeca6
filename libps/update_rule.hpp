#pragma once
// Server-side update rules. A push carries a gradient g for a run of parameters w;
// the rule folds g into w (and the rule's optimizer state) element by element, so a
// tensor split into chunks is updated exactly as if it had arrived whole.
#include <cstddef>
#include <string>

namespace ps {

enum class rule_kind { sum, sgd, adagrad, adam };

struct update_rule {
  rule_kind kind = rule_kind::sum;
  float lr = 0.01f;
  float momentum = 0.0f;  // sgd
  float beta1 = 0.9f;     // adam
  float beta2 = 0.999f;   // adam
  float eps = 1e-8f;      // adagrad, adam

  // "sum" | "sgd" | "adagrad" | "adam"; throws bad_request naming the bad value.
  static rule_kind parse_kind(const std::string& name);
  static const char* name(rule_kind k);
  // Throws bad_request when a parameter is out of range (lr <= 0, momentum outside [0,1), ...).
  void validate() const;

  // Floats of optimizer state kept per parameter.
  std::size_t state_slots() const;

  // sum:     w += g                                    (ps-lite's default server handle)
  // sgd:     v = momentum*v + g;  w -= lr*v
  // adagrad: h += g*g;            w -= lr*g/(sqrt(h)+eps)
  // adam:    t += 1; m = b1*m+(1-b1)*g; v = b2*v+(1-b2)*g*g;
  //          w -= lr*(m/(1-b1^t)) / (sqrt(v/(1-b2^t))+eps)   (t is kept per parameter)
  // state[k] points at slot k of the same n parameters.
  void apply(float* w, float* const* state, const float* g, std::size_t n) const;
};

}  // namespace ps
