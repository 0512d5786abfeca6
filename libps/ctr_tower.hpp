#pragma once
// train_ctr's dense tower: an MLP over one sample's features (its fields' embeddings and
// its log-transformed integers, side by side) with ReLU hidden layers and one logit, under
// the logistic loss. It gives the gradient of the parameters (pushed to the dense
// tensors) and of the inputs (whose embedding part is pushed to the rows). Plain loops
// on the host; the parameters are one flat vector, layer after layer, W [out][in] then b.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ps {

class ctr_tower {
 public:
  // inputs: features per sample; hidden: the hidden layers' widths (may be empty: a
  // logistic regression). Throws bad_request for zero inputs or a zero width.
  ctr_tower(std::size_t inputs, std::vector<std::size_t> hidden);

  std::size_t inputs() const { return widths_.front(); }
  std::size_t num_params() const { return offsets_.back(); }
  // Where layer l's W and b start in the flat parameters, and how many floats each is.
  struct layer {
    std::size_t w_offset, w_size, b_offset, b_size;
  };
  std::vector<layer> layers() const;

  // He-uniform weights and zero biases, a function of the seed only.
  void init(float* params, std::uint64_t seed) const;
  // The mean logistic loss over the batch (x: batch * inputs, labels 0/1). grad
  // (num_params) and dx (batch * inputs) are overwritten with the mean loss's gradients.
  double loss_and_grad(const float* params, const float* x, const float* labels, std::size_t batch, float* grad,
                       float* dx) const;
  // Click probabilities of the batch's samples.
  void predict(const float* params, const float* x, std::size_t batch, double* probabilities) const;

 private:
  // Activations of every layer for the batch (acts[0] is x copied), the last one the logits.
  std::vector<std::vector<float>> forward(const float* params, const float* x, std::size_t batch) const;

  std::vector<std::size_t> widths_;   // inputs, hidden..., 1
  std::vector<std::size_t> offsets_;  // per layer: start of W; back(): the total
};

}  // namespace ps
