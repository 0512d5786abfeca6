#include "apps/fmnist_data.hpp"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>

namespace ps::fmnist {

// ---------------------------------------------------------------------------
// IDX loading
// ---------------------------------------------------------------------------
namespace {

constexpr uint32_t kImageMagic = 2051;  // 0x00000803: IDX3, unsigned byte
constexpr uint32_t kLabelMagic = 2049;  // 0x00000801: IDX1, unsigned byte

class gz_reader {
 public:
  explicit gz_reader(const std::string& path) : path_(path) {
    errno = 0;
    f_ = gzopen(path.c_str(), "rb");
    if (f_ == nullptr) {
      const int e = errno;
      fail(std::string("cannot open: ") + (e != 0 ? std::strerror(e) : "gzopen failed"));
    }
    gzbuffer(f_, 1u << 18);
  }
  ~gz_reader() {
    if (f_ != nullptr) gzclose(f_);
  }
  gz_reader(const gz_reader&) = delete;
  gz_reader& operator=(const gz_reader&) = delete;

  // Reads up to n bytes; returns how many were read (< n only at end of
  // data).  Throws on a corrupt or truncated gzip stream.
  std::size_t read(uint8_t* dst, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<std::size_t>(n - got, 1u << 30));
      const int r = gzread(f_, dst + got, chunk);
      if (r < 0) check_stream();
      if (r <= 0) break;
      got += static_cast<std::size_t>(r);
    }
    check_stream();
    return got;
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error(path_ + ": " + what);
  }

 private:
  void check_stream() {
    int err = Z_OK;
    const char* msg = gzerror(f_, &err);
    if (err == Z_OK) return;
    if (err == Z_BUF_ERROR) fail("truncated gzip stream (unexpected end of compressed data)");
    if (err == Z_ERRNO) fail(std::string("read error: ") + std::strerror(errno));
    fail(std::string("corrupt gzip data: ") + (msg != nullptr ? msg : "unknown zlib error"));
  }

  std::string path_;
  gzFile f_ = nullptr;
};

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

void check_magic(const gz_reader& in, uint32_t magic, uint32_t expected, const char* kind) {
  if (magic == expected) return;
  char buf[160];
  std::snprintf(buf, sizeof buf, "bad magic number 0x%08x (%u), expected 0x%08x (%u) for an %s file",
                magic, magic, expected, expected, kind);
  in.fail(buf);
}

void expect_end(gz_reader& in, std::size_t count, const char* what) {
  uint8_t extra = 0;
  if (in.read(&extra, 1) != 0)
    in.fail("unexpected trailing data after " + std::to_string(count) + " " + what);
}

// Returns the pixels of all images as floats in [0,1]; sets count.
std::vector<float> read_images(const std::string& path, std::size_t& count) {
  gz_reader in(path);
  uint8_t hdr[16];
  const std::size_t h = in.read(hdr, sizeof hdr);
  if (h >= 4) check_magic(in, be32(hdr), kImageMagic, "IDX3 image");
  if (h < sizeof hdr)
    in.fail("truncated header: expected 16 bytes, got " + std::to_string(h));
  const uint32_t n = be32(hdr + 4), rows = be32(hdr + 8), cols = be32(hdr + 12);
  if (uint64_t{rows} * cols != kFeatures)
    in.fail("unexpected image size " + std::to_string(rows) + "x" + std::to_string(cols) +
            ", expected 28x28");

  std::vector<float> images;
  if (n <= 200'000) images.reserve(std::size_t{n} * kFeatures);  // sane counts only
  constexpr std::size_t kChunkImages = 1024;
  std::vector<uint8_t> buf(kChunkImages * kFeatures);
  std::size_t done = 0;
  while (done < n) {
    const std::size_t want = std::min<std::size_t>(kChunkImages, n - done) * kFeatures;
    const std::size_t got = in.read(buf.data(), want);
    const std::size_t old = images.size();
    images.resize(old + got);
    for (std::size_t i = 0; i < got; ++i) images[old + i] = static_cast<float>(buf[i]) / 255.0f;
    if (got < want) {
      const std::size_t have = old + got;
      in.fail("truncated: expected " + std::to_string(n) + " images (" +
              std::to_string(std::size_t{n} * kFeatures) + " bytes of pixel data), got " +
              std::to_string(have / kFeatures) + " complete images (" + std::to_string(have) +
              " bytes)");
    }
    done += want / kFeatures;
  }
  expect_end(in, n, "images");
  count = n;
  return images;
}

std::vector<uint8_t> read_labels(const std::string& path) {
  gz_reader in(path);
  uint8_t hdr[8];
  const std::size_t h = in.read(hdr, sizeof hdr);
  if (h >= 4) check_magic(in, be32(hdr), kLabelMagic, "IDX1 label");
  if (h < sizeof hdr) in.fail("truncated header: expected 8 bytes, got " + std::to_string(h));
  const uint32_t n = be32(hdr + 4);

  std::vector<uint8_t> labels;
  constexpr std::size_t kChunk = 1u << 20;
  std::size_t got = 0;
  while (got < n) {  // grow as data arrives: an absurd header count cannot force a huge allocation
    const std::size_t want = std::min<std::size_t>(kChunk, n - got);
    labels.resize(got + want);
    const std::size_t r = in.read(labels.data() + got, want);
    got += r;
    if (r < want) break;
  }
  if (got < n)
    in.fail("truncated: expected " + std::to_string(n) + " labels, got " + std::to_string(got));
  expect_end(in, n, "labels");
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= kClasses)
      in.fail("label " + std::to_string(labels[i]) + " at index " + std::to_string(i) +
              " is out of range (expected 0..9)");
  return labels;
}

}  // namespace

