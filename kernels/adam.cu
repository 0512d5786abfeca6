// Adam with a per-parameter step count t:
//   t += 1; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
//   w -= lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps)
#include <cmath>

#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

struct adam_tile {
  float* w;
  float* m;
  float* v;
  float* t;
  const float* g;
  float lr, beta1, beta2, eps;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    for (std::size_t i = b; i < e; ++i) {
      t[i] += 1.0f;
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      float mhat = m[i] / (1 - powf(beta1, t[i]));
      float vhat = v[i] / (1 - powf(beta2, t[i]));
      w[i] -= lr * mhat / (sqrtf(vhat) + eps);
    }
  }
};

}  // namespace

void adam(float* w, float* m, float* v, float* t, const float* g, float lr, float beta1,
          float beta2, float eps, std::size_t n) {
  detail::for_each_tile(n, adam_tile{w, m, v, t, g, lr, beta1, beta2, eps});
}

}  // namespace ps::PS_KERNELS_NS
