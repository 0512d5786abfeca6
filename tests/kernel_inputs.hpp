#pragma once
// Inputs shared by the kernel tests of both builds (test_kernels, test_kernels_cuda).
#include <cstddef>
#include <random>
#include <vector>

namespace ps::test {

// Integer-valued gradients, different per device: sums are exact in any order.
inline float grad_value(std::size_t device, std::size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + device * 13) % 101) - 50);
}

// n normally distributed floats of standard deviation `scale`, the same for the same seed.
inline std::vector<float> random_floats(std::size_t n, float scale, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace ps::test
