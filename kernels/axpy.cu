// scale, axpy and copy.
#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

struct scale_tile {
  float* x;
  float a;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    float* __restrict__ xx = x + b;
    for (std::size_t i = 0; i < e - b; ++i) xx[i] *= a;
  }
};

struct axpy_tile {
  float* y;
  float a;
  const float* x;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    float* __restrict__ yy = y + b;
    const float* __restrict__ xx = x + b;
    for (std::size_t i = 0; i < e - b; ++i) yy[i] += a * xx[i];
  }
};

struct copy_tile {
  float* dst;
  const float* src;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    float* __restrict__ d = dst + b;
    const float* __restrict__ s = src + b;
    for (std::size_t i = 0; i < e - b; ++i) d[i] = s[i];
  }
};

}  // namespace

void scale(float* x, float a, std::size_t n) { detail::for_each_tile(n, scale_tile{x, a}); }
void axpy(float* y, float a, const float* x, std::size_t n) {
  detail::for_each_tile(n, axpy_tile{y, a, x});
}
void copy(float* dst, const float* src, std::size_t n) {
  detail::for_each_tile(n, copy_tile{dst, src});
}

}  // namespace ps::PS_KERNELS_NS
