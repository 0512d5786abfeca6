#pragma once
// The tower's passes written once over a compute device's memory and kernels. A Device
// gives `floats` (a buffer in its memory), ptr and resize; input(staging, host, n), the
// host floats as the kernels read them; output(staging, host, n), where the kernels write
// what ends at `host`, and done(host, staging, n) once they have (the host device reads and
// writes the caller's memory in place, CUDA stages it in device memory); and the kernels
// of kernels/dense.cu. host_device is in apps/ctr/tower_host.cpp, cuda_device in
// apps/ctr_backend.cpp.
#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "apps/ctr/ctr_tower.hpp"

namespace ps {

template <class Device>
class tower_on final : public tower_compute {
 public:
  explicit tower_on(const ctr_tower& shape)
      : layers_(shape.layers()), params_count_(shape.num_params()), acts_(layers_.size() + 1),
        act_(layers_.size() + 1) {}

  double loss_and_grad(const float* params, const float* x, const float* labels, std::size_t batch, float* grad,
                       float* dx) override {
    if (batch == 0) {
      std::fill_n(grad, params_count_, 0.0f);
      return 0;
    }
    const float* w = forward(params, x, batch);
    Device::resize(delta_, batch);
    const double loss =
      Device::logistic_loss(act_.back(), Device::input(labels_, labels, batch), Device::ptr(delta_), batch);
    float* g = Device::output(grad_, grad, params_count_);
    float* dx_out = Device::output(dx_, dx, batch * layers_.front().in);
    for (std::size_t l = layers_.size(); l-- > 0;) {  // delta_: d(loss)/d(layer l's output)
      const auto& ly = layers_[l];
      Device::dense_weight_grad(Device::ptr(delta_), act_[l], g + ly.w_offset, g + ly.b_offset, batch, ly.in, ly.out);
      if (l == 0) {  // the inputs pass as they are: no ReLU to go through
        Device::dense_input_grad(Device::ptr(delta_), w + ly.w_offset, nullptr, dx_out, batch, ly.in, ly.out);
        break;
      }
      Device::resize(below_, batch * ly.in);
      Device::dense_input_grad(Device::ptr(delta_), w + ly.w_offset, act_[l], Device::ptr(below_), batch, ly.in,
                               ly.out);
      std::swap(delta_, below_);
    }
    Device::done(grad, grad_, params_count_);
    Device::done(dx, dx_, batch * layers_.front().in);
    return loss;
  }

  void predict(const float* params, const float* x, std::size_t batch, double* probabilities) override {
    if (batch == 0) return;
    forward(params, x, batch);
    std::vector<float> logits(batch);
    Device::done(logits.data(), acts_.back(), batch);
    for (std::size_t s = 0; s < batch; ++s) probabilities[s] = 1 / (1 + std::exp(-static_cast<double>(logits[s])));
  }

  std::string backend() const override { return Device::name; }

 private:
  // act_[l + 1] = layer l of act_[l] (ReLU but for the logits), act_[0] = x; returns the
  // parameters as the kernels read them.
  const float* forward(const float* params, const float* x, std::size_t batch) {
    const float* w = Device::input(params_, params, params_count_);
    act_[0] = Device::input(acts_[0], x, batch * layers_.front().in);
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const auto& ly = layers_[l];
      Device::resize(acts_[l + 1], batch * ly.out);
      Device::dense_forward(w + ly.w_offset, w + ly.b_offset, act_[l], Device::ptr(acts_[l + 1]), batch, ly.in,
                            ly.out, l + 1 < layers_.size());
      act_[l + 1] = Device::ptr(acts_[l + 1]);
    }
    return w;
  }

  std::vector<ctr_tower::layer> layers_;
  std::size_t params_count_;
  typename Device::floats params_, grad_, dx_, labels_, delta_, below_;
  std::vector<typename Device::floats> acts_;  // acts_[0]: staging for x; 1..: the layers' outputs
  std::vector<const float*> act_;              // each layer's input as the kernels read it
};

}  // namespace ps