dataset load_idx(const std::string& images_gz_path, const std::string& labels_gz_path) {
  dataset ds;
  ds.features = kFeatures;
  ds.images = read_images(images_gz_path, ds.count);
  ds.labels = read_labels(labels_gz_path);
  if (ds.labels.size() != ds.count)
    throw std::runtime_error(labels_gz_path + ": label count " + std::to_string(ds.labels.size()) +
                             " does not match image count " + std::to_string(ds.count) + " in " +
                             images_gz_path);
  return ds;
}

split load_default(const std::string& dir) {
  namespace fs = std::filesystem;
  static const char* kHint =
      "; install the Debian package `dataset-fashion-mnist` (apt-get install "
      "dataset-fashion-mnist) or pass the directory holding the Fashion-MNIST *-ubyte.gz files";
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::runtime_error("Fashion-MNIST directory " + dir + " not found" + kHint);
  auto file = [&](const char* name) {
    std::string p = (fs::path(dir) / name).string();
    if (!fs::exists(p, ec)) throw std::runtime_error("Fashion-MNIST file " + p + " not found" + kHint);
    return p;
  };
  // Check all four up front (in this order) before the slow part.
  const std::string train_images = file("train-images-idx3-ubyte.gz");
  const std::string train_labels = file("train-labels-idx1-ubyte.gz");
  const std::string test_images = file("t10k-images-idx3-ubyte.gz");
  const std::string test_labels = file("t10k-labels-idx1-ubyte.gz");
  split s;
  s.train = load_idx(train_images, train_labels);
  s.test = load_idx(test_images, test_labels);
  return s;
}

