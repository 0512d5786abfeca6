// Kernels (host build), codecs, reduction plans and the local multi-device aggregator.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include "actors/gpu_aggregator.hpp"
#include "kernels/kernels.hpp"
#include "libps/core/codec.hpp"
#include "libps/keys/keys.hpp"
#include "actors/reduction_plan.hpp"
#include "tests/kernel_inputs.hpp"

using namespace ps;
using ps::test::grad_value;
using ps::test::random_floats;

namespace {

const float inf = std::numeric_limits<float>::infinity();
const float qnan = std::numeric_limits<float>::quiet_NaN();

}  // namespace

// ---- kernels ----------------------------------------------------------------------------

TEST_CASE("kernels: sum of N buffers, add, axpy, scale, copy") {
  for (std::size_t n : {0ul, 1ul, 7ul, 4095ul, 4097ul, 100003ul}) {
    // A host pass reads up to 8 inputs: 9, 12 and 17 take two or three passes.
    for (std::size_t k : {1ul, 2ul, 3ul, 8ul, 9ul, 12ul, 17ul}) {
      std::vector<std::vector<float>> in(k, std::vector<float>(n));
      std::vector<const float*> ptr;
      for (std::size_t j = 0; j < k; ++j) {
        for (std::size_t i = 0; i < n; ++i) in[j][i] = grad_value(j, i);
        ptr.push_back(in[j].data());
      }
      std::vector<float> out(n, -1.0f);
      kernels::sum_n(out.data(), ptr.data(), k, n);
      bool ok = true;
      for (std::size_t i = 0; i < n; ++i) {
        float ref = 0;
        for (std::size_t j = 0; j < k; ++j) ref += in[j][i];
        ok = ok && out[i] == ref;
      }
      INFO("n=" << n << " k=" << k);
      CHECK(ok);
      // out may be the first input (an in-place add) ...
      auto first = in;
      std::vector<const float*> first_ptr;
      for (auto& v : first) first_ptr.push_back(v.data());
      kernels::sum_n(first[0].data(), first_ptr.data(), k, n);
      CHECK(first[0] == out);
      // ... or another input (here the last one).
      kernels::sum_n(in[k - 1].data(), ptr.data(), k, n);
      CHECK(in[k - 1] == out);
    }
  }
  std::vector<float> y{1, 2, 3}, x{10, 20, 30};
  kernels::add(y.data(), x.data(), 3);
  CHECK(y == std::vector<float>{11, 22, 33});
  kernels::axpy(y.data(), -0.5f, x.data(), 3);
  CHECK(y == std::vector<float>{6, 12, 18});
  kernels::scale(y.data(), 0.5f, 3);
  CHECK(y == std::vector<float>{3, 6, 9});
  kernels::copy(y.data(), x.data(), 3);
  CHECK(y == x);
  std::vector<float> z(5, 3.0f);
  kernels::sum_n(z.data(), nullptr, 0, 5);  // no inputs: zeros
  CHECK(z == std::vector<float>(5, 0.0f));
}

TEST_CASE("kernels: large calls (OpenMP threads) equal small calls (calling thread)") {
  const std::size_t n = 1 << 20;  // above the serial grain
  auto g = random_floats(n, 1.0f, 1);
  auto w1 = random_floats(n, 1.0f, 2), w2 = w1;
  std::vector<float> m1(n), v1(n), t1(n), m2(n), v2(n), t2(n);
  kernels::adam(w1.data(), m1.data(), v1.data(), t1.data(), g.data(), 0.01f, 0.9f, 0.999f, 1e-8f, n);
  for (std::size_t b = 0; b < n; b += 1000) {
    std::size_t len = std::min<std::size_t>(1000, n - b);
    kernels::adam(w2.data() + b, m2.data() + b, v2.data() + b, t2.data() + b, g.data() + b, 0.01f, 0.9f,
                  0.999f, 1e-8f, len);
  }
  CHECK(std::memcmp(w1.data(), w2.data(), n * 4) == 0);
  CHECK(std::memcmp(v1.data(), v2.data(), n * 4) == 0);
}

