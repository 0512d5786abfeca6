// The CUDA build of the kernels (ps_kernels_cuda) against the host build (ps_kernels), on the
// first CUDA device. Built wherever CMake finds nvcc; exits 77 (ctest: skipped) when the
// machine has no CUDA device, as the development machines and CI have none.
// Exact where both builds round alike (sums of integer-valued floats, copies, fp16, top-k);
// within a few units in the last place where nvcc contracts a*b+c into one FMA (api.inl).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda_memory.hpp"
#include "kernels/kernels.hpp"
#include "kernels/kernels_cuda.hpp"
#include "tests/kernel_inputs.hpp"

namespace {

namespace host = ps::kernels;
namespace cuda = ps::kernels_cuda;
using ps::test::grad_value;
using ps::test::random_floats;

using ps::device_vector;

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Bit for bit, except that any NaN equals any NaN: arithmetic on a NaN gives the GPU's one
// canonical NaN where x86 keeps the operand's sign and payload (IEEE 754 leaves it open).
void check_same_values(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0 || (std::isnan(a[i]) && std::isnan(b[i]))) continue;
    FAIL_CHECK(what << "[" << i << "]: CUDA " << a[i] << ", host " << b[i]);
    return;
  }
}

// |a[i] - b[i]| <= rel * |b[i]| + abs for every i; reports the first index that is not.
void check_close(const std::vector<float>& a, const std::vector<float>& b, float rel, float abs, const char* what) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i] - b[i]) <= rel * std::fabs(b[i]) + abs) continue;
    INFO(what << "[" << i << "]: CUDA " << a[i] << ", host " << b[i]);
    CHECK(false);
    return;
  }
}

}  // namespace

TEST_CASE("cuda: sum of N buffers equals the host build (fresh, in place, aliased)") {
  for (std::size_t n : {1ul, 7ul, 4097ul, 100003ul}) {
    for (std::size_t k : {1ul, 2ul, 3ul, 8ul, 9ul, 17ul}) {
      INFO("n=" << n << " k=" << k);
      std::vector<std::vector<float>> in(k, std::vector<float>(n));
      std::vector<const float*> host_ptr;
      for (std::size_t j = 0; j < k; ++j) {
        for (std::size_t i = 0; i < n; ++i) in[j][i] = grad_value(j, i);
        host_ptr.push_back(in[j].data());
      }
      std::vector<float> ref(n);
      host::sum_n(ref.data(), host_ptr.data(), k, n);
      // Device copies of the inputs, and a host array of their device pointers.
      auto upload = [&](std::vector<std::unique_ptr<device_vector<float>>>& dev, std::vector<const float*>& ptr) {
        for (auto& v : in) {
          dev.push_back(std::make_unique<device_vector<float>>(v));
          ptr.push_back(dev.back()->get());
        }
      };
      std::vector<std::unique_ptr<device_vector<float>>> dev, dev2;
      std::vector<const float*> ptr, ptr2;
      upload(dev, ptr);
      upload(dev2, ptr2);
      device_vector<float> out(n);
      cuda::sum_n(out.get(), ptr.data(), k, n);
      CHECK(out.read() == ref);
      cuda::sum_n(dev[0]->get(), ptr.data(), k, n);  // in place: out is the first input
      CHECK(dev[0]->read() == ref);
      cuda::sum_n(dev2[k - 1]->get(), ptr2.data(), k, n);  // out is another input
      CHECK(dev2[k - 1]->read() == ref);
    }
  }
  device_vector<float> z(std::vector<float>(5, 3.0f));
  cuda::sum_n(z.get(), nullptr, 0, 5);  // no inputs: zeros
  CHECK(z.read() == std::vector<float>(5, 0.0f));
}

TEST_CASE("cuda: add, scale and copy are exact; axpy within one FMA rounding") {
  const std::size_t n = 100003;
  const auto x = random_floats(n, 1.0f, 1), y = random_floats(n, 1.0f, 2);
  device_vector<float> dx(x), dy(y);
  auto h = y;
  host::add(h.data(), x.data(), n);
  cuda::add(dy.get(), dx.get(), n);
  CHECK(same_bits(dy.read(), h));
  host::scale(h.data(), 0.37f, n);
  cuda::scale(dy.get(), 0.37f, n);
  CHECK(same_bits(dy.read(), h));
  const auto before = h;
  host::axpy(h.data(), -1.3f, x.data(), n);
  cuda::axpy(dy.get(), -1.3f, dx.get(), n);
  // A fused multiply-add skips the rounding of a*x, so the two differ by up to half an ulp
  // of a*x: a bound relative to the operands, not to a result that may have cancelled.
  const auto fused = dy.read();
  for (std::size_t i = 0; i < n; ++i) {
    if (std::fabs(fused[i] - h[i]) <= 0x1p-23f * (std::fabs(1.3f * x[i]) + std::fabs(before[i]))) continue;
    FAIL_CHECK("axpy[" << i << "]: CUDA " << fused[i] << ", host " << h[i]);
    break;
  }
  cuda::copy(dy.get(), dx.get(), n);
  CHECK(same_bits(dy.read(), x));
}

