#pragma once
// train_ctr's dense tower: an MLP over one sample's features (its fields' embeddings and
// its log-transformed integers, side by side) with ReLU hidden layers and one logit, under
// the logistic loss. It gives the gradient of the parameters (pushed to the dense
// tensors) and of the inputs (whose embedding part is pushed to the rows). The parameters
// are one flat vector, layer after layer, W [out][in] then b. ctr_tower is the shape; a
// tower_compute runs it on a compute device with the kernels (kernels/dense.cu).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ps {

class ctr_tower {
 public:
  // inputs: features per sample; hidden: the hidden layers' widths (may be empty: a
  // logistic regression). Throws bad_request for zero inputs or a zero width.
  ctr_tower(std::size_t inputs, std::vector<std::size_t> hidden);

  std::size_t inputs() const { return widths_.front(); }
  std::size_t num_params() const { return offsets_.back(); }
  // Layer l's widths, and where its W (out x in) and b (out) start in the flat parameters.
  struct layer {
    std::size_t in, out, w_offset, b_offset;
  };
  std::vector<layer> layers() const;

  // He-uniform weights and zero biases, a function of the seed only.
  void init(float* params, std::uint64_t seed) const;

 private:
  std::vector<std::size_t> widths_;   // inputs, hidden..., 1
  std::vector<std::size_t> offsets_;  // per layer: start of W; back(): the total
};

// The tower's passes on one compute device. Not thread-safe: one per worker thread (it
// keeps the batch's activations between the passes).
class tower_compute {
 public:
  virtual ~tower_compute() = default;
  // The mean logistic loss over the batch (x: batch * inputs, labels 0/1). grad
  // (num_params) and dx (batch * inputs) are overwritten with the mean loss's gradients.
  virtual double loss_and_grad(const float* params, const float* x, const float* labels, std::size_t batch,
                               float* grad, float* dx) = 0;
  // Click probabilities of the batch's samples.
  virtual void predict(const float* params, const float* x, std::size_t batch, double* probabilities) = 0;
  // "host" or "cuda".
  virtual std::string backend() const = 0;
};

// The tower on the host: the kernels' host build (Thrust on OpenMP; apps/ctr/tower_host.cpp).
std::unique_ptr<tower_compute> host_tower(const ctr_tower& shape);

}  // namespace ps