namespace {

// A fully connected layer written the plain way, each sum in the order api.inl promises.
struct dense_reference {
  std::size_t batch, in, out;
  std::vector<float> forward(const std::vector<float>& w, const std::vector<float>& b, const std::vector<float>& x,
                             bool relu) const {
    std::vector<float> y(batch * out);
    for (std::size_t s = 0; s < batch; ++s)
      for (std::size_t o = 0; o < out; ++o) {
        float z = b[o];
        for (std::size_t i = 0; i < in; ++i) z += w[o * in + i] * x[s * in + i];
        y[s * out + o] = relu && z < 0 ? 0.0f : z;
      }
    return y;
  }
  std::vector<float> weight_grad(const std::vector<float>& dy, const std::vector<float>& x) const {
    std::vector<float> g(out * in + out, 0.0f);  // gw, then gb
    for (std::size_t s = 0; s < batch; ++s)
      for (std::size_t o = 0; o < out; ++o) {
        for (std::size_t i = 0; i < in; ++i) g[o * in + i] += dy[s * out + o] * x[s * in + i];
        g[out * in + o] += dy[s * out + o];
      }
    return g;
  }
  std::vector<float> input_grad(const std::vector<float>& dy, const std::vector<float>& w,
                                const std::vector<float>* mask) const {
    std::vector<float> dx(batch * in, 0.0f);
    for (std::size_t s = 0; s < batch; ++s)
      for (std::size_t o = 0; o < out; ++o)
        for (std::size_t i = 0; i < in; ++i) dx[s * in + i] += dy[s * out + o] * w[o * in + i];
    if (mask)
      for (std::size_t k = 0; k < dx.size(); ++k)
        if ((*mask)[k] <= 0) dx[k] = 0;
    return dx;
  }
};

}  // namespace

TEST_CASE("kernels: a dense layer's passes equal plain loops bit for bit, on the calling thread and on OpenMP") {
  // 3x5x2 stays below the serial grain; 300x429x64 (train_ctr's first layer) goes above it.
  for (auto [batch, in, out] : {std::array<std::size_t, 3>{3, 5, 2}, std::array<std::size_t, 3>{300, 429, 64}}) {
    INFO("batch " << batch << ", in " << in << ", out " << out);
    dense_reference ref{batch, in, out};
    const auto w = random_floats(out * in, 0.3f, 1), b = random_floats(out, 0.1f, 2);
    const auto x = random_floats(batch * in, 1.0f, 3), dy = random_floats(batch * out, 0.01f, 4);
    for (bool relu : {false, true}) {
      std::vector<float> y(batch * out);
      kernels::dense_forward(w.data(), b.data(), x.data(), y.data(), batch, in, out, relu);
      CHECK(y == ref.forward(w, b, x, relu));
    }
    std::vector<float> g(out * in + out, 7.0f);  // overwritten, not added to
    kernels::dense_weight_grad(dy.data(), x.data(), g.data(), g.data() + out * in, batch, in, out);
    CHECK(g == ref.weight_grad(dy, x));
    std::vector<float> dx(batch * in, 7.0f);
    kernels::dense_input_grad(dy.data(), w.data(), nullptr, dx.data(), batch, in, out);
    CHECK(dx == ref.input_grad(dy, w, nullptr));
    kernels::dense_input_grad(dy.data(), w.data(), x.data(), dx.data(), batch, in, out);  // x as a ReLU's output
    const auto masked = ref.input_grad(dy, w, &x);
    CHECK(dx == masked);
    CHECK(std::count(masked.begin(), masked.end(), 0.0f) > 0);
  }
}

TEST_CASE("kernels: the logistic loss and its gradient, without overflow at large logits") {
  std::vector<float> z{0.0f, 2.0f, -3.0f, 200.0f, -200.0f}, y{1, 0, 1, 0, 1}, delta(5);
  double loss = kernels::logistic_loss(z.data(), y.data(), delta.data(), 5);
  double expected = 0;
  for (std::size_t s = 0; s < 5; ++s) {
    double p = 1 / (1 + std::exp(-double(z[s])));
    CHECK(delta[s] == doctest::Approx((p - y[s]) / 5));
    expected += z[s] > 100 || z[s] < -100 ? std::fabs(double(z[s])) : std::log(1 + std::exp(double(z[s]))) - y[s] * z[s];
  }
  CHECK(std::isfinite(loss));
  CHECK(loss == doctest::Approx(expected / 5));
  CHECK(kernels::logistic_loss(nullptr, nullptr, nullptr, 0) == 0);
  // Above the serial grain the sum runs on OpenMP threads; its order changes only rounding.
  const std::size_t n = 1 << 16;
  auto big = random_floats(n, 2.0f, 5);
  std::vector<float> labels(n), d1(n), d2(n);
  for (std::size_t s = 0; s < n; ++s) labels[s] = static_cast<float>(s % 2);
  double whole = kernels::logistic_loss(big.data(), labels.data(), d1.data(), n);
  double halves = (kernels::logistic_loss(big.data(), labels.data(), d2.data(), n / 2) +
                   kernels::logistic_loss(big.data() + n / 2, labels.data() + n / 2, d2.data() + n / 2, n / 2)) / 2;
  CHECK(whole == doctest::Approx(halves).epsilon(1e-12));
}

