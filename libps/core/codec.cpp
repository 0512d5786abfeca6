#include "libps/core/codec.hpp"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "kernels/kernels.hpp"
#include "libps/keys/keys.hpp"
#include "libps/observe/text.hpp"

namespace ps {

namespace {

constexpr std::uint8_t codec_version = 1;

std::size_t pad4(std::size_t x) { return (x + 3) & ~std::size_t{3}; }

std::size_t int8_body_bytes(std::size_t n, std::size_t block, std::size_t nonfinite) {
  const std::size_t blocks = (n + block - 1) / block;
  return blocks * sizeof(float) + pad4(n) + nonfinite * (sizeof(std::uint32_t) + sizeof(float));
}

std::size_t body_bytes(codec_kind k, std::size_t n, std::uint32_t aux, std::uint64_t extra) {
  switch (k) {
    case codec_kind::none: return n * sizeof(float);
    case codec_kind::fp16: return n * sizeof(std::uint16_t);
    case codec_kind::int8: return int8_body_bytes(n, aux, extra);
    case codec_kind::topk: return std::size_t{aux} * (sizeof(std::uint32_t) + sizeof(float));
  }
  return 0;
}

void write_header(std::byte* p, codec_kind k, std::uint32_t aux, std::uint64_t n, std::uint64_t extra) {
  const std::uint8_t head[4] = {static_cast<std::uint8_t>(k), codec_version, 0, 0};
  std::memcpy(p, head, 4);
  std::memcpy(p + 4, &aux, 4);
  std::memcpy(p + 8, &n, 8);
  std::memcpy(p + 16, &extra, 8);
}

void check_u32(const codec& c, std::size_t n) {
  if (n > std::numeric_limits<std::uint32_t>::max())
    throw bad_request(std::string("codec ") + name(c.kind) + ": a tensor of " + std::to_string(n) +
                      " values is too large (indices are 32-bit; split it)");
}

template <class T>
T* at(std::vector<std::byte>& out, std::size_t offset) {
  return reinterpret_cast<T*>(out.data() + offset);
}

// Body views of validated data; copies into aligned storage when the caller's bytes are not
// 4-byte aligned (a message payload may start anywhere).
struct aligned_view {
  std::vector<std::uint32_t> storage;
  const std::byte* p = nullptr;
  aligned_view(std::span<const std::byte> data) {
    if (reinterpret_cast<std::uintptr_t>(data.data()) % alignof(float) == 0) {
      p = data.data();
    } else {
      storage.resize((data.size() + 3) / 4);
      std::memcpy(storage.data(), data.data(), data.size());
      p = reinterpret_cast<const std::byte*>(storage.data());
    }
  }
  template <class T>
  const T* at(std::size_t offset) const {
    return reinterpret_cast<const T*>(p + offset);
  }
};

std::string index_text(std::size_t j) { return std::to_string(j); }

void check_indices(const std::uint32_t* idx, std::size_t count, std::size_t n, const char* what) {
  for (std::size_t j = 0; j < count; ++j) {
    if (idx[j] >= n)
      throw bad_request(std::string(what) + " entry " + index_text(j) + ": index " + std::to_string(idx[j]) +
                        " is out of range for " + std::to_string(n) + " values");
    if (j > 0 && idx[j] <= idx[j - 1])
      throw bad_request(std::string(what) + " entry " + index_text(j) + ": index " + std::to_string(idx[j]) +
                        " does not ascend (previous " + std::to_string(idx[j - 1]) + ")");
  }
}

void decode_impl(std::span<const std::byte> data, float* out, std::size_t n, bool add) {
  const encoded_info info = inspect(data);
  if (info.n != n)
    throw bad_request("encoded tensor holds " + std::to_string(info.n) + " values, expected " + std::to_string(n));
  const aligned_view v(data);
  const std::size_t h = codec_header_bytes;
  switch (info.kind) {
    case codec_kind::none:
      if (add)
        kernels::add(out, v.at<float>(h), n);
      else
        kernels::copy(out, v.at<float>(h), n);
      return;
    case codec_kind::fp16:
      if (add)
        kernels::fp16_decode_add(v.at<std::uint16_t>(h), out, n);
      else
        kernels::fp16_decode(v.at<std::uint16_t>(h), out, n);
      return;
    case codec_kind::int8: {
      const std::size_t block = info.aux, blocks = (n + block - 1) / block;
      const float* scales = v.at<float>(h);
      for (std::size_t b = 0; b < blocks; ++b)
        if (!(scales[b] >= 0) || !std::isfinite(scales[b]))
          throw bad_request("int8 data: scale of block " + std::to_string(b) + " is " + std::to_string(scales[b]) +
                            " (must be finite and >= 0)");
      const std::size_t side = h + blocks * sizeof(float) + pad4(n), m = info.extra;
      const auto* idx = v.at<std::uint32_t>(side);
      const float* val = v.at<float>(side + m * sizeof(std::uint32_t));
      check_indices(idx, m, n, "int8 non-finite list");
      for (std::size_t j = 0; j < m; ++j)
        if (std::isfinite(val[j]))
          throw bad_request("int8 non-finite list entry " + std::to_string(j) + ": value " + std::to_string(val[j]) +
                            " at index " + std::to_string(idx[j]) + " is finite");
      kernels::int8_decode(v.at<std::int8_t>(h + blocks * sizeof(float)), scales, n, block, out, add);
      kernels::scatter(out, idx, val, m, add);
      return;
    }
    case codec_kind::topk: {
      const std::size_t k = info.aux;
      const auto* idx = v.at<std::uint32_t>(h);
      const float* val = v.at<float>(h + k * sizeof(std::uint32_t));
      check_indices(idx, k, n, "top-k");
      if (!add && n > 0) std::memset(out, 0, n * sizeof(float));  // out may be null for n = 0
      kernels::scatter(out, idx, val, k, add);
      return;
    }
  }
}

}  // namespace

std::size_t codec::topk_k(std::size_t n) const {
  if (n == 0) return 0;
  auto k = static_cast<std::size_t>(std::ceil(topk_ratio * static_cast<double>(n)));
  return k < 1 ? 1 : (k > n ? n : k);
}

void codec::validate() const {
  if (kind == codec_kind::topk && !(topk_ratio > 0 && topk_ratio <= 1))
    throw bad_request("top-k ratio " + std::to_string(topk_ratio) + " is out of range (must be in (0, 1])");
}

codec parse_codec(const std::string& spec) {
  codec c;
  if (spec == "none") return c;
  if (spec == "fp16") return c.kind = codec_kind::fp16, c;
  if (spec == "int8") return c.kind = codec_kind::int8, c;
  if (spec == "topk" || spec.rfind("topk:", 0) == 0) {
    c.kind = codec_kind::topk;
    if (spec.size() > 4) {
      const std::string r = spec.substr(5);
      auto ratio = parse_number(r);
      if (!ratio) throw bad_request("codec \"" + spec + "\": top-k ratio \"" + r + "\" is not a number");
      c.topk_ratio = *ratio;
    }
    c.validate();
    return c;
  }
  throw bad_request("unknown codec \"" + spec + "\" (expected none, fp16, int8, topk or topk:RATIO)");
}

std::string to_string(const codec& c) {
  if (c.kind != codec_kind::topk) return name(c.kind);
  char buf[64];
  std::snprintf(buf, sizeof buf, "topk:%g", c.topk_ratio);
  return buf;
}

const char* name(codec_kind k) {
  switch (k) {
    case codec_kind::none: return "none";
    case codec_kind::fp16: return "fp16";
    case codec_kind::int8: return "int8";
    case codec_kind::topk: return "topk";
  }
  return "?";
}

std::size_t encoded_size(const codec& c, std::size_t n) {
  const std::uint32_t aux = c.kind == codec_kind::int8 ? int8_block_values
                            : c.kind == codec_kind::topk ? static_cast<std::uint32_t>(c.topk_k(n))
                                                         : 0;
  return codec_header_bytes + body_bytes(c.kind, n, aux, 0);
}

void encode(const codec& c, const float* g, std::size_t n, topk_residual* residual, std::vector<std::byte>& out) {
  c.validate();
  const std::size_t h = codec_header_bytes;
  switch (c.kind) {
    case codec_kind::none:
      out.resize(h + n * sizeof(float));
      write_header(out.data(), c.kind, 0, n, 0);
      kernels::copy(at<float>(out, h), g, n);
      return;
    case codec_kind::fp16:
      out.resize(h + n * sizeof(std::uint16_t));
      write_header(out.data(), c.kind, 0, n, 0);
      kernels::fp16_encode(g, at<std::uint16_t>(out, h), n);
      return;
    case codec_kind::int8: {
      check_u32(c, n);
      const std::size_t block = int8_block_values, blocks = (n + block - 1) / block;
      out.resize(h + int8_body_bytes(n, block, 0));
      const std::size_t m = kernels::int8_encode(g, n, block, at<float>(out, h), at<std::int8_t>(out, h + blocks * sizeof(float)));
      for (std::size_t i = h + blocks * sizeof(float) + n; i < h + blocks * sizeof(float) + pad4(n); ++i)
        out[i] = std::byte{0};
      if (m > 0) {
        const std::size_t side = h + blocks * sizeof(float) + pad4(n);
        out.resize(side + m * (sizeof(std::uint32_t) + sizeof(float)));
        kernels::int8_nonfinite(g, n, at<std::uint32_t>(out, side), at<float>(out, side + m * sizeof(std::uint32_t)));
      }
      write_header(out.data(), c.kind, static_cast<std::uint32_t>(block), n, m);
      return;
    }
    case codec_kind::topk: {
      check_u32(c, n);
      const std::size_t k = c.topk_k(n);
      const float* src = g;
      if (residual) {
        auto& r = residual->r_;
        if (r.empty()) r.assign(n, 0.0f);
        if (r.size() != n)
          throw bad_request("top-k residual holds " + std::to_string(r.size()) + " values, the tensor has " +
                            std::to_string(n) + " (one residual per tensor)");
        kernels::add(r.data(), g, n);  // g' = g + residual
        src = r.data();
      }
      out.resize(h + k * (sizeof(std::uint32_t) + sizeof(float)));
      auto* idx = at<std::uint32_t>(out, h);
      const std::size_t got = kernels::topk_select(src, n, k, idx, at<float>(out, h + k * sizeof(std::uint32_t)));
      (void)got;  // == k
      if (residual) kernels::scatter_zero(residual->r_.data(), idx, k);  // residual = g' - sent
      write_header(out.data(), c.kind, static_cast<std::uint32_t>(k), n, 0);
      return;
    }
  }
  throw bad_request("unknown codec id " + std::to_string(static_cast<int>(c.kind)));
}

std::vector<std::byte> encode(const codec& c, const float* g, std::size_t n, topk_residual* residual) {
  std::vector<std::byte> out;
  encode(c, g, n, residual, out);
  return out;
}

encoded_info inspect(std::span<const std::byte> data) {
  if (data.size() < codec_header_bytes)
    throw bad_request("encoded tensor truncated: " + std::to_string(data.size()) + " bytes, the header alone takes " +
                      std::to_string(codec_header_bytes));
  std::uint8_t head[4];
  std::memcpy(head, data.data(), 4);
  encoded_info info;
  std::memcpy(&info.aux, data.data() + 4, 4);
  std::memcpy(&info.n, data.data() + 8, 8);
  std::memcpy(&info.extra, data.data() + 16, 8);
  if (head[0] > static_cast<std::uint8_t>(codec_kind::topk))
    throw bad_request("encoded tensor: unknown codec id " + std::to_string(head[0]));
  info.kind = static_cast<codec_kind>(head[0]);
  const std::string what = std::string(name(info.kind)) + " data: ";
  if (head[1] != codec_version)
    throw bad_request(what + "unsupported version " + std::to_string(head[1]) + " (this build reads " +
                      std::to_string(codec_version) + ")");
  if (head[2] != 0 || head[3] != 0) throw bad_request(what + "reserved header bytes are not zero");
  // Bound n before any size arithmetic can overflow (a sparse top-k tensor may be far larger
  // than its bytes).
  if (info.n >= (std::uint64_t{1} << 48))
    throw bad_request(what + "header claims " + std::to_string(info.n) + " values (corrupt header?)");
  switch (info.kind) {
    case codec_kind::none:
    case codec_kind::fp16:
      if (info.aux != 0 || info.extra != 0) throw bad_request(what + "aux and extra header fields must be 0");
      break;
    case codec_kind::int8:
      if (info.aux == 0) throw bad_request(what + "block size 0");
      if (info.extra > info.n)
        throw bad_request(what + std::to_string(info.extra) + " non-finite values listed for " +
                          std::to_string(info.n) + " values");
      break;
    case codec_kind::topk:
      if (info.aux > info.n)
        throw bad_request(what + "k = " + std::to_string(info.aux) + " exceeds the " + std::to_string(info.n) +
                          " values");
      if (info.extra != 0) throw bad_request(what + "extra header field must be 0");
      break;
  }
  const std::size_t expected = codec_header_bytes + body_bytes(info.kind, info.n, info.aux, info.extra);
  if (data.size() != expected)
    throw bad_request(what + (data.size() < expected ? "truncated: " : "trailing bytes: ") +
                      std::to_string(data.size()) + " bytes, the header (" + std::to_string(info.n) +
                      " values) implies " + std::to_string(expected));
  return info;
}

void decode(std::span<const std::byte> data, float* out, std::size_t n) { decode_impl(data, out, n, false); }
void decode_add(std::span<const std::byte> data, float* out, std::size_t n) { decode_impl(data, out, n, true); }

}  // namespace ps
