// Adagrad: h += g*g; w -= lr*g/(sqrt(h)+eps).
#include <cmath>

#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

struct adagrad_tile {
  float* w;
  float* h;
  const float* g;
  float lr, eps;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    float* __restrict__ ww = w + b;
    float* __restrict__ hh = h + b;
    const float* __restrict__ gg = g + b;
    for (std::size_t i = 0; i < e - b; ++i) {
      hh[i] += gg[i] * gg[i];
      ww[i] -= lr * gg[i] / (sqrtf(hh[i]) + eps);
    }
  }
};

}  // namespace

void adagrad(float* w, float* h, const float* g, float lr, float eps, std::size_t n) {
  detail::for_each_tile(n, adagrad_tile{w, h, g, lr, eps});
}

}  // namespace ps::PS_KERNELS_NS
