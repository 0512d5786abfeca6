// Fashion-MNIST loading and small classification models for the training apps.
//
// Data: the gzipped IDX files shipped by the Debian package
// `dataset-fashion-mnist` (/usr/share/datasets/fashion-mnist).
//
// Models keep all parameters in ONE flat std::vector<float> so that the
// parameter server can hold them as a single contiguous key range; gradients
// use the same layout.  layers() reports where each tensor lives.
//
// Parameter layouts (row-major):
//   softmax:  W [10][784], b [10]                       (10*784 + 10 = 7850)
//   mlp(H):   W1 [784][H] (input-major), b1 [H],
//             W2 [10][H],  b2 [10]                       (784*H + H + 10*H + 10)
//
// All model methods are const and keep no state between calls, so one model
// object may be shared by any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ps::fmnist {

inline constexpr std::size_t kImageSide = 28;
inline constexpr std::size_t kFeatures = kImageSide * kImageSide;  // 784
inline constexpr std::size_t kClasses = 10;

struct dataset {
  std::size_t count = 0;
  std::size_t features = kFeatures;
  std::vector<float> images;    // count * features, pixel / 255.0f, row-major per sample
  std::vector<uint8_t> labels;  // count entries, 0..9
};

// Reads a gzipped IDX3 image file (magic 2051, 28x28) and the matching IDX1
// label file (magic 2049).  Uncompressed files are accepted too (zlib reads
// them transparently).  Throws std::runtime_error naming the offending file
// and the problem (cannot open, bad magic, bad dimensions, truncated, trailing
// data, corrupt gzip stream, count mismatch, label out of range).
dataset load_idx(const std::string& images_gz_path, const std::string& labels_gz_path);

struct split {
  dataset train, test;
};

// Loads train-{images-idx3,labels-idx1}-ubyte.gz and t10k-*-ubyte.gz from dir.
// If the directory or a file is missing, the std::runtime_error says to
// install the Debian package `dataset-fashion-mnist`.
split load_default(const std::string& dir = "/usr/share/datasets/fashion-mnist");

struct layer_span {
  std::size_t offset, size;  // where a tensor's params live in the flat vector
};
// Told when a span of the gradient is final (backward goes last layer first).
using grad_ready_fn = std::function<void(layer_span)>;

class model {
 public:
  virtual ~model() = default;
  virtual std::size_t num_params() const = 0;
  // Tensors in forward order (softmax: W, b; mlp: W1, b1, W2, b2).
  virtual std::vector<layer_span> layers() const = 0;
  // Resizes params to num_params() and fills it; deterministic for a seed
  // (platform independent: uses only std::mt19937_64 raw output).
  virtual void init(std::vector<float>& params, uint64_t seed) const = 0;
  // Mean cross-entropy loss over the batch; writes the gradient of the MEAN
  // loss into grad (resized to num_params()).  x: batch*784 floats, y: batch
  // labels.  batch == 0 gives loss 0 and an all-zero gradient.
  // Throws std::invalid_argument if params.size() != num_params() or a label
  // is >= 10. If given, ready is called for spans of grad as soon as they are final,
  // last layer first, covering every gradient value exactly once (pipelined pushes).
  float loss_and_grad(const std::vector<float>& params, const float* x, const uint8_t* y,
                      std::size_t batch, std::vector<float>& grad,
                      const grad_ready_fn& ready = {}) const;
  // The same on raw buffers of num_params() floats (a device's own buffers); grad is
  // overwritten.
  float loss_and_grad(const float* params, const float* x, const uint8_t* y, std::size_t batch,
                      float* grad, const grad_ready_fn& ready = {}) const;
  // Writes the arg-max class of each of the n samples into out.
  void predict(const std::vector<float>& params, const float* x, std::size_t n, uint8_t* out) const;
  virtual const char* name() const = 0;

 protected:
  // Called with checked inputs, batch > 0 and grad zeroed (num_params() floats);
  // calls ready (never empty) for final spans as described at loss_and_grad.
  virtual float compute_loss_and_grad(const float* params, const float* x, const uint8_t* y,
                                      std::size_t batch, float* grad, const grad_ready_fn& ready) const = 0;
  virtual void compute_predict(const float* params, const float* x, std::size_t n,
                               uint8_t* out) const = 0;
};

// name: "softmax" (multinomial logistic regression) or "mlp" (784 -> hidden
// ReLU -> 10).  Unknown name or hidden == 0 (for "mlp") -> std::invalid_argument.
std::unique_ptr<model> make_model(const std::string& name, std::size_t hidden = 256);

// Fraction of samples of ds that the model classifies correctly (0 for an
// empty dataset).  Throws std::invalid_argument if ds.features != 784.
double accuracy(const model& m, const std::vector<float>& params, const dataset& ds);
// The accuracy on samples [first, first + count) of ds (a worker's part of the test set).
double accuracy(const model& m, const std::vector<float>& params, const dataset& ds, std::size_t first,
                std::size_t count);

}  // namespace ps::fmnist
