// The tower on the host: tower_on over the host build of the kernels, reading and
// writing the caller's memory in place. Its own unit, so that ctr_tower (the shape) does
// not depend on tower_on (the passes), which depends on it.
#include <algorithm>
#include <vector>

#include "kernels/kernels.hpp"
#include "apps/ctr/ctr_tower.hpp"
#include "apps/ctr/tower_on.hpp"

namespace ps {

namespace {

struct host_device {
  static constexpr const char* name = "host";
  using floats = std::vector<float>;
  static float* ptr(floats& v) { return v.data(); }
  static void resize(floats& v, std::size_t n) { v.resize(n); }
  // The kernels read and write the caller's memory: no copies on the host.
  static const float* input(floats&, const float* src, std::size_t) { return src; }
  static float* output(floats&, float* dst, std::size_t) { return dst; }
  // An empty buffer: the kernels wrote to dst itself. A layer's output (predict's logits) is copied.
  static void done(float* dst, const floats& v, std::size_t n) {
    if (!v.empty()) std::copy_n(v.data(), n, dst);
  }
  static constexpr auto dense_forward = &kernels::dense_forward;
  static constexpr auto dense_weight_grad = &kernels::dense_weight_grad;
  static constexpr auto dense_input_grad = &kernels::dense_input_grad;
  static constexpr auto logistic_loss = &kernels::logistic_loss;
};

}  // namespace

std::unique_ptr<tower_compute> host_tower(const ctr_tower& shape) {
  return std::make_unique<tower_on<host_device>>(shape);
}

}  // namespace ps