TEST_CASE("cuda: the update rules follow the host build over several steps") {
  const std::size_t n = 100003;
  const auto w0 = random_floats(n, 1.0f, 3);
  for (const char* rule : {"sgd", "sgd_momentum", "adagrad", "adam"}) {
    INFO(rule);
    auto w = w0;
    std::vector<float> a(n, 0.0f), b(n, 0.0f), t(n, 0.0f);
    device_vector<float> dw(w0), da(n), db(n), dt(n);
    for (unsigned step = 0; step < 3; ++step) {
      const auto g = random_floats(n, 0.1f, 10 + step);
      device_vector<float> dg(g);
      const std::string r = rule;
      if (r == "sgd") {
        host::sgd(w.data(), g.data(), 0.1f, n);
        cuda::sgd(dw.get(), dg.get(), 0.1f, n);
      } else if (r == "sgd_momentum") {
        host::sgd_momentum(w.data(), a.data(), g.data(), 0.1f, 0.9f, n);
        cuda::sgd_momentum(dw.get(), da.get(), dg.get(), 0.1f, 0.9f, n);
      } else if (r == "adagrad") {
        host::adagrad(w.data(), a.data(), g.data(), 0.1f, 1e-8f, n);
        cuda::adagrad(dw.get(), da.get(), dg.get(), 0.1f, 1e-8f, n);
      } else {
        host::adam(w.data(), a.data(), b.data(), t.data(), g.data(), 0.01f, 0.9f, 0.999f, 1e-8f, n);
        cuda::adam(dw.get(), da.get(), db.get(), dt.get(), dg.get(), 0.01f, 0.9f, 0.999f, 1e-8f, n);
      }
    }
    check_close(dw.read(), w, 1e-5f, 1e-6f, "w");
    check_close(da.read(), a, 1e-5f, 1e-7f, "first state");
    if (std::string(rule) == "adam") {
      check_close(db.read(), b, 1e-5f, 1e-9f, "second moment");
      CHECK(same_bits(dt.read(), t));
    }
  }
}

TEST_CASE("cuda: fp16 encodes bit for bit as the host build, specials included") {
  auto x = random_floats(100003, 10.0f, 4);
  auto small = random_floats(1000, 1e-5f, 5);  // half subnormals
  x.insert(x.end(), small.begin(), small.end());
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (float v : {65504.0f, 65519.0f, 65520.0f, 1e6f, -70000.0f, 6.1e-5f, 5.96e-8f, 2.9e-8f, 0.0f, -0.0f, inf, -inf,
                  nan, -nan})
    x.push_back(v);
  const std::size_t n = x.size();
  std::vector<std::uint16_t> h(n);
  host::fp16_encode(x.data(), h.data(), n);
  device_vector<float> dx(x);
  device_vector<std::uint16_t> dh(n);
  cuda::fp16_encode(dx.get(), dh.get(), n);
  CHECK(dh.read() == h);
  std::vector<float> back(n), acc(n, 1.0f);
  host::fp16_decode(h.data(), back.data(), n);
  host::fp16_decode_add(h.data(), acc.data(), n);
  device_vector<float> dback(n), dacc(std::vector<float>(n, 1.0f));
  cuda::fp16_decode(dh.get(), dback.get(), n);
  cuda::fp16_decode_add(dh.get(), dacc.get(), n);
  CHECK(same_bits(dback.read(), back));
  check_same_values(dacc.read(), acc, "decode_add");
}

TEST_CASE("cuda: int8 has the host build's scales, the stated error bound and the same non-finite list") {
  const std::size_t n = 100003, block = 256, blocks = (n + block - 1) / block;
  auto x = random_floats(n, 3.0f, 6);
  for (std::size_t i = 256; i < 512; ++i) x[i] *= 1e-30f;  // a tiny block
  for (std::size_t i = 512; i < 768; ++i) x[i] = 0.0f;     // a zero block
  x[800] = 3e38f;
  x[900] = std::numeric_limits<float>::quiet_NaN();
  x[901] = -std::numeric_limits<float>::infinity();
  std::vector<float> scales(blocks);
  std::vector<std::int8_t> q(n);
  const std::size_t bad = host::int8_encode(x.data(), n, block, scales.data(), q.data());
  device_vector<float> dx(x), dscales(blocks);
  device_vector<std::int8_t> dq(n);
  CHECK(cuda::int8_encode(dx.get(), n, block, dscales.get(), dq.get()) == bad);
  CHECK(same_bits(dscales.read(), scales));
  std::vector<std::uint32_t> idx(bad);
  std::vector<float> val(bad);
  host::int8_nonfinite(x.data(), n, idx.data(), val.data());
  device_vector<std::uint32_t> didx(bad);
  device_vector<float> dval(bad);
  CHECK(cuda::int8_nonfinite(dx.get(), n, didx.get(), dval.get()) == bad);
  CHECK(didx.read() == idx);
  CHECK(same_bits(dval.read(), val));
  device_vector<float> dout(n);
  cuda::int8_decode(dq.get(), dscales.get(), n, block, dout.get(), false);
  const auto out = dout.read();
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) continue;
    const float s = scales[i / block];
    INFO("i=" << i << " x=" << x[i] << " decoded " << out[i] << " scale " << s);
    REQUIRE(std::fabs(x[i] - out[i]) <= s * (0.5f + 0x1p-15f));
  }
}

