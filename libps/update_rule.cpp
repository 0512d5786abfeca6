#include "libps/update_rule.hpp"

#include <cmath>

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

void update_rule::apply(float* w, float* const* state, const float* g, std::size_t n) const {
  switch (kind) {
    case rule_kind::sum:
      for (std::size_t i = 0; i < n; ++i) w[i] += g[i];
      return;
    case rule_kind::sgd:
      if (momentum > 0) {
        float* v = state[0];
        for (std::size_t i = 0; i < n; ++i) {
          v[i] = momentum * v[i] + g[i];
          w[i] -= lr * v[i];
        }
      } else {
        for (std::size_t i = 0; i < n; ++i) w[i] -= lr * g[i];
      }
      return;
    case rule_kind::adagrad: {
      float* h = state[0];
      for (std::size_t i = 0; i < n; ++i) {
        h[i] += g[i] * g[i];
        w[i] -= lr * g[i] / (std::sqrt(h[i]) + eps);
      }
      return;
    }
    case rule_kind::adam: {
      float *m = state[0], *v = state[1], *t = state[2];
      for (std::size_t i = 0; i < n; ++i) {
        t[i] += 1.0f;
        m[i] = beta1 * m[i] + (1 - beta1) * g[i];
        v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
        float mhat = m[i] / (1 - std::pow(beta1, t[i]));
        float vhat = v[i] / (1 - std::pow(beta2, t[i]));
        w[i] -= lr * mhat / (std::sqrt(vhat) + eps);
      }
      return;
    }
  }
}

}  // namespace ps
