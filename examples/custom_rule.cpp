// custom_rule: a server-side update rule of the app's own, FTRL-proximal (McMahan et al.,
// 2013), with its own hyper-parameters alpha, beta, l1, l2. The rule is registered in this
// binary, so every shard of the job (processes that are copies of it) applies it; the job
// spec carries its name and hyper-parameters, and a member without the rule or with other
// values is refused, naming them.
//   custom_rule                                    2 servers, 2 workers, the defaults below
//   custom_rule --ps.rule-params=alpha=0.2,l1=4    other hyper-parameters (the rest default)
// Each worker fits its own half of the weights to targets by pushing g = w - target for 40
// steps; then every worker checks all weights against the same FTRL run locally (1e-5),
// and that L1 made the small targets' weights exactly 0 (|target| < l1 / 40 stay there). Exits 0 only then.
#include <actorps/actorps.hpp>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr ps::key_type num_keys = 64;
constexpr int steps = 40;

// One coordinate: z and n are the rule's two state slots.
void ftrl_step(const ps::update_rule& r, float& w, float& z, float& n, float g) {
  const float alpha = r.param(0), beta = r.param(1), l1 = r.param(2), l2 = r.param(3);
  const float sigma = (std::sqrt(n + g * g) - std::sqrt(n)) / alpha;
  z += g - sigma * w;
  n += g * g;
  w = std::abs(z) <= l1 ? 0.0f : -(z - std::copysign(l1, z)) / ((beta + std::sqrt(n)) / alpha + l2);
}

void apply_ftrl(const ps::update_rule& r, float* w, float* const* state, const float* g, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) ftrl_step(r, w[i], state[0][i], state[1][i], g[i]);
}

std::size_t two_slots(const ps::update_rule&) { return 2; }

void check_ftrl(const ps::update_rule& r) {
  if (!(r.param(0) > 0)) throw ps::bad_request("ftrl: alpha must be > 0");
  for (std::size_t i = 1; i < 4; ++i)
    if (!(r.param(i) >= 0)) throw ps::bad_request("ftrl: beta, l1 and l2 must be >= 0");
}

const ps::rule_registration ftrl{{"ftrl", "FTRL-proximal: z += g - sigma*w; n += g*g; w from z, n", two_slots,
                                  apply_ftrl, {{"alpha", 0.1f}, {"beta", 1.0f}, {"l1", 3.0f}, {"l2", 0.01f}}, check_ftrl}};

// Targets from -2 to 2; the ones near 0 are where L1 should leave weights at exactly 0.
float target(ps::key_type k) { return -2.0f + 4.0f * static_cast<float>(k) / (num_keys - 1); }

std::string fit(ps::worker_context& ctx) {
  ps::update_rule rule;  // the job's rule, as the spec gave it to this worker
  rule.kind = "ftrl";
  rule.set_params(ctx.cfg.rule_params);
  const ps::key_type per = num_keys / ctx.num_workers, first = ctx.id * per;
  const ps::key_type last = ctx.id + 1 == ctx.num_workers ? num_keys : first + per;
  auto mine = ps::key_set::single({first, last});
  if (ctx.id == 0) ctx.kv.init(ps::key_set::single({0, num_keys}), std::vector<float>(num_keys, 0.0f)).get();
  ctx.barrier();
  for (int s = 0; s < steps; ++s) {
    auto w = ctx.kv.pull(mine).get();
    std::vector<float> g(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) g[i] = w[i] - target(first + i);
    ctx.kv.push(mine, g).get();  // acknowledged: applied before the next pull
  }
  ctx.barrier();  // every half is done
  auto got = ctx.kv.pull(ps::key_set::single({0, num_keys})).get();
  ctx.barrier();
  std::size_t zeros = 0;
  for (ps::key_type k = 0; k < num_keys; ++k) {
    float w = 0, z = 0, n = 0;
    for (int s = 0; s < steps; ++s) ftrl_step(rule, w, z, n, w - target(k));
    if (std::abs(got[k] - w) > 1e-5f)
      throw std::runtime_error("key " + std::to_string(k) + ": the shards hold " + std::to_string(got[k]) +
                               ", FTRL run here gives " + std::to_string(w));
    zeros += got[k] == 0.0f;
  }
  if (zeros == 0 || zeros == num_keys)
    throw std::runtime_error("L1 left " + std::to_string(zeros) + " of the weights at 0: expected some, not all");
  return nlohmann::json{{"worker", ctx.id}, {"rule", rule.kind.name() + " " + rule.params_text()}, {"zeros", zeros},
                        {"right", true}}
    .dump();
}

}  // namespace

int main(int argc, char** argv) {
  return ps::run_app({"custom_rule", "FTRL-proximal on the servers, checked against a local run", fit, "ftrl", "asp",
                      [](const ps::node_config&) { return std::vector<ps::tensor_spec>{{"w", {0, num_keys}, {num_keys}}}; },
                      {}},
                     argc, argv);
}
