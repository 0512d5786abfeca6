#pragma once
// Shared by every kernels/*.cu. Compiled as C++ with THRUST_DEVICE_SYSTEM=OMP (host build,
// namespace ps::kernels) or by nvcc (CUDA build, namespace ps::kernels_cuda).
#include <thrust/execution_policy.h>
#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#ifdef __CUDACC__
#include <thrust/device_vector.h>
#endif

#ifdef __CUDACC__
#define PS_HD __host__ __device__
#define PS_KERNELS_NS kernels_cuda
#include "kernels/kernels_cuda.hpp"
#else
#define PS_HD
#define PS_KERNELS_NS kernels
#include "kernels/kernels.hpp"
#endif

namespace ps::PS_KERNELS_NS::detail {

// Below this many loop iterations a host kernel runs on the calling thread: an OpenMP team
// costs microseconds, and the server calls the update rules on small chunks too.
constexpr std::size_t serial_grain = 1 << 15;

// f(i) for i in [0, n): Thrust's device system (OpenMP threads or CUDA threads), or the
// calling thread for small host calls. `per_index` is the number of elements one f(i) touches.
template <class F>
void for_each_index(std::size_t n, F f, [[maybe_unused]] std::size_t per_index = 1) {
  if (n == 0) return;
  thrust::counting_iterator<std::size_t> first(0);
#ifndef __CUDACC__
  if (n * per_index < serial_grain) {
    thrust::for_each_n(thrust::seq, first, n, f);
    return;
  }
#endif
  thrust::for_each_n(thrust::device, first, n, f);
}

// Runs f(policy) with Thrust's device system, or on the calling thread (thrust::seq) for host
// calls on fewer than serial_grain elements. Pass raw pointers: thrust::seq needs them.
template <class F>
auto with_policy(std::size_t n, F&& f) {
#ifndef __CUDACC__
  if (n < serial_grain) return f(thrust::seq);
#else
  (void)n;
#endif
  return f(thrust::device);
}

// Scratch storage in the backend's memory: host memory filled on the calling thread (no
// OpenMP team for a small buffer), or CUDA device memory.
#ifdef __CUDACC__
template <class T>
using temp_vector = thrust::device_vector<T>;
#else
template <class T>
using temp_vector = std::vector<T>;
#endif
template <class V>
auto raw(V& v) {
  return thrust::raw_pointer_cast(v.data());
}

// Host loops work on tiles so that the inner loop vectorizes; a CUDA thread takes one
// element (tile 1), so the same functor serves both.
#ifdef __CUDACC__
constexpr std::size_t tile = 1;
#else
constexpr std::size_t tile = 4096;  // 1024 and 16384 measured the same
#endif

// f(begin, end) for consecutive tiles of [0, n).
template <class F>
struct tiled {
  F f;
  std::size_t n;
  PS_HD void operator()(std::size_t t) const {
    std::size_t b = t * tile, e = b + tile < n ? b + tile : n;
    f(b, e);
  }
};
template <class F>
void for_each_tile(std::size_t n, F f) {
  for_each_index((n + tile - 1) / tile, tiled<F>{f, n}, tile);
}

PS_HD inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
PS_HD inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace ps::PS_KERNELS_NS::detail