// ---------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------
namespace {

// Dot product with independent partial sums so that g++ vectorizes it at
// -O2/-O3 without -ffast-math.
inline float dot(const float* __restrict a, const float* __restrict b, std::size_t n) {
  float acc[16] = {};
  const std::size_t blocks = n / 16, rest = n % 16;
  for (std::size_t blk = 0; blk < blocks; ++blk, a += 16, b += 16)
#pragma GCC unroll 16
    for (std::size_t t = 0; t < 16; ++t) acc[t] += a[t] * b[t];
  float s = 0.0f;
  for (std::size_t t = 0; t < rest; ++t) s += a[t] * b[t];
  for (std::size_t t = 0; t < 8; ++t) acc[t] += acc[t + 8];
  for (std::size_t t = 0; t < 4; ++t) acc[t] += acc[t + 4];
  return s + ((acc[0] + acc[2]) + (acc[1] + acc[3]));
}

// y += a * x.  Fixed-length inner blocks so that -O2 (whose cost model will
// not vectorize a loop that needs a scalar epilogue) vectorizes it too.
inline void axpy(float a, const float* __restrict x, float* __restrict y, std::size_t n) {
  const std::size_t blocks = n / 16, rest = n % 16;
  for (std::size_t blk = 0; blk < blocks; ++blk, x += 16, y += 16)
#pragma GCC unroll 16
    for (std::size_t t = 0; t < 16; ++t) y[t] += a * x[t];
  for (std::size_t t = 0; t < rest; ++t) y[t] += a * x[t];
}

// Softmax cross-entropy of one row of logits.  Writes scale * (p - onehot(y))
// into d and returns the loss (numerically stable: max subtracted).
inline double xent(const float* z, uint8_t y, float* d, float scale) {
  float m = z[0];
  for (std::size_t k = 1; k < kClasses; ++k) m = std::max(m, z[k]);
  float e[kClasses];
  float s = 0.0f;
  for (std::size_t k = 0; k < kClasses; ++k) {
    e[k] = std::exp(z[k] - m);
    s += e[k];
  }
  const float inv = 1.0f / s;
  for (std::size_t k = 0; k < kClasses; ++k) d[k] = e[k] * inv * scale;
  d[y] -= scale;
  return std::log(static_cast<double>(s)) - static_cast<double>(z[y] - m);
}

inline uint8_t argmax(const float* z) {
  std::size_t best = 0;
  for (std::size_t k = 1; k < kClasses; ++k)
    if (z[k] > z[best]) best = k;
  return static_cast<uint8_t>(best);
}

void check_params(const std::vector<float>& params, std::size_t n, const char* name) {
  if (params.size() != n)
    throw std::invalid_argument(std::string(name) + ": params has " + std::to_string(params.size()) +
                                " entries, expected " + std::to_string(n));
}

void check_labels(const uint8_t* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i)
    if (y[i] >= kClasses)
      throw std::invalid_argument("label " + std::to_string(y[i]) + " at batch index " +
                                  std::to_string(i) + " is out of range (expected 0..9)");
}

}  // namespace

// The checks every model shares live here, once; models compute on checked input.
float model::loss_and_grad(const std::vector<float>& params, const float* x, const uint8_t* y,
                           std::size_t batch, std::vector<float>& grad, const grad_ready_fn& ready) const {
  check_params(params, num_params(), name());
  grad.resize(num_params());
  return loss_and_grad(params.data(), x, y, batch, grad.data(), ready);
}

float model::loss_and_grad(const float* params, const float* x, const uint8_t* y, std::size_t batch,
                           float* grad, const grad_ready_fn& ready) const {
  check_labels(y, batch);
  std::fill(grad, grad + num_params(), 0.0f);
  static const grad_ready_fn ignore = [](layer_span) {};
  if (batch == 0) {
    (ready ? ready : ignore)({0, num_params()});
    return 0.0f;
  }
  return compute_loss_and_grad(params, x, y, batch, grad, ready ? ready : ignore);
}

void model::predict(const std::vector<float>& params, const float* x, std::size_t n,
                    uint8_t* out) const {
  check_params(params, num_params(), name());
  compute_predict(params.data(), x, n, out);
}

namespace {

// Uniform in [-a, a) from the raw 64-bit output of mt19937_64 (the std
// distributions are implementation-defined; this is not).
inline float uniform_pm(std::mt19937_64& rng, double a) {
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // [0,1)
  return static_cast<float>((2.0 * u - 1.0) * a);
}

// ---- softmax regression: W [10][784], b [10] -------------------------------
class softmax_model final : public model {
 public:
  static constexpr std::size_t kW = kClasses * kFeatures;
  static constexpr std::size_t kN = kW + kClasses;

  std::size_t num_params() const override { return kN; }
  std::vector<layer_span> layers() const override { return {{0, kW}, {kW, kClasses}}; }
  void init(std::vector<float>& params, uint64_t) const override { params.assign(kN, 0.0f); }

  const char* name() const override { return "softmax"; }

