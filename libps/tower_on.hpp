#pragma once
// The tower's passes written once over a compute device's memory and kernels. A Device
// gives `floats` (a buffer in its memory), ptr, resize, upload and download (host <->
// device), and the kernels of kernels/dense.cu. host_device is in libps/ctr_tower.cpp,
// cuda_device in apps/ctr_backend.cpp.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "libps/ctr_tower.hpp"

namespace ps {

template <class Device>
class tower_on final : public tower_compute {
 public:
  explicit tower_on(const ctr_tower& shape)
      : layers_(shape.layers()), params_count_(shape.num_params()), acts_(layers_.size() + 1) {}

  double loss_and_grad(const float* params, const float* x, const float* labels, std::size_t batch, float* grad,
                       float* dx) override {
    if (batch == 0) {
      std::fill_n(grad, params_count_, 0.0f);
      return 0;
    }
    forward(params, x, batch);
    Device::upload(labels_, labels, batch);
    Device::resize(delta_, batch);
    const double loss = Device::logistic_loss(Device::ptr(acts_.back()), Device::ptr(labels_), Device::ptr(delta_), batch);
    Device::resize(grad_, params_count_);
    for (std::size_t l = layers_.size(); l-- > 0;) {  // delta_: d(loss)/d(layer l's output)
      const auto& ly = layers_[l];
      Device::dense_weight_grad(Device::ptr(delta_), Device::ptr(acts_[l]), Device::ptr(grad_) + ly.w_offset,
                                Device::ptr(grad_) + ly.b_offset, batch, ly.in, ly.out);
      Device::resize(below_, batch * ly.in);
      const float* relu_output = l > 0 ? Device::ptr(acts_[l]) : nullptr;  // the inputs pass as they are
      Device::dense_input_grad(Device::ptr(delta_), Device::ptr(params_) + ly.w_offset, relu_output,
                               Device::ptr(below_), batch, ly.in, ly.out);
      std::swap(delta_, below_);
    }
    Device::download(grad, grad_, params_count_);
    Device::download(dx, delta_, batch * layers_.front().in);
    return loss;
  }

  void predict(const float* params, const float* x, std::size_t batch, double* probabilities) override {
    if (batch == 0) return;
    forward(params, x, batch);
    std::vector<float> logits(batch);
    Device::download(logits.data(), acts_.back(), batch);
    for (std::size_t s = 0; s < batch; ++s) probabilities[s] = 1 / (1 + std::exp(-static_cast<double>(logits[s])));
  }

  std::string backend() const override { return Device::name; }

 private:
  // acts_[l + 1] = layer l of acts_[l] (ReLU but for the logits), acts_[0] = x.
  void forward(const float* params, const float* x, std::size_t batch) {
    Device::upload(params_, params, params_count_);
    Device::upload(acts_[0], x, batch * layers_.front().in);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const auto& ly = layers_[l];
      Device::resize(acts_[l + 1], batch * ly.out);
      Device::dense_forward(Device::ptr(params_) + ly.w_offset, Device::ptr(params_) + ly.b_offset,
                            Device::ptr(acts_[l]), Device::ptr(acts_[l + 1]), batch, ly.in, ly.out,
                            l + 1 < layers_.size());
    }
  }

  std::vector<ctr_tower::layer> layers_;
  std::size_t params_count_;
  typename Device::floats params_, grad_, labels_, delta_, below_;
  std::vector<typename Device::floats> acts_;
};

}  // namespace ps
