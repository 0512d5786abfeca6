// float <-> IEEE binary16, round to nearest even, by integer arithmetic (no F16C or CUDA half
// intrinsics needed, identical on both backends). After F. Giesen's float_to_half_fast3_rtne
// and half_to_float (public domain).
#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

using detail::bits_float;
using detail::float_bits;

// Branch-free (every case computed, one selected) so that the host loops vectorize.
PS_HD inline std::uint16_t to_half(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = u & 0x80000000u;
  const std::uint32_t a = u ^ sign;  // |f|
  // |f| >= 2^16: Inf, or NaN (quiet, payload dropped).
  const std::uint32_t special = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
  // |f| < 2^-14, a subnormal half or zero: adding 0.5 lines the half's mantissa up with the
  // float's low bits, and the FPU rounds to nearest even.
  const std::uint32_t sub = float_bits(bits_float(a) + 0.5f) - 0x3f000000u;
  // A normal half (or overflow to Inf by rounding): rebias the exponent by (15 - 127) << 23
  // and round to nearest even (0xfff plus the lowest kept bit).
  const std::uint32_t norm = (a + 0xc8000fffu + ((a >> 13) & 1u)) >> 13;
  const std::uint32_t h = a >= 0x47800000u ? special : (a < 0x38800000u ? sub : norm);
  return static_cast<std::uint16_t>(h | (sign >> 16));
}

PS_HD inline float to_float(std::uint16_t hv) {
  const std::uint32_t h = hv;
  const std::uint32_t o = ((h & 0x7fffu) << 13) + ((127 - 15) << 23);  // rebiased
  const std::uint32_t exp = (h & 0x7c00u) << 13;
  const std::uint32_t infnan = o + ((128 - 16) << 23);
  const std::uint32_t sub = float_bits(bits_float(o + (1u << 23)) - bits_float(113u << 23));  // renormalize
  const std::uint32_t r = exp == 0x0f800000u ? infnan : (exp == 0 ? sub : o);
  return bits_float(r | ((h & 0x8000u) << 16));
}

struct encode_tile {
  const float* x;
  std::uint16_t* h;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    for (std::size_t i = b; i < e; ++i) h[i] = to_half(x[i]);
  }
};

struct decode_tile {
  const std::uint16_t* h;
  float* x;
  bool add;
  PS_HD void operator()(std::size_t b, std::size_t e) const {
    if (add)
      for (std::size_t i = b; i < e; ++i) x[i] += to_float(h[i]);
    else
      for (std::size_t i = b; i < e; ++i) x[i] = to_float(h[i]);
  }
};

}  // namespace

void fp16_encode(const float* x, std::uint16_t* h, std::size_t n) {
  detail::for_each_tile(n, encode_tile{x, h});
}
void fp16_decode(const std::uint16_t* h, float* x, std::size_t n) {
  detail::for_each_tile(n, decode_tile{h, x, false});
}
void fp16_decode_add(const std::uint16_t* h, float* x, std::size_t n) {
  detail::for_each_tile(n, decode_tile{h, x, true});
}

}  // namespace ps::PS_KERNELS_NS
