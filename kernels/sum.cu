// Sum of N buffers (the aggregator's reduction and the "sum" update rule).
#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

using detail::tile;

// One pass over a tile: o = (((init ? x[0] : o) + x[.]) + x[.]) ..., G inputs, left to right.
template <int G, bool Init>
PS_HD void sum_pass(float* __restrict__ o, const float* const* x, std::size_t len) {
  const float* __restrict__ a = x[0];
  const float* __restrict__ b = G > 1 ? x[1] : x[0];
  const float* __restrict__ c = G > 2 ? x[2] : x[0];
  const float* __restrict__ d = G > 3 ? x[3] : x[0];
  for (std::size_t i = 0; i < len; ++i) {
    float v = Init ? a[i] : o[i] + a[i];
    if (G > 1) v += b[i];
    if (G > 2) v += c[i];
    if (G > 3) v += d[i];
    o[i] = v;
  }
}

template <bool Init>
PS_HD void sum_group(float* o, const float* const* x, std::size_t g, std::size_t len) {
  switch (g) {
    case 1: return sum_pass<1, Init>(o, x, len);
    case 2: return sum_pass<2, Init>(o, x, len);
    case 3: return sum_pass<3, Init>(o, x, len);
    default: return sum_pass<4, Init>(o, x, len);
  }
}

// One tile, in passes of up to 4 inputs; the tile of out stays in cache between passes.
// out may be in[0] (then the passes add into it), but no other input.
// (Non-temporal stores for a fresh output were tried: no gain on this VM.)
struct sum_tile {
  float* out;
  const float* const* in;
  std::size_t k;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    const float* x[4];
    const std::size_t start = in[0] == out ? 1 : 0;  // in place: out += in[1] + ...
    for (std::size_t j = start; j < k; j += 4) {
      const std::size_t g = k - j < 4 ? k - j : 4;
      for (std::size_t q = 0; q < g; ++q) x[q] = in[j + q] + b;
      if (j == 0)
        sum_group<true>(out + b, x, g, e - b);
      else
        sum_group<false>(out + b, x, g, e - b);
    }
  }
};

// For out aliasing an input other than in[0]: accumulate in a local array (registers on
// CUDA, L1 on the host), then store.
struct sum_tile_aliased {
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
  bool aliased = false;
  for (std::size_t j = 1; j < k; ++j) aliased = aliased || in[j] == out;
  if (aliased)
    detail::for_each_tile(n, sum_tile_aliased{out, detail::raw(ptrs), k});
  else
    detail::for_each_tile(n, sum_tile{out, detail::raw(ptrs), k});
}

void add(float* y, const float* x, std::size_t n) { detail::for_each_tile(n, add_tile{y, x}); }

}  // namespace ps::PS_KERNELS_NS