 protected:
  float compute_loss_and_grad(const float* params, const float* x, const uint8_t* y,
                              std::size_t batch, float* grad, const grad_ready_fn& ready) const override {
    const float* W = params;
    const float* b = W + kW;
    float* gW = grad;
    float* gb = gW + kW;
    const float scale = 1.0f / static_cast<float>(batch);
    double loss = 0.0;
    float z[kClasses], d[kClasses];
    for (std::size_t i = 0; i < batch; ++i) {
      const float* xi = x + i * kFeatures;
      for (std::size_t k = 0; k < kClasses; ++k) z[k] = b[k] + dot(W + k * kFeatures, xi, kFeatures);
      loss += xent(z, y[i], d, scale);
      for (std::size_t k = 0; k < kClasses; ++k) {
        gb[k] += d[k];
        axpy(d[k], xi, gW + k * kFeatures, kFeatures);
      }
    }
    ready({0, kN});  // one pass produces both tensors
    return static_cast<float>(loss / static_cast<double>(batch));
  }

  void compute_predict(const float* params, const float* x, std::size_t n,
                       uint8_t* out) const override {
    const float* W = params;
    const float* b = W + kW;
    float z[kClasses];
    for (std::size_t i = 0; i < n; ++i) {
      const float* xi = x + i * kFeatures;
      for (std::size_t k = 0; k < kClasses; ++k) z[k] = b[k] + dot(W + k * kFeatures, xi, kFeatures);
      out[i] = argmax(z);
    }
  }
};

// ---- MLP: W1 [784][H], b1 [H], W2 [10][H], b2 [10] -------------------------

// out[0..T) += sum_p val[p] * M[idx[p] * ld + 0..T), with the T sums kept in
// registers over the whole list (T floats = T/4 SSE registers).
template <std::size_t T>
inline void gather_axpy(float* __restrict out, const uint32_t* __restrict idx,
                        const float* __restrict val, std::size_t cnt, const float* __restrict M,
                        std::size_t ld) {
  float acc[T];
#pragma GCC unroll 32
  for (std::size_t t = 0; t < T; ++t) acc[t] = out[t];
  for (std::size_t p = 0; p < cnt; ++p) {
    const float v = val[p];
    const float* m = M + std::size_t{idx[p]} * ld;
#pragma GCC unroll 32
    for (std::size_t t = 0; t < T; ++t) acc[t] += v * m[t];
  }
#pragma GCC unroll 32
  for (std::size_t t = 0; t < T; ++t) out[t] = acc[t];
}

// Same for a run-time width tn < T (the last, partial tile).
inline void gather_axpy_n(float* __restrict out, const uint32_t* __restrict idx,
                          const float* __restrict val, std::size_t cnt, const float* __restrict M,
                          std::size_t ld, std::size_t tn) {
  for (std::size_t p = 0; p < cnt; ++p) axpy(val[p], M + std::size_t{idx[p]} * ld, out, tn);
}

// Layer 1 exploits that Fashion-MNIST images are about half zeros: the
// non-zero pixels of a chunk of samples are listed once per sample (CSR, for
// the forward pass) and once per pixel (CSC, for the weight gradient), and
// both products run as register-blocked sparse x dense kernels over tiles of
// kTile hidden units:
//   forward:  Z1[i][tile]  += sum_{j: x_ij != 0} x_ij * W1[j][tile]
//   backward: gW1[j][tile] += sum_{i: x_ij != 0} x_ij * dZ1[i][tile]
class mlp_model final : public model {
 public:
  explicit mlp_model(std::size_t hidden)
      : H_(hidden),
        oW1_(0),
        ob1_(kFeatures * hidden),
        oW2_(ob1_ + hidden),
        ob2_(oW2_ + kClasses * hidden),
        n_(ob2_ + kClasses) {}

  std::size_t num_params() const override { return n_; }
  std::vector<layer_span> layers() const override {
    return {{oW1_, kFeatures * H_}, {ob1_, H_}, {oW2_, kClasses * H_}, {ob2_, kClasses}};
  }

  void init(std::vector<float>& params, uint64_t seed) const override {
    params.assign(n_, 0.0f);
    std::mt19937_64 rng(seed);
    const double a1 = std::sqrt(6.0 / static_cast<double>(kFeatures));      // He (ReLU)
    const double a2 = std::sqrt(6.0 / static_cast<double>(H_ + kClasses));  // Glorot
    for (std::size_t i = 0; i < kFeatures * H_; ++i) params[oW1_ + i] = uniform_pm(rng, a1);
    for (std::size_t i = 0; i < kClasses * H_; ++i) params[oW2_ + i] = uniform_pm(rng, a2);
  }