TEST_CASE("cuda: top-k selects what the host build selects; scatters match") {
  for (std::size_t n : {100000ul, 1000003ul}) {
    for (double ratio : {0.001, 0.01, 0.3}) {
      INFO("n=" << n << " ratio=" << ratio);
      auto x = random_floats(n, 1.0f, static_cast<unsigned>(n));
      for (std::size_t i = 0; i < n; i += 3) x[i] = std::round(x[i] * 4) / 4;  // ties
      const std::size_t k = static_cast<std::size_t>(ratio * static_cast<double>(n));
      std::vector<std::uint32_t> idx(k);
      std::vector<float> val(k);
      REQUIRE(host::topk_select(x.data(), n, k, idx.data(), val.data()) == k);
      device_vector<float> dx(x), dval(k);
      device_vector<std::uint32_t> didx(k);
      REQUIRE(cuda::topk_select(dx.get(), n, k, didx.get(), dval.get()) == k);
      CHECK(didx.read() == idx);
      CHECK(same_bits(dval.read(), val));
      // scatter add, then zero the same entries: both builds alike.
      host::scatter(x.data(), idx.data(), val.data(), k, true);
      cuda::scatter(dx.get(), didx.get(), dval.get(), k, true);
      CHECK(same_bits(dx.read(), x));
      host::scatter_zero(x.data(), idx.data(), k);
      cuda::scatter_zero(dx.get(), didx.get(), k);
      CHECK(same_bits(dx.read(), x));
    }
  }
}

TEST_CASE("cuda: a dense layer's passes and the logistic loss follow the host build") {
  const std::size_t batch = 256, in = 429, out = 64;  // train_ctr's first layer
  const auto w = random_floats(out * in, 0.3f, 1), b = random_floats(out, 0.1f, 2);
  const auto x = random_floats(batch * in, 1.0f, 3), dy = random_floats(batch * out, 0.01f, 4);
  device_vector<float> dw(w), db(b), dxs(x), ddy(dy), dy_out(batch * out), dg(out * in + out), ddx(batch * in);
  std::vector<float> y(batch * out), g(out * in + out), dx(batch * in);
  host::dense_forward(w.data(), b.data(), x.data(), y.data(), batch, in, out, true);
  cuda::dense_forward(dw.get(), db.get(), dxs.get(), dy_out.get(), batch, in, out, true);
  check_close(dy_out.read(), y, 1e-5f, 1e-5f, "dense_forward");  // sums of 429 terms, FMA or not
  host::dense_weight_grad(dy.data(), x.data(), g.data(), g.data() + out * in, batch, in, out);
  cuda::dense_weight_grad(ddy.get(), dxs.get(), dg.get(), dg.get() + out * in, batch, in, out);
  check_close(dg.read(), g, 1e-5f, 1e-6f, "dense_weight_grad");
  host::dense_input_grad(dy.data(), w.data(), x.data(), dx.data(), batch, in, out);
  cuda::dense_input_grad(ddy.get(), dw.get(), dxs.get(), ddx.get(), batch, in, out);
  check_close(ddx.read(), dx, 1e-5f, 1e-6f, "dense_input_grad");
  std::vector<float> labels(batch), delta(batch);
  for (std::size_t s = 0; s < batch; ++s) labels[s] = static_cast<float>(s % 3 == 0);
  device_vector<float> dlabels(labels), ddelta(batch);
  const double host_loss = host::logistic_loss(y.data(), labels.data(), delta.data(), batch);
  const double cuda_loss = cuda::logistic_loss(dy_out.get(), dlabels.get(), ddelta.get(), batch);
  CHECK(cuda_loss == doctest::Approx(host_loss).epsilon(1e-6));
  check_close(ddelta.read(), delta, 1e-5f, 1e-9f, "logistic_loss delta");
}

int main(int argc, char** argv) {
  cudaDeviceProp prop{};
  std::string why_none;
  if (!ps::first_cuda_device(&prop, &why_none)) {
    std::printf("test_kernels_cuda: skipped: no CUDA device (%s)\n", why_none.c_str());
    return 77;
  }
  std::printf("test_kernels_cuda: on %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  doctest::Context context(argc, argv);
  return context.run();
}
