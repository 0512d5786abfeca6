// SGD, with and without momentum: v = momentum*v + g; w -= lr*v  (or w -= lr*g).
#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

struct sgd_tile {
  float* w;
  const float* g;
  float lr;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    float* __restrict__ ww = w + b;
    const float* __restrict__ gg = g + b;
    for (std::size_t i = 0; i < e - b; ++i) ww[i] -= lr * gg[i];
  }
};

struct momentum_tile {
  float* w;
  float* v;
  const float* g;
  float lr, momentum;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    float* __restrict__ ww = w + b;
    float* __restrict__ vv = v + b;
    const float* __restrict__ gg = g + b;
    for (std::size_t i = 0; i < e - b; ++i) {
      vv[i] = momentum * vv[i] + gg[i];
      ww[i] -= lr * vv[i];
    }
  }
};

}  // namespace

void sgd(float* w, const float* g, float lr, std::size_t n) {
  detail::for_each_tile(n, sgd_tile{w, g, lr});
}

void sgd_momentum(float* w, float* v, const float* g, float lr, float momentum, std::size_t n) {
  detail::for_each_tile(n, momentum_tile{w, v, g, lr, momentum});
}

}  // namespace ps::PS_KERNELS_NS