  const char* name() const override { return "mlp"; }

 protected:
  float compute_loss_and_grad(const float* params, const float* x, const uint8_t* y,
                              std::size_t batch, float* grad, const grad_ready_fn& ready) const override {
    const float* P = params;
    const float* W2 = P + oW2_;
    float* G = grad;
    float* gW1 = G + oW1_;
    float* gb1 = G + ob1_;
    float* gW2 = G + oW2_;
    float* gb2 = G + ob2_;
    const float scale = 1.0f / static_cast<float>(batch);
    scratch s;
    double loss = 0.0;
    for (std::size_t c0 = 0; c0 < batch; c0 += kChunk) {
      const std::size_t n = std::min(kChunk, batch - c0);
      forward(P, x + c0 * kFeatures, n, s);
      // Output layer and back-propagation to dZ1.
      float d[kClasses];
      for (std::size_t i = 0; i < n; ++i) {
        const float* a = &s.A[i * H_];
        float* dz = &s.dZ[i * H_];
        loss += xent(&s.logits[i * kClasses], y[c0 + i], d, scale);
        std::fill(dz, dz + H_, 0.0f);
        for (std::size_t k = 0; k < kClasses; ++k) {
          gb2[k] += d[k];
          axpy(d[k], a, gW2 + k * H_, H_);
          axpy(d[k], W2 + k * H_, dz, H_);
        }
        for (std::size_t h = 0; h < H_; ++h) {
          dz[h] = a[h] > 0.0f ? dz[h] : 0.0f;  // ReLU'
          gb1[h] += dz[h];
        }
      }
      // After the last chunk's output layer, b1, W2 and b2 (contiguous) are final.
      if (c0 + n == batch) ready({ob1_, n_ - ob1_});
      // gW1 over the non-zero pixels, pixel-major.
      for (std::size_t h0 = 0; h0 < H_; h0 += kTile) {
        const std::size_t tn = std::min(kTile, H_ - h0);
        for (std::size_t j = 0; j < kFeatures; ++j) {
          const uint32_t b = s.col_ptr[j], cnt = s.col_ptr[j + 1] - b;
          if (cnt == 0) continue;
          float* g = gW1 + j * H_ + h0;
          if (tn == kTile)
            gather_axpy<kTile>(g, &s.col_row[b], &s.col_val[b], cnt, &s.dZ[h0], H_);
          else
            gather_axpy_n(g, &s.col_row[b], &s.col_val[b], cnt, &s.dZ[h0], H_, tn);
        }
      }
    }
    ready({oW1_, ob1_ - oW1_});
    return static_cast<float>(loss / static_cast<double>(batch));
  }

  void compute_predict(const float* params, const float* x, std::size_t n,
                       uint8_t* out) const override {
    scratch s;
    for (std::size_t c0 = 0; c0 < n; c0 += kChunk) {
      const std::size_t m = std::min(kChunk, n - c0);
      forward(params, x + c0 * kFeatures, m, s);
      for (std::size_t i = 0; i < m; ++i) out[c0 + i] = argmax(&s.logits[i * kClasses]);
    }
  }

 private:
  static constexpr std::size_t kChunk = 64;  // samples per pass
  static constexpr std::size_t kTile = 32;   // hidden units per register tile

  struct scratch {
    std::vector<uint32_t> row_ptr, row_col;           // CSR: non-zero pixels per sample
    std::vector<uint32_t> col_ptr, col_next, col_row;  // CSC: samples per non-zero pixel
    std::vector<float> row_val, col_val, A, dZ, logits;
  };