TEST_CASE("kernels: update rules match hand-computed values") {
  float g[2] = {0.5f, -1.0f};
  SUBCASE("sgd") {
    float w[2] = {1, 2};
    kernels::sgd(w, g, 0.1f, 2);
    CHECK(w[0] == 1 - 0.1f * 0.5f);
    CHECK(w[1] == 2 + 0.1f);
  }
  SUBCASE("sgd momentum") {
    float w[2] = {1, 2}, v[2] = {1, 1};
    kernels::sgd_momentum(w, v, g, 0.1f, 0.5f, 2);  // v = 0.5 + g; w -= 0.1 v
    CHECK(v[0] == 1.0f);
    CHECK(v[1] == -0.5f);
    CHECK(w[0] == 1 - 0.1f * 1.0f);
    CHECK(w[1] == 2 - 0.1f * -0.5f);
  }
  SUBCASE("adagrad") {
    float w[2] = {1, 2}, h[2] = {0.75f, 0};
    kernels::adagrad(w, h, g, 0.1f, 1e-8f, 2);  // h = 1, 1
    CHECK(h[0] == 1.0f);
    CHECK(w[0] == doctest::Approx(1 - 0.05));
    CHECK(w[1] == doctest::Approx(2.1));
  }
  SUBCASE("adam, per-element step count") {
    float w[2] = {1, 2}, m[2] = {}, v[2] = {}, t[2] = {0, 5};
    kernels::adam(w, m, v, t, g, 0.01f, 0.9f, 0.999f, 1e-8f, 2);
    CHECK(t[0] == 1.0f);
    CHECK(t[1] == 6.0f);
    CHECK(w[0] == doctest::Approx(0.99));  // first step: lr * sign(g)
    // element 1 at t = 6 with zero history: mhat = 0.1 g / (1 - 0.9^6), vhat = 0.001 g^2 / (1 - 0.999^6)
    double mhat = 0.1 * -1.0 / (1 - std::pow(0.9, 6)), vhat = 0.001 / (1 - std::pow(0.999, 6));
    CHECK(w[1] == doctest::Approx(2 - 0.01 * mhat / (std::sqrt(vhat) + 1e-8)));
  }
}

TEST_CASE("kernels: top-k selects the largest |x|, lowest index on ties, in index order") {
  std::vector<float> x{1, -5, 3, -3, 0, 5, 2, -7};
  std::vector<std::uint32_t> idx(8);
  std::vector<float> val(8);
  REQUIRE(kernels::topk_select(x.data(), 8, 3, idx.data(), val.data()) == 3);
  CHECK(std::vector<std::uint32_t>(idx.begin(), idx.begin() + 3) == std::vector<std::uint32_t>{1, 5, 7});
  CHECK(std::vector<float>(val.begin(), val.begin() + 3) == std::vector<float>{-5, 5, -7});
  // Ties at the threshold: |3| twice, one of them taken: the lower index.
  REQUIRE(kernels::topk_select(x.data(), 8, 4, idx.data(), val.data()) == 4);
  CHECK(std::vector<std::uint32_t>(idx.begin(), idx.begin() + 4) == std::vector<std::uint32_t>{1, 2, 5, 7});
  // k >= n: everything.
  REQUIRE(kernels::topk_select(x.data(), 8, 20, idx.data(), val.data()) == 8);
  CHECK(val == x);
  // NaN above Inf above finite.
  std::vector<float> s{1, inf, 2, qnan, -inf, 3};
  REQUIRE(kernels::topk_select(s.data(), 6, 2, idx.data(), val.data()) == 2);
  CHECK(idx[0] == 1);
  CHECK(idx[1] == 3);
  CHECK(std::isnan(val[1]));
}

