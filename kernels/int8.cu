// int8 quantization with one float scale per block of values (see api.inl for the contract).
#include <thrust/copy.h>
#include <thrust/reduce.h>

#include <cfloat>

#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

using detail::bits_float;
using detail::float_bits;

constexpr std::uint32_t abs_mask = 0x7fffffffu;
constexpr std::uint32_t inf_bits = 0x7f800000u;

// Rounds |r| < 2^22 to the nearest integer, ties to even, with the FPU's default rounding
// (no libm call, so the loop vectorizes).
PS_HD inline float round_even(float r) {
  const float magic = 12582912.0f;  // 1.5 * 2^23
  return (r + magic) - magic;
}

// Per block: the scale, and the count of non-finite values. The maximum is taken over the
// |x| bit patterns of finite values (integers, so the loop vectorizes without fast-math).
struct scale_block {
  const float* x;
  std::size_t n, block;
  float* scales;
  std::uint32_t* nonfinite;
  PS_HD void operator()(std::size_t blk) const {
    const std::size_t b = blk * block, e = b + block < n ? b + block : n;
    // Signed ints (|x| bits fit in 31): SSE2 has signed compares only.
    std::int32_t max_bits = 0, bad = 0;
    for (std::size_t i = b; i < e; ++i) {
      const auto a = static_cast<std::int32_t>(float_bits(x[i]) & abs_mask);
      const std::int32_t m = a < static_cast<std::int32_t>(inf_bits) ? a : 0;
      max_bits = m > max_bits ? m : max_bits;
      bad += a >= static_cast<std::int32_t>(inf_bits) ? 1 : 0;
    }
    const float maxabs = bits_float(static_cast<std::uint32_t>(max_bits));
    float s = maxabs / 127.0f;
    if (maxabs > 0 && s < FLT_MIN) s = FLT_MIN;
    scales[blk] = s;
    nonfinite[blk] = static_cast<std::uint32_t>(bad);
  }
};

struct quantize_block {
  const float* x;
  std::size_t n, block;
  const float* scales;
  std::int8_t* q;
  PS_HD void operator()(std::size_t blk) const {
    const std::size_t b = blk * block, e = b + block < n ? b + block : n;
    const float s = scales[blk];
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    for (std::size_t i = b; i < e; ++i) {
      const std::uint32_t u = float_bits(x[i]);
      const std::uint32_t keep = (u & abs_mask) < inf_bits ? 0xffffffffu : 0u;  // non-finite -> 0
      float r = bits_float(u & keep) * inv;
      r = r > 127.0f ? 127.0f : r;
      r = r < -127.0f ? -127.0f : r;
      q[i] = static_cast<std::int8_t>(static_cast<int>(round_even(r)));
    }
  }
};

struct dequantize_block {
  const std::int8_t* q;
  const float* scales;
  std::size_t n, block;
  float* out;
  bool add;
  PS_HD void operator()(std::size_t blk) const {
    const std::size_t b = blk * block, e = b + block < n ? b + block : n;
    const float s = scales[blk];
    for (std::size_t i = b; i < e; ++i) {
      float v = static_cast<float>(q[i]) * s;
      v = v > FLT_MAX ? FLT_MAX : v;
      v = v < -FLT_MAX ? -FLT_MAX : v;
      out[i] = add ? out[i] + v : v;
    }
  }
};

struct is_nonfinite {
  const float* x;
  PS_HD bool operator()(std::size_t i) const { return (float_bits(x[i]) & abs_mask) >= inf_bits; }
};

struct gather_value {
  const float* x;
  const std::uint32_t* idx;
  float* val;
  PS_HD void operator()(std::size_t j) const { val[j] = x[idx[j]]; }
};

}  // namespace

std::size_t int8_encode(const float* x, std::size_t n, std::size_t block, float* scales,
                        std::int8_t* q) {
  if (n == 0) return 0;
  const std::size_t blocks = (n + block - 1) / block;
  detail::temp_vector<std::uint32_t> bad(blocks);
  std::uint32_t* bad_ptr = detail::raw(bad);
  detail::for_each_index(blocks, scale_block{x, n, block, scales, bad_ptr}, block);
  detail::for_each_index(blocks, quantize_block{x, n, block, scales, q}, block);
  return detail::with_policy(blocks, [&](auto policy) {
    return thrust::reduce(policy, bad_ptr, bad_ptr + blocks, std::size_t{0});
  });
}

std::size_t int8_nonfinite(const float* x, std::size_t n, std::uint32_t* idx, float* val) {
  thrust::counting_iterator<std::uint32_t> first(0);
  auto last = detail::with_policy(n, [&](auto policy) {
    return thrust::copy_if(policy, first, first + n, idx, is_nonfinite{x});
  });
  const std::size_t count = static_cast<std::size_t>(last - idx);
  detail::for_each_index(count, gather_value{x, idx, val});
  return count;
}

void int8_decode(const std::int8_t* q, const float* scales, std::size_t n, std::size_t block,
                 float* out, bool add) {
  if (n == 0) return;
  const std::size_t blocks = (n + block - 1) / block;
  detail::for_each_index(blocks, dequantize_block{q, scales, n, block, out, add}, block);
}

}  // namespace ps::PS_KERNELS_NS
