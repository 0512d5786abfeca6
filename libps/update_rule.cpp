#include "libps/update_rule.hpp"

#include <cmath>

#include "kernels/kernels.hpp"
#include "libps/keys.hpp"

namespace ps {

rule_kind update_rule::parse_kind(const std::string& name) {
  if (name == "sum") return rule_kind::sum;
  if (name == "sgd") return rule_kind::sgd;
  if (name == "adagrad") return rule_kind::adagrad;
  if (name == "adam") return rule_kind::adam;
  throw bad_request("unknown update rule \"" + name + "\" (expected sum, sgd, adagrad or adam)");
}

const char* update_rule::name(rule_kind k) {
  switch (k) {
    case rule_kind::sum: return "sum";
    case rule_kind::sgd: return "sgd";
    case rule_kind::adagrad: return "adagrad";
    case rule_kind::adam: return "adam";
  }
  return "?";
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
}

std::size_t update_rule::state_slots() const {
  switch (kind) {
    case rule_kind::sum: return 0;
    case rule_kind::sgd: return momentum > 0 ? 1 : 0;
    case rule_kind::adagrad: return 1;
    case rule_kind::adam: return 3;
  }
  return 0;
}

// One implementation: the host kernels (kernels/sgd.cu, adagrad.cu, adam.cu, sum.cu).
void update_rule::apply(float* w, float* const* state, const float* g, std::size_t n) const {
  switch (kind) {
    case rule_kind::sum:
      kernels::add(w, g, n);
      return;
    case rule_kind::sgd:
      if (momentum > 0)
        kernels::sgd_momentum(w, state[0], g, lr, momentum, n);
      else
        kernels::sgd(w, g, lr, n);
      return;
    case rule_kind::adagrad:
      kernels::adagrad(w, state[0], g, lr, eps, n);
      return;
    case rule_kind::adam:
      kernels::adam(w, state[0], state[1], state[2], g, lr, beta1, beta2, eps, n);
      return;
  }
}

}  // namespace ps
