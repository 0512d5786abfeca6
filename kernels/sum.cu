// Sum of N buffers (the aggregator's reduction and the "sum" update rule).
#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

using detail::tile;

// Host: inputs read per pass over a tile (the tile of out stays in cache between passes).
constexpr std::size_t inputs_per_pass = 8;
// Host: every stream of a pass is prefetched this many floats (2 KiB) ahead, one cache line
// per 16 floats: the hardware prefetcher alone keeps too few lines in flight for 9 streams per
// core (bench_aggregate, block in place, N = 8: 72-78% of the limit before, 75-90% with this
// and one pass of 8 instead of passes of 4; BENCHMARKS.md, "Kernels, the local aggregator and codecs").
constexpr std::size_t prefetch_ahead = 512;
constexpr std::size_t line_floats = 16;

PS_HD inline void prefetch(const float* p, bool for_write) {
#ifndef __CUDA_ARCH__
  if (for_write)
    __builtin_prefetch(p, 1, 3);
  else
    __builtin_prefetch(p, 0, 3);
#else
  (void)p, (void)for_write;
#endif
}

// o[i] = (((Init ? x[0] : o + x[0]) + x[1]) + ...) for i < len: G inputs, left to right.
// `ahead` is how many floats of o and of each x exist from index 0 on (for the prefetch).
template <int G, bool Init>
PS_HD void sum_pass(float* __restrict__ o, const float* const* x, std::size_t len, std::size_t ahead) {
  const float* __restrict__ a = x[0];
  const float* __restrict__ b = G > 1 ? x[1] : x[0];
  const float* __restrict__ c = G > 2 ? x[2] : x[0];
  const float* __restrict__ d = G > 3 ? x[3] : x[0];
  const float* __restrict__ e = G > 4 ? x[4] : x[0];
  const float* __restrict__ f = G > 5 ? x[5] : x[0];
  const float* __restrict__ g = G > 6 ? x[6] : x[0];
  const float* __restrict__ h = G > 7 ? x[7] : x[0];
  std::size_t i = 0;
  while (i < len) {
    const std::size_t end = len - i < line_floats ? len : i + line_floats;
    if (tile > 1 && i + prefetch_ahead < ahead) {
      const std::size_t p = i + prefetch_ahead;
      prefetch(o + p, true);
      prefetch(a + p, false);
      if (G > 1) prefetch(b + p, false);
      if (G > 2) prefetch(c + p, false);
      if (G > 3) prefetch(d + p, false);
      if (G > 4) prefetch(e + p, false);
      if (G > 5) prefetch(f + p, false);
      if (G > 6) prefetch(g + p, false);
      if (G > 7) prefetch(h + p, false);
    }
    for (; i < end; ++i) {
      float v = Init ? a[i] : o[i] + a[i];
      if (G > 1) v += b[i];
      if (G > 2) v += c[i];
      if (G > 3) v += d[i];
      if (G > 4) v += e[i];
      if (G > 5) v += f[i];
      if (G > 6) v += g[i];
      if (G > 7) v += h[i];
      o[i] = v;
    }
  }
}

template <bool Init>
PS_HD void sum_group(float* o, const float* const* x, std::size_t g, std::size_t len, std::size_t ahead) {
  switch (g) {
    case 1: return sum_pass<1, Init>(o, x, len, ahead);
    case 2: return sum_pass<2, Init>(o, x, len, ahead);
    case 3: return sum_pass<3, Init>(o, x, len, ahead);
    case 4: return sum_pass<4, Init>(o, x, len, ahead);
    case 5: return sum_pass<5, Init>(o, x, len, ahead);
    case 6: return sum_pass<6, Init>(o, x, len, ahead);
    case 7: return sum_pass<7, Init>(o, x, len, ahead);
    default: return sum_pass<8, Init>(o, x, len, ahead);
  }
}

// One tile, in passes of up to inputs_per_pass inputs.
// out may be in[0] (then the passes add into it), but no other input.
// (Non-temporal stores for a fresh output were tried: no gain on this VM.)
struct sum_tile {
  float* out;
  const float* const* in;
  std::size_t k, n;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    const float* x[inputs_per_pass];
    const std::size_t start = in[0] == out ? 1 : 0;  // in place: out += in[1] + ...
    for (std::size_t j = start; j < k; j += inputs_per_pass) {
      const std::size_t g = k - j < inputs_per_pass ? k - j : inputs_per_pass;
      for (std::size_t q = 0; q < g; ++q) x[q] = in[j + q] + b;
      if (j == 0)
        sum_group<true>(out + b, x, g, e - b, n - b);
      else
        sum_group<false>(out + b, x, g, e - b, n - b);
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

// CUDA, up to inputs_per_pass inputs: the pointers travel in the functor (no device memory
// allocated and copied per call), and each thread reads all its inputs before it writes out,
// so out may be any of them.
struct sum_elem {
  float* out;
  const float* x[inputs_per_pass];
  std::size_t k;
  PS_HD void operator()(std::size_t i) const {
    float v = x[0][i];
    for (std::size_t j = 1; j < k; ++j) v += x[j][i];
    out[i] = v;
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
#ifdef __CUDACC__
  if (k <= inputs_per_pass) {
    sum_elem f{out, {}, k};
    for (std::size_t j = 0; j < k; ++j) f.x[j] = in[j];
    detail::for_each_index(n, f);
    return;
  }
#endif
  // The kernel reads the pointer array from the backend's memory.
  detail::temp_vector<const float*> ptrs(in, in + k);
  bool aliased = false;
  for (std::size_t j = 1; j < k; ++j) aliased = aliased || in[j] == out;
  if (aliased)
    detail::for_each_tile(n, sum_tile_aliased{out, detail::raw(ptrs), k});
  else
    detail::for_each_tile(n, sum_tile{out, detail::raw(ptrs), k, n});
}

void add(float* y, const float* x, std::size_t n) { detail::for_each_tile(n, add_tile{y, x}); }

}  // namespace ps::PS_KERNELS_NS