  // For n <= kChunk samples: builds the CSR/CSC lists of non-zero pixels and
  // fills s.A (post-ReLU hidden activations, n x H) and s.logits (n x 10).
  void forward(const float* P, const float* x, std::size_t n, scratch& s) const {
    const float* W1 = P + oW1_;
    const float* b1 = P + ob1_;
    const float* W2 = P + oW2_;
    const float* b2 = P + ob2_;
    s.row_ptr.assign(n + 1, 0);
    s.col_ptr.assign(kFeatures + 1, 0);
    s.row_col.resize(n * kFeatures);
    s.row_val.resize(n * kFeatures);
    s.col_row.resize(n * kFeatures);
    s.col_val.resize(n * kFeatures);
    s.A.resize(n * H_);
    s.dZ.resize(n * H_);
    s.logits.resize(n * kClasses);

    uint32_t nnz = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float* xi = x + i * kFeatures;
      for (std::size_t j = 0; j < kFeatures; ++j)
        if (xi[j] != 0.0f) {
          s.row_col[nnz] = static_cast<uint32_t>(j);
          s.row_val[nnz] = xi[j];
          ++s.col_ptr[j + 1];
          ++nnz;
        }
      s.row_ptr[i + 1] = nnz;
    }
    for (std::size_t j = 0; j < kFeatures; ++j) s.col_ptr[j + 1] += s.col_ptr[j];
    s.col_next.assign(s.col_ptr.begin(), s.col_ptr.end() - 1);
    for (std::size_t i = 0; i < n; ++i)
      for (uint32_t p = s.row_ptr[i]; p < s.row_ptr[i + 1]; ++p) {
        const uint32_t q = s.col_next[s.row_col[p]]++;
        s.col_row[q] = static_cast<uint32_t>(i);
        s.col_val[q] = s.row_val[p];
      }

    // Z1 = b1 + X W1 (tile-outer so W1's tile columns stay cached), ReLU.
    for (std::size_t i = 0; i < n; ++i) std::copy(b1, b1 + H_, &s.A[i * H_]);
    for (std::size_t h0 = 0; h0 < H_; h0 += kTile) {
      const std::size_t tn = std::min(kTile, H_ - h0);
      for (std::size_t i = 0; i < n; ++i) {
        const uint32_t b = s.row_ptr[i], cnt = s.row_ptr[i + 1] - b;
        float* z = &s.A[i * H_ + h0];
        if (tn == kTile)
          gather_axpy<kTile>(z, &s.row_col[b], &s.row_val[b], cnt, W1 + h0, H_);
        else
          gather_axpy_n(z, &s.row_col[b], &s.row_val[b], cnt, W1 + h0, H_, tn);
      }
    }
    for (std::size_t i = 0; i < n * H_; ++i) s.A[i] = std::max(s.A[i], 0.0f);

    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t k = 0; k < kClasses; ++k)
        s.logits[i * kClasses + k] = b2[k] + dot(&s.A[i * H_], W2 + k * H_, H_);
  }

  std::size_t H_, oW1_, ob1_, oW2_, ob2_, n_;
};

}  // namespace

std::unique_ptr<model> make_model(const std::string& name, std::size_t hidden) {
  if (name == "softmax") return std::make_unique<softmax_model>();
  if (name == "mlp") {
    if (hidden == 0) throw std::invalid_argument("make_model: mlp needs hidden > 0");
    return std::make_unique<mlp_model>(hidden);
  }
  throw std::invalid_argument("make_model: unknown model name '" + name +
                              "' (accepted: \"softmax\", \"mlp\")");
}

double accuracy(const model& m, const std::vector<float>& params, const dataset& ds) {
  return accuracy(m, params, ds, 0, ds.count);
}

double accuracy(const model& m, const std::vector<float>& params, const dataset& ds, std::size_t first,
                std::size_t count) {
  if (ds.features != kFeatures)
    throw std::invalid_argument("accuracy: dataset has " + std::to_string(ds.features) +
                                " features, expected 784");
  if (ds.images.size() != ds.count * kFeatures || ds.labels.size() != ds.count)
    throw std::invalid_argument("accuracy: dataset sizes inconsistent with count " +
                                std::to_string(ds.count));
  if (first > ds.count || count > ds.count - first)
    throw std::invalid_argument("accuracy: samples [" + std::to_string(first) + ", +" + std::to_string(count) +
                                ") are not within the " + std::to_string(ds.count) + " samples");
  if (count == 0) return 0.0;
  std::vector<uint8_t> pred(count);
  m.predict(params, ds.images.data() + first * kFeatures, count, pred.data());
  std::size_t correct = 0;
  for (std::size_t i = 0; i < count; ++i) correct += pred[i] == ds.labels[first + i];
  return static_cast<double>(correct) / static_cast<double>(count);
}

}  // namespace ps::fmnist
