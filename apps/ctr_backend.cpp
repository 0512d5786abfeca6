#include "apps/ctr_backend.hpp"

#include "libps/keys/keys.hpp"

#ifdef PS_HAVE_CUDA
#include "kernels/cuda_memory.hpp"
#include "kernels/kernels_cuda.hpp"
#include "apps/ctr/tower_on.hpp"
#endif

namespace ps {

namespace {

#ifdef PS_HAVE_CUDA
// tower_on's Device for the CUDA build: buffers in the first device's memory.
struct cuda_device {
  static constexpr const char* name = "cuda";
  using floats = device_vector<float>;
  static float* ptr(floats& v) { return v.get(); }
  static void resize(floats& v, std::size_t n) { v.resize(n); }
  static const float* input(floats& staging, const float* src, std::size_t n) {
    staging.assign(src, n);
    return staging.get();
  }
  static float* output(floats& staging, float*, std::size_t n) {
    staging.resize(n);
    return staging.get();
  }
  static void done(float* dst, const floats& staging, std::size_t n) { staging.read_into(dst, n); }
  static constexpr auto dense_forward = &kernels_cuda::dense_forward;
  static constexpr auto dense_weight_grad = &kernels_cuda::dense_weight_grad;
  static constexpr auto dense_input_grad = &kernels_cuda::dense_input_grad;
  static constexpr auto logistic_loss = &kernels_cuda::logistic_loss;
};

std::unique_ptr<tower_compute> cuda_tower(const ctr_tower& shape) {
  cudaDeviceProp prop{};
  std::string why_none;
  if (!first_cuda_device(&prop, &why_none)) throw bad_request("--backend=cuda: no CUDA device (" + why_none + ")");
  return std::make_unique<tower_on<cuda_device>>(shape);
}
#else
std::unique_ptr<tower_compute> cuda_tower(const ctr_tower&) {
  throw bad_request("--backend=cuda: this build has no CUDA kernels (CMake found no nvcc, or -DPS_WITH_CUDA=OFF)");
}
#endif

}  // namespace

std::unique_ptr<tower_compute> tower_on_backend(const std::string& backend, const ctr_tower& shape) {
  if (backend == "host") return host_tower(shape);
  if (backend == "cuda") return cuda_tower(shape);
  throw bad_request("--backend: \"" + backend + "\" (expected host or cuda)");
}

}  // namespace ps
