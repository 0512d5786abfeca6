#pragma once
// Thrust kernels, host build (Thrust's OpenMP backend; library ps_kernels). Raw float
// pointers into host memory, so callers need no Thrust. The same sources build for CUDA as
// ps_kernels_cuda (kernels_cuda.hpp, namespace ps::kernels_cuda, device pointers).
// Large calls run on OpenMP threads; calls below a small size run on the calling thread.
#include <cstddef>
#include <cstdint>

namespace ps::kernels {

#include "kernels/api.inl"

// Caps the OpenMP threads that kernels called from *this* thread may use (per thread, like
// omp_set_num_threads). A CPU "device" thread sets 1 so that it stays one core.
void set_thread_limit(int threads);

}  // namespace ps::kernels
