#pragma once
// train_ctr's --backend: where a worker runs its dense tower. "host" (the kernels' host
// build) everywhere; "cuda" (the CUDA build on the first CUDA device) where CMake found nvcc.
#include <memory>
#include <string>

#include "apps/ctr/ctr_tower.hpp"

namespace ps {

// Throws bad_request naming the flag when the backend is not host or cuda, or when cuda
// is asked of a build without CUDA kernels or a machine without a CUDA device.
std::unique_ptr<tower_compute> tower_on_backend(const std::string& backend, const ctr_tower& shape);

}  // namespace ps