TEST_CASE("kernels: top-k on large inputs equals a sort-based reference") {
  for (std::size_t n : {100000ul, 1000003ul}) {
    for (double ratio : {0.001, 0.01, 0.3}) {
      auto x = random_floats(n, 1.0f, static_cast<unsigned>(n));
      // Many ties and zeros in part of it.
      for (std::size_t i = 0; i < n; i += 3) x[i] = std::round(x[i] * 4) / 4;
      for (std::size_t i = 0; i < n / 2; i += 5) x[i] = 0;
      const std::size_t k = static_cast<std::size_t>(ratio * static_cast<double>(n));
      std::vector<std::uint32_t> order(n);
      std::iota(order.begin(), order.end(), 0u);
      std::stable_sort(order.begin(), order.end(),
                       [&](std::uint32_t a, std::uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
      std::vector<std::uint32_t> ref(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
      std::sort(ref.begin(), ref.end());
      std::vector<std::uint32_t> idx(k);
      std::vector<float> val(k);
      REQUIRE(kernels::topk_select(x.data(), n, k, idx.data(), val.data()) == k);
      INFO("n=" << n << " ratio=" << ratio);
      CHECK(idx == ref);
      bool values = true;
      for (std::size_t j = 0; j < k; ++j) values = values && val[j] == x[idx[j]];
      CHECK(values);
    }
  }
  // All zeros: the threshold estimate finds nothing above zero.
  std::vector<float> zeros(200000, 0.0f);
  std::vector<std::uint32_t> idx(10);
  std::vector<float> val(10);
  REQUIRE(kernels::topk_select(zeros.data(), zeros.size(), 10, idx.data(), val.data()) == 10);
  for (std::uint32_t j = 0; j < 10; ++j) CHECK(idx[j] == j);
}

// ---- codecs -----------------------------------------------------------------------------

TEST_CASE("codec names parse and print") {
  CHECK(parse_codec("none").kind == codec_kind::none);
  CHECK(parse_codec("fp16").kind == codec_kind::fp16);
  CHECK(parse_codec("int8").kind == codec_kind::int8);
  CHECK(parse_codec("topk").topk_ratio == 0.01);
  CHECK(parse_codec("topk:0.25").topk_ratio == 0.25);
  CHECK(to_string(parse_codec("topk:0.25")) == "topk:0.25");
  CHECK_THROWS_WITH_AS(parse_codec("zip"), doctest::Contains("unknown codec \"zip\""), bad_request);
  CHECK_THROWS_WITH_AS(parse_codec("topk:abc"), doctest::Contains("\"abc\" is not a number"), bad_request);
  CHECK_THROWS_WITH_AS(parse_codec("topk:0"), doctest::Contains("out of range"), bad_request);
  CHECK_THROWS_WITH_AS(parse_codec("topk:1.5"), doctest::Contains("out of range"), bad_request);
  CHECK(parse_codec("topk:0.1").topk_k(15) == 2);
  CHECK(parse_codec("topk:0.0001").topk_k(15) == 1);
}

TEST_CASE("codec none and sizes on the wire") {
  std::vector<float> g{1.5f, -0.0f, qnan, inf, 1e-45f};
  auto e = encode(codec{}, g.data(), g.size());
  CHECK(e.size() == codec_header_bytes + 20);
  std::vector<float> back(5);
  decode(e, back.data(), 5);
  CHECK(std::memcmp(back.data(), g.data(), 20) == 0);  // bit-exact
  const std::size_t n = 1000003;
  CHECK(encoded_size(parse_codec("none"), n) == 24 + 4 * n);
  CHECK(encoded_size(parse_codec("fp16"), n) == 24 + 2 * n);
  CHECK(encoded_size(parse_codec("int8"), n) == 24 + 4 * 3907 + 1000004);
  CHECK(encoded_size(parse_codec("topk:0.01"), n) == 24 + 8 * 10001);
}

TEST_CASE("fp16: error bound, rounding to nearest even, specials") {
  const codec c = parse_codec("fp16");
  std::vector<float> g = random_floats(100003, 10.0f, 3);
  auto small = random_floats(1000, 1e-5f, 4);  // half subnormals
  g.insert(g.end(), small.begin(), small.end());
  for (float v : {65504.0f, 65519.0f, 65520.0f, 1e6f, -70000.0f, 6.1e-5f, 5.96e-8f, 2.9e-8f, 0.0f, -0.0f})
    g.push_back(v);
  auto e = encode(c, g.data(), g.size());
  CHECK(e.size() == 24 + 2 * g.size());
  std::vector<float> back(g.size());
  decode(e, back.data(), g.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    const float x = g[i];
    if (std::fabs(x) >= 65520.0f) {
      CHECK(back[i] == std::copysign(inf, x));
    } else {
      INFO("x=" << x << " decoded " << back[i]);
      REQUIRE(std::fabs(x - back[i]) <= std::max(std::fabs(x) * 0x1p-11f, 0x1p-25f));
    }
  }
  // Exactly representable values survive; a tie rounds to even.
  std::vector<float> exact{1.0f, -2.5f, 65504.0f, 0x1p-24f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f};
  auto e2 = encode(c, exact.data(), exact.size());
  std::vector<float> b2(exact.size());
  decode(e2, b2.data(), b2.size());
  CHECK(b2[0] == 1.0f);
  CHECK(b2[1] == -2.5f);
  CHECK(b2[2] == 65504.0f);
  CHECK(b2[3] == 0x1p-24f);           // smallest half subnormal
  CHECK(b2[4] == 1.0f);               // tie between 1 and 1+2^-10: even (1)
  CHECK(b2[5] == 1.0f + 0x1p-9f);     // tie between 1+2^-10 and 1+2^-9: even (1+2^-9)
  // NaN stays NaN (sign kept), Inf stays Inf.
  std::vector<float> sp{qnan, -qnan, inf, -inf};
  auto e3 = encode(c, sp.data(), 4);
  std::vector<float> b3(4);
  decode(e3, b3.data(), 4);
  CHECK(std::isnan(b3[0]));
  CHECK(std::isnan(b3[1]));
  CHECK(std::signbit(b3[1]));
  CHECK(b3[2] == inf);
  CHECK(b3[3] == -inf);
  // decode_add adds.
  std::vector<float> acc{1, 1, 1, 1};
  std::vector<float> two{2, 2, 2, 2};
  decode_add(encode(c, two.data(), 4), acc.data(), 4);
  CHECK(acc == std::vector<float>{3, 3, 3, 3});
}

TEST_CASE("int8: error within scale/2 per block, non-finite values carried exactly") {
  const codec c = parse_codec("int8");
  for (std::size_t n : {1ul, 7ul, 255ul, 256ul, 257ul, 100003ul}) {
    auto g = random_floats(n, 3.0f, static_cast<unsigned>(n));
    if (n > 600) {
      for (std::size_t i = 256; i < 512; ++i) g[i] *= 1e-30f;  // a tiny block
      for (std::size_t i = 512; i < 768; ++i) g[i] = 0.0f;     // a zero block
      g[800] = 3e38f;                                          // a huge value
    }
    auto e = encode(c, g.data(), n);
    const std::size_t blocks = (n + 255) / 256;
    CHECK(e.size() == 24 + 4 * blocks + ((n + 3) & ~std::size_t{3}));
    std::vector<float> back(n);
    decode(e, back.data(), n);
    for (std::size_t b = 0; b < blocks; ++b) {
      float maxabs = 0;
      for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i) maxabs = std::max(maxabs, std::fabs(g[i]));
      const float scale = std::max(maxabs / 127, maxabs > 0 ? FLT_MIN : 0.0f);
      for (std::size_t i = b * 256; i < std::min(n, b * 256 + 256); ++i) {
        INFO("n=" << n << " i=" << i << " x=" << g[i] << " decoded " << back[i] << " scale " << scale);
        REQUIRE(std::fabs(g[i] - back[i]) <= scale * (0.5f + 0x1p-15f));
      }
    }
  }
  // NaN and Inf: exact through the side list; the rest of their block keeps its bound.
  std::vector<float> g(600);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 50) - 25.0f;
  g[3] = qnan;
  g[300] = inf;
  g[301] = -inf;
  auto e = encode(c, g.data(), g.size());
  CHECK(e.size() == 24 + 4 * 3 + 600 + 3 * 8);
  std::vector<float> back(600, 1.0f);
  decode(e, back.data(), 600);
  CHECK(std::isnan(back[3]));
  CHECK(back[300] == inf);
  CHECK(back[301] == -inf);
  for (std::size_t i = 0; i < 600; ++i)
    if (std::isfinite(g[i])) CHECK(std::fabs(g[i] - back[i]) <= 25.0f / 127 * (0.5f + 0x1p-15f));
  // decode_add adds, non-finite values included.
  std::vector<float> acc(600, 1.0f);
  decode_add(e, acc.data(), 600);
  CHECK(acc[300] == inf);
  CHECK(std::isnan(acc[3]));
  CHECK(std::fabs(acc[10] - (1.0f + g[10])) <= 0.2f);
}

TEST_CASE("top-k with error feedback: everything sent plus the residual equals the sum of the gradients") {
  const std::size_t n = 10007, steps = 25;
  const codec c = parse_codec("topk:0.01");
  topk_residual residual;
  std::vector<double> truth(n, 0.0), sent(n, 0.0);
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> dist(-1000, 1000);
  std::vector<float> decoded(n);
  for (std::size_t s = 0; s < steps; ++s) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = static_cast<float>(dist(rng));
    for (std::size_t i = 0; i < n; ++i) truth[i] += g[i];
    auto e = encode(c, g.data(), n, &residual);
    CHECK(e.size() == 24 + 8 * c.topk_k(n));
    decode(e, decoded.data(), n);
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < n; ++i) {
      sent[i] += decoded[i];
      nonzero += decoded[i] != 0;
    }
    CHECK(nonzero <= c.topk_k(n));
  }
  REQUIRE(residual.values().size() == n);
  bool exact = true;
  for (std::size_t i = 0; i < n; ++i) exact = exact && sent[i] + residual.values()[i] == truth[i];
  CHECK(exact);
  // The residual belongs to one tensor.
  std::vector<float> other(5, 1.0f);
  CHECK_THROWS_WITH_AS(encode(c, other.data(), 5, &residual), doctest::Contains("residual holds 10007"), bad_request);
  // Without a residual the rest is dropped; decode_add adds the sent values.
  std::vector<float> g{0, 9, 0, -1}, acc{1, 1, 1, 1};
  decode_add(encode(parse_codec("topk:0.25"), g.data(), 4), acc.data(), 4);
  CHECK(acc == std::vector<float>{1, 10, 1, 1});
}

