#pragma once
// Gradient compression on the wire, one tensor at a time: none, fp16, int8 (one scale per
// block of 256 values) and top-k with error feedback. Encoding and decoding run on the host
// kernels (kernels/kernels.hpp).
//
// Encoded form: a 24-byte header, then the body. Little-endian, host float layout.
//   u8 codec (0 none, 1 fp16, 2 int8, 3 topk) | u8 version (1) | u16 zero | u32 aux
//   | u64 n (values in the tensor) | u64 extra
//   none:  n floats                                     aux = 0, extra = 0
//   fp16:  n halves (u16)                               aux = 0, extra = 0
//   int8:  ceil(n/aux) float scales, n int8, zero padding to a multiple of 4,
//          then `extra` u32 indices (ascending) and `extra` floats: the non-finite values
//          (NaN, +-Inf), sent exactly; their int8 slot is 0.  aux = block size (256)
//   topk:  aux = k u32 indices (strictly ascending, < n), then k float values. extra = 0
//
// Error bounds (per element, finite x):
//   fp16: |x - x'| <= max(|x| * 2^-11, 2^-25) for |x| < 65520; |x| >= 65520 becomes +-Inf
//         (round to nearest even: 65504 is the largest half). NaN stays NaN, +-Inf stays +-Inf.
//   int8: |x - x'| <= scale * (0.5 + 2^-15), scale = (max finite |x| of its block) / 127.
//         NaN and +-Inf are carried exactly in a side list (so they reach the server as they
//         were, like fp16 and none do).
//   topk: the k = ceil(ratio * n) values of largest |x| are sent exactly; NaN ranks above
//         +-Inf, which rank above every finite value; ties go to the lower index.
// Error feedback (topk with a residual): g' = g + residual; send top-k of g';
// residual = g' - sent (sent entries become 0, the others keep g'), so over any number of
// steps, everything sent plus the residual equals the sum of the gradients (up to the
// rounding of g + residual; exact for integer-valued gradients).
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ps {

enum class codec_kind : std::uint8_t { none = 0, fp16 = 1, int8 = 2, topk = 3 };

struct codec {
  codec_kind kind = codec_kind::none;
  double topk_ratio = 0.01;  // topk: fraction of the values sent, in (0, 1]

  // Values a top-k encoding of n values sends: ceil(ratio * n), at least 1 when n > 0.
  std::size_t topk_k(std::size_t n) const;
  // Throws bad_request when topk_ratio is outside (0, 1].
  void validate() const;
};

// "none" | "fp16" | "int8" | "topk" | "topk:R" (R = ratio, default 0.01). Throws bad_request
// naming the bad value.
codec parse_codec(const std::string& spec);
// The form parse_codec reads: "int8", "topk:0.01".
std::string to_string(const codec& c);
const char* name(codec_kind k);

constexpr std::size_t codec_header_bytes = 24;
constexpr std::size_t int8_block_values = 256;

// Top-k error feedback state for one tensor, kept on the worker across pushes.
class topk_residual {
 public:
  // The values not sent yet (empty before the first encode).
  const std::vector<float>& values() const { return r_; }
  void clear() { r_.clear(); }

 private:
  friend void encode(const codec&, const float*, std::size_t, topk_residual*, std::vector<std::byte>&);
  std::vector<float> r_;
};

// Encodes n values into `out` (resized; reusing one buffer across pushes avoids page faults).
// For topk, `residual` (may be null: then the unsent part is dropped) is read and updated;
// it must be empty or hold n values. Other codecs ignore it. Throws bad_request on a bad codec,
// a residual of another size, or n >= 2^32 for int8/topk.
void encode(const codec& c, const float* g, std::size_t n, topk_residual* residual,
            std::vector<std::byte>& out);
std::vector<std::byte> encode(const codec& c, const float* g, std::size_t n,
                              topk_residual* residual = nullptr);

// Bytes an encoding of n values takes (int8: without non-finite values).
std::size_t encoded_size(const codec& c, std::size_t n);

// What a header says, after checking it and the total size against it.
struct encoded_info {
  codec_kind kind = codec_kind::none;
  std::uint64_t n = 0;
  std::uint32_t aux = 0;
  std::uint64_t extra = 0;
};
// Throws bad_request naming what is wrong (truncated, unknown codec or version, sizes that
// disagree with the header).
encoded_info inspect(std::span<const std::byte> data);

// out[0, n) = the decoded values; decode_add adds them to out instead (the server's sum).
// Throws bad_request when the data is malformed (see inspect; also top-k indices out of
// range or not ascending, int8 scales negative or non-finite, side-list entries out of range,
// not ascending or finite) or holds another number of values than n. On error, out is
// unchanged.
void decode(std::span<const std::byte> data, float* out, std::size_t n);
void decode_add(std::span<const std::byte> data, float* out, std::size_t n);

}  // namespace ps
