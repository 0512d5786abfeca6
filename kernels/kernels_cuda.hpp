#pragma once
// Thrust kernels, CUDA build (library ps_kernels_cuda, built when CMake finds nvcc). Same API
// and semantics as kernels.hpp, but every pointer except sum_n's array of pointers is device
// memory. nvcc contracts a*b+c into FMA by default, so results of the update rules may differ
// from the host build in the last bit.
#include <cstddef>
#include <cstdint>

namespace ps::kernels_cuda {

#include "kernels/api.inl"

}  // namespace ps::kernels_cuda
