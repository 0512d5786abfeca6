// Sum of N buffers (the aggregator's reduction and the "sum" update rule).
#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

using detail::tile;

// One tile: accumulate the inputs left to right in a local array (registers on CUDA, L1
// on the host), then store, so out may alias any input.
struct sum_tile {
  float* out;
  const float* const* in;
  std::size_t k;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    float acc[tile];
    const std::size_t len = e - b;
    const float* __restrict__ first = in[0] + b;
    for (std::size_t i = 0; i < len; ++i) acc[i] = first[i];
    for (std::size_t j = 1; j < k; ++j) {
      const float* __restrict__ x = in[j] + b;
      for (std::size_t i = 0; i < len; ++i) acc[i] += x[i];
    }
    float* __restrict__ o = out + b;
    for (std::size_t i = 0; i < len; ++i) o[i] = acc[i];
  }
};

struct add_tile {
  float* y;
  const float* x;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    float* __restrict__ yy = y + b;
    const float* __restrict__ xx = x + b;
    for (std::size_t i = 0; i < e - b; ++i) yy[i] += xx[i];
  }
};

struct fill_zero {
  float* x;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    for (std::size_t i = b; i < e; ++i) x[i] = 0.0f;
  }
};

}  // namespace

void sum_n(float* out, const float* const* in, std::size_t k, std::size_t n) {
  if (n == 0) return;
  if (k == 0) {
    detail::for_each_tile(n, fill_zero{out});
    return;
  }
  // The kernel reads the pointer array from the backend's memory.
  detail::temp_vector<const float*> ptrs(in, in + k);
  detail::for_each_tile(n, sum_tile{out, detail::raw(ptrs), k});
}

void add(float* y, const float* x, std::size_t n) { detail::for_each_tile(n, add_tile{y, x}); }

}  // namespace ps::PS_KERNELS_NS