TEST_CASE("decode rejects malformed data, naming what is wrong, and leaves the output alone") {
  std::vector<float> g(300);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  std::vector<float> out(300, 42.0f);
  auto expect_bad = [&](std::vector<std::byte> data, std::size_t n, const char* text) {
    CHECK_THROWS_WITH_AS(decode(data, out.data(), n), doctest::Contains(text), bad_request);
    CHECK(out[0] == 42.0f);
  };
  auto fp16 = encode(parse_codec("fp16"), g.data(), 300);
  auto int8 = encode(parse_codec("int8"), g.data(), 300);
  auto topk = encode(parse_codec("topk:0.1"), g.data(), 300);
  expect_bad({}, 300, "truncated: 0 bytes");
  expect_bad(std::vector<std::byte>(fp16.begin(), fp16.end() - 1), 300, "fp16 data: truncated: 623 bytes");
  auto longer = fp16;
  longer.push_back(std::byte{0});
  expect_bad(longer, 300, "trailing bytes");
  expect_bad(fp16, 299, "holds 300 values, expected 299");
  auto bad_id = fp16;
  bad_id[0] = std::byte{9};
  expect_bad(bad_id, 300, "unknown codec id 9");
  auto bad_version = fp16;
  bad_version[1] = std::byte{2};
  expect_bad(bad_version, 300, "unsupported version 2");
  auto bad_scale = int8;
  const float minus = -1.0f;
  std::memcpy(bad_scale.data() + 24 + 4, &minus, 4);
  expect_bad(bad_scale, 300, "scale of block 1");
  auto bad_k = topk;
  std::uint32_t k = 301;
  std::memcpy(bad_k.data() + 4, &k, 4);
  expect_bad(bad_k, 300, "k = 301 exceeds");
  auto bad_index = topk;
  std::uint32_t big = 300;
  std::memcpy(bad_index.data() + 24 + 4 * 29, &big, 4);
  expect_bad(bad_index, 300, "top-k entry 29: index 300 is out of range");
  auto unsorted = topk;
  std::uint32_t first = 299;
  std::memcpy(unsorted.data() + 24, &first, 4);
  expect_bad(unsorted, 300, "top-k entry 1: index");
  auto huge = fp16;
  std::uint64_t n = std::uint64_t{1} << 60;
  std::memcpy(huge.data() + 8, &n, 8);
  expect_bad(huge, 300, "corrupt header");
  // Unaligned input (a payload may start anywhere) decodes the same.
  std::vector<std::byte> shifted(int8.size() + 1);
  std::memcpy(shifted.data() + 1, int8.data(), int8.size());
  std::vector<float> a(300), b(300);
  decode(int8, a.data(), 300);
  decode(std::span<const std::byte>(shifted).subspan(1), b.data(), 300);
  CHECK(a == b);
}

