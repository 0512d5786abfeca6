// train_ctr's --backend=cuda (docs/click-prediction.md): the CUDA tower against the host tower, and one job
// of a host worker and a CUDA worker. Exits 77 (ctest: skipped) where this build has no CUDA
// kernels or the machine no CUDA device; the refusals of bad --backend values run everywhere
// (test_cluster).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "apps/ctr_backend.hpp"
#include "libps/keys/keys.hpp"
#include "tests/program_output.hpp"

using namespace ps;
using test::last_json;
using test::shell;

namespace {

std::vector<float> normal_floats(std::size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

void check_close(const std::vector<float>& cuda, const std::vector<float>& host, const char* what) {
  REQUIRE(cuda.size() == host.size());
  for (std::size_t i = 0; i < host.size(); ++i) {
    if (std::fabs(cuda[i] - host[i]) <= 1e-4f * std::fabs(host[i]) + 1e-7f) continue;
    FAIL_CHECK(what << "[" << i << "]: CUDA " << cuda[i] << ", host " << host[i]);
    return;
  }
}

}  // namespace

TEST_CASE("the CUDA tower gives the host tower's loss, gradients and predictions") {
  ctr_tower shape(40, {16, 8});
  auto host = tower_on_backend("host", shape), cuda = tower_on_backend("cuda", shape);
  CHECK(cuda->backend() == "cuda");
  std::vector<float> params(shape.num_params());
  shape.init(params.data(), 3);
  for (std::size_t batch : {1ul, 300ul}) {
    INFO("batch " << batch);
    auto x = normal_floats(batch * 40, 1.0f, 4);
    std::vector<float> labels(batch);
    for (std::size_t s = 0; s < batch; ++s) labels[s] = static_cast<float>(s % 3 == 0);
    std::vector<float> hg(params.size()), cg(params.size()), hdx(x.size()), cdx(x.size());
    double hl = host->loss_and_grad(params.data(), x.data(), labels.data(), batch, hg.data(), hdx.data());
    double cl = cuda->loss_and_grad(params.data(), x.data(), labels.data(), batch, cg.data(), cdx.data());
    CHECK(cl == doctest::Approx(hl).epsilon(1e-6));
    check_close(cg, hg, "grad");
    check_close(cdx, hdx, "dx");
    std::vector<double> hp(batch), cp(batch);
    host->predict(params.data(), x.data(), batch, hp.data());
    cuda->predict(params.data(), x.data(), batch, cp.data());
    for (std::size_t s = 0; s < batch; ++s) CHECK(cp[s] == doctest::Approx(hp[s]).epsilon(1e-5));
  }
}

TEST_CASE("one job mixes a host worker and a CUDA worker and learns as an all-host job does") {
  std::filesystem::remove_all("ctr-mixed");
  REQUIRE(shell("bin/gen_ctr --out=ctr-mixed --train-rows=20000 --test-rows=4000 --vocabulary=300 --seed=2").first == 0);
  const std::string run = "bin/train_ctr --train=ctr-mixed/train.tsv --test=ctr-mixed/test.tsv --epochs=2 "
                          "--hidden=[16] --embedding-dim=4 --workers=2 --backend=";
  auto [host_rc, host_out] = shell(run + "host");
  INFO(host_out);
  REQUIRE(host_rc == 0);
  auto [mixed_rc, mixed_out] = shell(run + "host,cuda");
  INFO(mixed_out);
  REQUIRE(mixed_rc == 0);
  auto host_result = last_json(host_out), mixed = last_json(mixed_out);
  CHECK(host_result["backends"] == nlohmann::json::array({"host", "host"}));
  CHECK(mixed["backends"] == nlohmann::json::array({"host", "cuda"}));
  CHECK(mixed["status"] == "ok");
  CHECK(mixed["samples"] == 2 * 20000);
  // BSP and a fixed data order: the runs differ by rounding (FMA on the device, sum order).
  CHECK(mixed["test_auc"].get<double>() == doctest::Approx(host_result["test_auc"].get<double>()).epsilon(0.005));
  std::filesystem::remove_all("ctr-mixed");
}

int main(int argc, char** argv) {
  try {
    tower_on_backend("cuda", ctr_tower(1, {}));
  } catch (const bad_request& e) {
    std::printf("test_ctr_backends: skipped: %s\n", e.what());
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}
