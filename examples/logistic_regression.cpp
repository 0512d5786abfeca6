// logistic_regression: workers train a logistic model of 20 features on data drawn from a
// true model, through the pipelined training stages (ps::run_training: the loader builds
// batch c + 1 and the pull of c + 1 leaves while batch c computes) under SSP, with SGD on
// the servers. Each worker then checks that the trained model's accuracy on held-out rows
// is within 0.01 of the true model's, and the process exits 0 only then. The binary has
// every role (ps::run_app): by default 2 servers and 2 workers as processes.
#include <actorps/actorps.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr std::size_t dim = 20, batch_rows = 64, iterations = 300, test_rows = 20000;

const std::vector<float>& true_weights() {
  static const std::vector<float> w = [] {
    std::mt19937_64 gen(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> v(dim);
    for (auto& x : v) x = normal(gen);
    return v;
  }();
  return w;
}

float margin(const std::vector<float>& w, const float* x) {
  float z = 0;
  for (std::size_t j = 0; j < dim; ++j) z += w[j] * x[j];
  return z;
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// Rows drawn from the true model: features N(0, 1), label 1 with probability sigmoid(w*.x).
ps::sample_batch draw(std::uint64_t seed, std::size_t rows) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  ps::sample_batch b{std::vector<float>(rows * dim), std::vector<float>(rows), rows};
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t j = 0; j < dim; ++j) b.x[r * dim + j] = normal(gen);
    b.y[r] = uniform(gen) < sigmoid(margin(true_weights(), &b.x[r * dim])) ? 1.0f : 0.0f;
  }
  return b;
}

float accuracy(const std::vector<float>& w, const ps::sample_batch& b) {
  std::size_t right = 0;
  for (std::size_t r = 0; r < b.n; ++r) right += (margin(w, &b.x[r * dim]) > 0) == (b.y[r] > 0.5f);
  return static_cast<float>(right) / static_cast<float>(b.n);
}

// The batch's mean log-loss and its gradient, which goes out whole once computed.
float loss_and_grad(const std::vector<float>& w, const ps::sample_batch& b, std::span<float> grad,
                    const std::function<void(ps::tensor_span)>& ready) {
  std::fill(grad.begin(), grad.end(), 0.0f);
  float loss = 0;
  for (std::size_t r = 0; r < b.n; ++r) {
    const float* x = &b.x[r * dim];
    float p = sigmoid(margin(w, x));
    float err = p - b.y[r];
    for (std::size_t j = 0; j < dim; ++j) grad[j] += err * x[j] / static_cast<float>(b.n);
    loss -= std::log(b.y[r] > 0.5f ? std::max(p, 1e-7f) : std::max(1.0f - p, 1e-7f));
  }
  ready({0, dim});
  return loss / static_cast<float>(b.n);
}

std::string train(ps::worker_context& ctx) {
  auto keys = ps::key_set::single({0, dim});
  if (ctx.id == 0) ctx.kv.init(keys, std::vector<float>(dim, 0.0f)).get();
  ctx.barrier();  // the weights exist before anyone pulls them
  ps::batch_loader loader(ctx.sys, [id = ctx.id](std::uint64_t c) { return draw(1000 * (c + 1) + id, batch_rows); });
  ps::training_plan plan;
  plan.num_params = dim;
  plan.iterations = iterations;
  plan.compute = loss_and_grad;
  auto stats = ps::run_training(ctx.kv, loader, plan);
  ctx.barrier();  // every worker's last push is in
  auto w = ctx.kv.pull(keys).get();
  ctx.barrier();  // nobody leaves while another still pulls
  auto test = draw(42, test_rows);
  float trained = accuracy(w, test), truth = accuracy(true_weights(), test);
  if (trained < truth - 0.01f)
    throw std::runtime_error("accuracy " + std::to_string(trained) + " is not within 0.01 of the true model's " +
                             std::to_string(truth));
  return nlohmann::json{{"worker", ctx.id}, {"accuracy", trained}, {"true_model_accuracy", truth},
                        {"iterations", stats.iterations}, {"last_loss", stats.last_loss}, {"right", true}}.dump();
}

}  // namespace

int main(int argc, char** argv) {
  return ps::run_app({"logistic_regression", "logistic regression, pipelined under SSP", train, "sgd", "ssp",
                      [](const ps::node_config&) { return std::vector<ps::tensor_spec>{{"w", {0, dim}, {dim}}}; },
                      {}},
                     argc, argv);
}