// ---- reduction plans (no threads) -------------------------------------------------------

TEST_CASE("block_range cuts [0, n) into near-equal contiguous blocks") {
  for (std::size_t n : {0ul, 1ul, 7ul, 8ul, 9ul, 1000003ul}) {
    for (std::size_t parts = 1; parts <= 8; ++parts) {
      std::size_t next = 0, lo = n, hi = 0;
      for (std::size_t b = 0; b < parts; ++b) {
        auto r = block_range(n, parts, b);
        CHECK(r.begin == next);
        next = r.end;
        lo = std::min(lo, r.size());
        hi = std::max(hi, r.size());
      }
      CHECK(next == n);
      CHECK(hi - lo <= 1);
    }
  }
}

namespace {

// Runs a plan on symbolic buffers: each (buffer, block) holds the set of devices whose
// gradient it contains (as a bit mask). Checks that a sum never counts a device twice, that
// a device writes only its own buffer or the host, and that no two ops of a phase conflict.
std::vector<std::vector<std::uint32_t>> simulate(const reduction_plan& p, bool broadcast) {
  const std::size_t n = p.devices;
  std::vector<std::vector<std::uint32_t>> held(n + 1, std::vector<std::uint32_t>(p.parts, 0));
  for (std::size_t d = 0; d < n; ++d)
    for (auto& b : held[d]) b = broadcast ? 0 : 1u << d;
  if (broadcast)
    for (auto& b : held[n]) b = 1u << 31;  // "the host's parameters"
  for (const auto& phase : p.phases) {
    std::set<std::pair<std::size_t, std::size_t>> written, read;
    auto next = held;
    for (const auto& op : phase) {
      REQUIRE((op.dst == op.device || op.dst == p.host()));
      REQUIRE(written.insert({op.dst, op.block}).second);
      std::uint32_t acc = 0;
      for (auto s : op.srcs) {
        const auto m = held[s][op.block];
        REQUIRE((acc & m) == 0);  // nothing counted twice
        acc |= m;
        if (s != op.dst) read.insert({s, op.block});
      }
      next[op.dst][op.block] = acc;
    }
    for (const auto& w : written) REQUIRE(read.count(w) == 0);  // no read of a block being written
    held = std::move(next);
  }
  return held;
}

}  // namespace

