// Host build only: how many OpenMP threads kernels called from this thread may use.
#include <omp.h>

#include "kernels/kernels.hpp"

namespace ps::kernels {

void set_thread_limit(int threads) { omp_set_num_threads(threads < 1 ? 1 : threads); }

}  // namespace ps::kernels
