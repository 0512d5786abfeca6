// train_ctr's dense tower (apps/ctr/ctr_tower.hpp): gradients against finite differences,
// for the parameters and for the inputs (the embeddings' gradient).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "apps/ctr/ctr_tower.hpp"
#include "libps/keys/keys.hpp"

using namespace ps;

namespace {

struct tiny_batch {
  std::vector<float> x{0.5f, -1.0f, 2.0f, 0.1f, 1.5f, 0.3f, -0.7f, 0.9f, -0.2f};  // 3 samples x 3 inputs
  std::vector<float> labels{1, 0, 1};
};

}  // namespace

TEST_CASE("ctr_tower: parameter and input gradients match finite differences of the mean logistic loss") {
  ctr_tower tower(3, {4, 2});
  CHECK(tower.num_params() == 3 * 4 + 4 + 4 * 2 + 2 + 2 * 1 + 1);
  std::vector<float> params(tower.num_params());
  tower.init(params.data(), 5);
  for (std::size_t i = 0; i < params.size(); ++i) params[i] += 0.05f * static_cast<float>(i % 3);  // biases off 0
  tiny_batch b;
  auto host = host_tower(tower);
  std::vector<float> grad(tower.num_params()), dx(b.x.size()), scratch_g(grad.size()), scratch_x(dx.size());
  host->loss_and_grad(params.data(), b.x.data(), b.labels.data(), 3, grad.data(), dx.data());
  auto loss_at = [&](const std::vector<float>& p, const std::vector<float>& x) {
    return host->loss_and_grad(p.data(), x.data(), b.labels.data(), 3, scratch_g.data(), scratch_x.data());
  };
  const float h = 1e-3f;
  for (std::size_t i = 0; i < params.size(); ++i) {
    auto up = params, down = params;
    up[i] += h;
    down[i] -= h;
    double numeric = (loss_at(up, b.x) - loss_at(down, b.x)) / (2 * h);
    INFO("parameter " << i);
    CHECK(grad[i] == doctest::Approx(numeric).epsilon(1e-2).scale(1e-3));
  }
  for (std::size_t i = 0; i < b.x.size(); ++i) {
    auto up = b.x, down = b.x;
    up[i] += h;
    down[i] -= h;
    double numeric = (loss_at(params, up) - loss_at(params, down)) / (2 * h);
    INFO("input " << i);
    CHECK(dx[i] == doctest::Approx(numeric).epsilon(1e-2).scale(1e-3));
  }
}

TEST_CASE("ctr_tower: without hidden layers it is logistic regression; predictions are sigmoids of the logit") {
  ctr_tower lr(2, {});
  REQUIRE(lr.num_params() == 3);
  std::vector<float> params{1.0f, -2.0f, 0.5f};  // w, b
  std::vector<float> x{1.0f, 1.0f};
  auto host = host_tower(lr);
  CHECK(host->backend() == "host");
  double p = 0;
  host->predict(params.data(), x.data(), 1, &p);
  CHECK(p == doctest::Approx(1 / (1 + std::exp(0.5))));
  std::vector<float> grad(3), dx(2);
  float label = 1;
  double loss = host->loss_and_grad(params.data(), x.data(), &label, 1, grad.data(), dx.data());
  CHECK(loss == doctest::Approx(std::log(1 + std::exp(0.5))));
  CHECK(grad[2] == doctest::Approx(p - 1));         // d/db
  CHECK(dx[1] == doctest::Approx((p - 1) * -2.0));  // d/dx = (p - y) w
}

TEST_CASE("ctr_tower: zero inputs or a zero-width layer are refused; init depends on the seed only") {
  CHECK_THROWS_AS(ctr_tower(0, {4}), bad_request);
  CHECK_THROWS_AS(ctr_tower(3, {4, 0}), bad_request);
  ctr_tower t(5, {3});
  std::vector<float> a(t.num_params()), b(t.num_params()), c(t.num_params());
  t.init(a.data(), 9);
  t.init(b.data(), 9);
  t.init(c.data(), 10);
  CHECK(a == b);
  CHECK(a != c);
}