TEST_CASE("every plan reduces, all-reduces and broadcasts, for 1..8 devices") {
  for (auto how : {strategy::central, strategy::block, strategy::ring}) {
    for (std::size_t n = 1; n <= 8; ++n) {
      INFO(name(how) << " with " << n << " devices");
      const std::uint32_t all = (1u << n) - 1;
      auto r = simulate(make_plan(how, plan_goal::reduce, n), false);
      for (auto b : r[n]) CHECK(b == all);
      const auto in_place = make_plan(how, plan_goal::reduce_in_place, n);
      REQUIRE(in_place.result_owner.size() == in_place.parts);
      auto ip = simulate(in_place, false);
      for (std::size_t b = 0; b < in_place.parts; ++b) CHECK(ip[in_place.result_owner[b]][b] == all);
      for (const auto& phase : in_place.phases)
        for (const auto& op : phase) CHECK(op.dst != in_place.host());  // nothing beyond the devices
      auto a = simulate(make_plan(how, plan_goal::allreduce, n), false);
      for (std::size_t d = 0; d < n; ++d)
        for (auto b : a[d]) CHECK(b == all);
      auto c = simulate(make_plan(how, plan_goal::broadcast, n), true);
      for (std::size_t d = 0; d < n; ++d)
        for (auto b : c[d]) CHECK(b == 1u << 31);
    }
  }
  // The ring's steps: N-1 scatter-reduce and N-1 all-gather phases, neighbours only.
  auto ring = make_plan(strategy::ring, plan_goal::allreduce, 5);
  CHECK(ring.phases.size() == 8);
  for (const auto& phase : ring.phases)
    for (const auto& op : phase)
      for (auto s : op.srcs) CHECK((s == op.device || s == ring_left(op.device, 5)));
  CHECK(make_plan(strategy::block, plan_goal::reduce, 4).phases.size() == 1);
  // Bytes moved: block and central move the least a reduce can, (N+1)*n; the ring 3(N-1)*n.
  for (std::size_t n : {1000ul, 1003ul}) {
    // One device: the sum is already in place; a reduce copies it out.
    CHECK(plan_traffic(make_plan(strategy::block, plan_goal::reduce_in_place, 1), n) == 0);
    CHECK(plan_traffic(make_plan(strategy::central, plan_goal::reduce, 1), n) == 2 * n);
    for (std::size_t d = 2; d <= 8; ++d) {
      INFO(d << " devices, n=" << n);
      CHECK(plan_traffic(make_plan(strategy::block, plan_goal::reduce_in_place, d), n) == (d + 1) * n);
      CHECK(plan_traffic(make_plan(strategy::block, plan_goal::reduce, d), n) == (d + 1) * n);
      CHECK(plan_traffic(make_plan(strategy::central, plan_goal::reduce_in_place, d), n) == (d + 1) * n);
      CHECK(plan_traffic(make_plan(strategy::ring, plan_goal::reduce_in_place, d), n) == 3 * (d - 1) * n);
      // all-gather: every device copies the N-1 blocks it lacks (one read, one write each).
      CHECK(plan_traffic(make_plan(strategy::block, plan_goal::allreduce, d), n) == (d + 1) * n + 2 * (d - 1) * n);
    }
  }
  CHECK_THROWS_AS(make_plan(strategy::ring, plan_goal::reduce, 0), bad_request);
  CHECK(parse_strategy("ring") == strategy::ring);
  CHECK_THROWS_WITH_AS(parse_strategy("tree"), doctest::Contains("\"tree\""), bad_request);
}

