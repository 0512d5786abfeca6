// float <-> IEEE binary16, round to nearest even, by integer arithmetic (no F16C or CUDA half
// intrinsics needed, identical on both backends). After F. Giesen's float_to_half_fast3_rtne
// and half_to_float (public domain).
#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

using detail::bits_float;
using detail::float_bits;

PS_HD inline std::uint16_t to_half(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = u & 0x80000000u;
  std::uint32_t a = u ^ sign;  // |f|
  std::uint32_t h;
  if (a >= 0x47800000u) {                  // |f| >= 2^16: Inf, or NaN (checked next)
    h = a > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (a < 0x38800000u) {            // below 2^-14: the half is subnormal or zero
    // Adding 0.5 lines the half's mantissa up with the float's low bits; the FPU rounds
    // to nearest even.
    float shifted = bits_float(a) + bits_float(0x3f000000u);
    h = float_bits(shifted) - 0x3f000000u;
  } else {                                 // normal half (or overflow to Inf by rounding)
    const std::uint32_t odd = (a >> 13) & 1u;
    a += 0xc8000fffu;                      // rebias exponent (15 - 127) << 23, plus 0xfff
    a += odd;
    h = a >> 13;
  }
  return static_cast<std::uint16_t>(h | (sign >> 16));
}

PS_HD inline float to_float(std::uint16_t hv) {
  const std::uint32_t h = hv;
  std::uint32_t o = (h & 0x7fffu) << 13;   // exponent and mantissa
  const std::uint32_t exp = o & 0x0f800000u;
  o += (127 - 15) << 23;                   // rebias
  if (exp == 0x0f800000u) {
    o += (128 - 16) << 23;                 // Inf or NaN
  } else if (exp == 0) {                   // zero or subnormal: renormalize
    o += 1u << 23;
    o = float_bits(bits_float(o) - bits_float(113u << 23));
  }
  return bits_float(o | ((h & 0x8000u) << 16));
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
