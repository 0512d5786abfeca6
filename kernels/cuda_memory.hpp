#pragma once
// Device memory for the callers of ps_kernels_cuda (host code compiled by g++, linked with
// CUDA's runtime): a typed buffer owned like a std::vector, and CUDA errors as exceptions.
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ps {

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + what + ": " + cudaGetErrorString(e));
}

// n elements of T in device memory, zeroed when made. resize() keeps no contents (the
// callers overwrite them) and reallocates only to grow.
template <class T>
class device_vector {
 public:
  device_vector() = default;
  explicit device_vector(std::size_t n) { resize(n); }
  explicit device_vector(const std::vector<T>& h) { assign(h.data(), h.size()); }
  ~device_vector() { cudaFree(p_); }
  device_vector(device_vector&& o) noexcept { swap(o); }
  device_vector& operator=(device_vector&& o) noexcept {
    swap(o);
    return *this;
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  void swap(device_vector& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    std::swap(capacity_, o.capacity_);
  }

  T* get() const { return p_; }
  std::size_t size() const { return n_; }
  void resize(std::size_t n) {
    if (n > capacity_) {
      T* p = nullptr;
      check_cuda(cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T)), "cudaMalloc");
      cudaFree(p_);
      p_ = p;
      capacity_ = n;
      check_cuda(cudaMemset(p_, 0, n * sizeof(T)), "cudaMemset");
    }
    n_ = n;
  }
  // The n elements at src (host memory) become the contents.
  void assign(const T* src, std::size_t n) {
    resize(n);
    if (n > 0) check_cuda(cudaMemcpy(p_, src, n * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  }
  // The first n elements into dst (host memory).
  void read_into(T* dst, std::size_t n) const {
    if (n > 0) check_cuda(cudaMemcpy(dst, p_, n * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  }
  std::vector<T> read() const {
    std::vector<T> h(n_);
    read_into(h.data(), n_);
    return h;
  }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0, capacity_ = 0;
};

// The first CUDA device's properties into *prop; false, with the reason in *why_none, when
// the machine has none (the callers say who wanted one).
inline bool first_cuda_device(cudaDeviceProp* prop, std::string* why_none) {
  int count = 0;
  const cudaError_t found = cudaGetDeviceCount(&count);
  if (found != cudaSuccess || count == 0) {
    *why_none = found != cudaSuccess ? cudaGetErrorString(found) : "the driver reports none";
    return false;
  }
  check_cuda(cudaGetDeviceProperties(prop, 0), "cudaGetDeviceProperties");
  return true;
}

}  // namespace ps
