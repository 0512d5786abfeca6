// A fully connected layer's forward and backward passes, and the logistic loss over logits:
// train_ctr's tower on either backend. A host index takes a whole output row (its inner
// loop runs along contiguous memory and vectorizes); a CUDA thread takes one element. Both
// add each sum's terms in the same order, so the backends differ only by FMA contraction.
#include <thrust/transform_reduce.h>

#include <cmath>

#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

#ifdef __CUDACC__
constexpr bool per_element = true;
#else
constexpr bool per_element = false;
#endif

// y[s][o] = b[o] + sum_i w[o][i] x[s][i], through max(0, .) when relu.
struct forward_index {
  const float *w, *b, *x;
  float* y;
  std::size_t in, out;
  bool relu;
  PS_HD void operator()(std::size_t k) const {
    std::size_t s = k / out, o = k % out;
    const float* row = w + o * in;
    const float* xs = x + s * in;
    float z = b[o];
    for (std::size_t i = 0; i < in; ++i) z += row[i] * xs[i];
    y[k] = relu && z < 0 ? 0.0f : z;
  }
};

// gw[o][i] = sum_s dy[s][o] x[s][i] and gb[o] = sum_s dy[s][o]. Index k < out * cols is
// row o = k / cols, all its columns (cols == 1) or column k % cols (cols == in); the last
// `out` indices are the biases.
struct weight_grad_index {
  const float *dy, *x;
  float *gw, *gb;
  std::size_t batch, in, out, cols;
  PS_HD void operator()(std::size_t k) const {
    if (k >= out * cols) {
      std::size_t o = k - out * cols;
      float sum = 0;
      for (std::size_t s = 0; s < batch; ++s) sum += dy[s * out + o];
      gb[o] = sum;
      return;
    }
    const std::size_t o = k / cols, i0 = cols == 1 ? 0 : k % cols, i1 = cols == 1 ? in : i0 + 1;
    float* __restrict__ g = gw + o * in;
    for (std::size_t i = i0; i < i1; ++i) g[i] = 0;
    for (std::size_t s = 0; s < batch; ++s) {
      const float d = dy[s * out + o];
      if (d == 0) continue;  // a ReLU that was off: half the rows of a hidden layer
      const float* __restrict__ xs = x + s * in;
      for (std::size_t i = i0; i < i1; ++i) g[i] += d * xs[i];
    }
  }
};

// dx[s][i] = sum_o dy[s][o] w[o][i], zero where mask[s][i] <= 0 (a ReLU's output) when mask
// is given; columns per index as for the weights.
struct input_grad_index {
  const float *dy, *w, *mask;
  float* dx;
  std::size_t in, out, cols;
  PS_HD void operator()(std::size_t k) const {
    const std::size_t s = k / cols, i0 = cols == 1 ? 0 : k % cols, i1 = cols == 1 ? in : i0 + 1;
    float* __restrict__ d = dx + s * in;
    for (std::size_t i = i0; i < i1; ++i) d[i] = 0;
    for (std::size_t o = 0; o < out; ++o) {
      const float g = dy[s * out + o];
      if (g == 0) continue;
      const float* __restrict__ row = w + o * in;
      for (std::size_t i = i0; i < i1; ++i) d[i] += g * row[i];
    }
    if (mask)
      for (std::size_t i = i0; i < i1; ++i)
        if (mask[s * in + i] <= 0) d[i] = 0;
  }
};

// delta[s] = (sigmoid(z[s]) - y[s]) / n; the sample's loss log(1 + e^z) - y z, without overflow.
struct logistic_index {
  const float *z, *y;
  float* delta;
  std::size_t n;
  PS_HD double operator()(std::size_t s) const {
    const double zs = z[s], p = 1 / (1 + exp(-zs));
    delta[s] = static_cast<float>((p - y[s]) / static_cast<double>(n));
    return (zs > 0 ? zs : 0.0) + log1p(exp(-fabs(zs))) - y[s] * zs;
  }
};

// Columns per output row an index takes: all of them on the host, one on CUDA.
std::size_t columns(std::size_t in) { return per_element ? in : 1; }

}  // namespace

void dense_forward(const float* w, const float* b, const float* x, float* y, std::size_t batch, std::size_t in,
                   std::size_t out, bool relu) {
  detail::for_each_index(batch * out, forward_index{w, b, x, y, in, out, relu}, in);
}

void dense_weight_grad(const float* dy, const float* x, float* gw, float* gb, std::size_t batch, std::size_t in,
                       std::size_t out) {
  const std::size_t cols = columns(in);
  detail::for_each_index(out * cols + out, weight_grad_index{dy, x, gw, gb, batch, in, out, cols}, batch * in / cols);
}

void dense_input_grad(const float* dy, const float* w, const float* mask, float* dx, std::size_t batch,
                      std::size_t in, std::size_t out) {
  const std::size_t cols = columns(in);
  detail::for_each_index(batch * cols, input_grad_index{dy, w, mask, dx, in, out, cols}, out * in / cols);
}

double logistic_loss(const float* logits, const float* labels, float* delta, std::size_t n) {
  if (n == 0) return 0;
  thrust::counting_iterator<std::size_t> first(0);
  double sum = detail::with_policy(n, [&](auto policy) {
    return thrust::transform_reduce(policy, first, first + n, logistic_index{logits, labels, delta, n}, 0.0,
                                    thrust::plus<double>());
  });
  return sum / static_cast<double>(n);
}

}  // namespace ps::PS_KERNELS_NS
