#pragma once
// bench_aggregate --backend=cuda: the sum-of-N cells on the first CUDA device. The N devices
// are N buffers in that device's memory, and each strategy's reduction plan runs op by op
// with ps::kernels_cuda, the same plans and kernels sources as the CPU aggregator. The limit
// is the device's own copy bandwidth (cudaMemcpy device to device), measured beside each cell.
#include <cstddef>
#include <string>
#include <vector>

namespace ps {

struct cuda_aggregate_options {
  std::vector<std::string> strategies;
  std::vector<std::size_t> devices;
  std::size_t values = 0;  // floats per device
  int reps = 10;
};

// Prints one JSON line per strategy, device count and result form, then the limit lines.
// Throws bad_request when this build has no CUDA kernels or the machine no CUDA device,
// saying which.
void bench_aggregate_cuda(const cuda_aggregate_options& o);

}  // namespace ps