// ---- the aggregator (threads) -----------------------------------------------------------

TEST_CASE("aggregator: every strategy equals the reference sum for 1..8 devices and uneven sizes") {
  for (auto how : {strategy::central, strategy::block, strategy::ring}) {
    for (std::size_t n : {1ul, 7ul, 1000003ul}) {
      for (std::size_t devices = 1; devices <= 8; ++devices) {
        if (n == 1000003 && devices % 3 != 1 && devices != 8) continue;  // 1, 4, 7, 8: keeps it quick
        INFO(name(how) << ", " << devices << " devices, " << n << " values");
        gpu_aggregator agg(devices, n, how);
        std::vector<float> ref(n, 0.0f);
        for (std::size_t d = 0; d < devices; ++d) {
          float* g = agg.gradient(d);
          for (std::size_t i = 0; i < n; ++i) ref[i] += g[i] = grad_value(d, i);
        }
        std::vector<float> out(n, -1.0f);
        agg.reduce(out.data());
        CHECK(out == ref);
        // In place: pieces in order, covering everything.
        for (std::size_t d = 0; d < devices; ++d)
          for (std::size_t i = 0; i < n; ++i) agg.gradient(d)[i] = grad_value(d, i);
        std::size_t next = 0;
        bool same = true;
        for (const auto& p : agg.reduce_in_place()) {
          CHECK(p.offset == next);
          next = p.offset + p.count;
          same = same && std::equal(p.data, p.data + p.count, ref.begin() + static_cast<std::ptrdiff_t>(p.offset));
        }
        CHECK(next == n);
        CHECK(same);
        // All-reduce: every device ends with the sum.
        for (std::size_t d = 0; d < devices; ++d)
          for (std::size_t i = 0; i < n; ++i) agg.gradient(d)[i] = grad_value(d, i);
        agg.allreduce();
        for (std::size_t d = 0; d < devices; ++d) CHECK(std::equal(ref.begin(), ref.end(), agg.gradient(d)));
        // Broadcast: every device gets the parameters.
        std::vector<float> params(n);
        for (std::size_t i = 0; i < n; ++i) params[i] = static_cast<float>(i % 1000) * 0.5f;
        agg.broadcast(params.data());
        for (std::size_t d = 0; d < devices; ++d) CHECK(std::equal(params.begin(), params.end(), agg.params(d)));
      }
    }
  }
}

TEST_CASE("aggregator: a sub-range reduce touches only that range") {
  gpu_aggregator agg(3, 100, strategy::ring);
  for (std::size_t d = 0; d < 3; ++d)
    for (std::size_t i = 0; i < 100; ++i) agg.gradient(d)[i] = grad_value(d, i);
  std::vector<float> out(17, 0.0f);
  agg.reduce(out.data(), 40, 17);
  for (std::size_t i = 0; i < 17; ++i) CHECK(out[i] == grad_value(0, 40 + i) + grad_value(1, 40 + i) + grad_value(2, 40 + i));
  CHECK_THROWS_WITH_AS(agg.reduce(out.data(), 90, 17), doctest::Contains("[90, 107) outside the 100"), bad_request);
  CHECK_THROWS_WITH_AS(agg.gradient(3), doctest::Contains("no device of rank 3"), bad_request);
}

TEST_CASE("aggregator: a device leaves, ranks move down, the ring is rebuilt") {
  for (auto how : {strategy::central, strategy::block, strategy::ring}) {
    const std::size_t n = 100003;
    gpu_aggregator agg(6, n, how);
    std::vector<std::size_t> original{0, 1, 2, 3, 4, 5};  // original id of each rank
    for (std::size_t leave : {2ul, 0ul, 3ul, 1ul, 0ul}) {
      agg.remove_device(leave);
      original.erase(original.begin() + static_cast<std::ptrdiff_t>(leave));
      REQUIRE(agg.devices() == original.size());
      std::vector<float> ref(n, 0.0f);
      for (std::size_t r = 0; r < agg.devices(); ++r)
        for (std::size_t i = 0; i < n; ++i) ref[i] += agg.gradient(r)[i] = grad_value(original[r], i);
      std::vector<float> out(n);
      agg.reduce(out.data());
      INFO(name(how) << " with " << agg.devices() << " devices left");
      CHECK(out == ref);
    }
    CHECK_THROWS_WITH_AS(agg.remove_device(0), doctest::Contains("last device"), bad_request);
    CHECK_THROWS_WITH_AS(agg.remove_device(4), doctest::Contains("cannot remove device 4 of 1"), bad_request);
  }
  CHECK_THROWS_AS(gpu_aggregator(0, 10, strategy::ring), bad_request);
}
