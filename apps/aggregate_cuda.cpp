#include "apps/aggregate_cuda.hpp"

#include "libps/keys/keys.hpp"

#ifdef PS_HAVE_CUDA

#include <cstdio>
#include <memory>
#include <stdexcept>

#include "apps/bench_timing.hpp"
#include "kernels/cuda_memory.hpp"
#include "kernels/kernels_cuda.hpp"
#include "actors/reduction_plan.hpp"
#endif

namespace ps {

#ifndef PS_HAVE_CUDA

void bench_aggregate_cuda(const cuda_aggregate_options&) {
  throw bad_request("--backend=cuda: this build has no CUDA kernels (CMake found no nvcc, or -DPS_WITH_CUDA=OFF)");
}

#else

namespace {

using device_buffer = device_vector<float>;

// f, then wait for the device: a rep's time includes its kernels.
template <class F>
auto synced(F f) {
  return [f] {
    f();
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  };
}

}  // namespace

void bench_aggregate_cuda(const cuda_aggregate_options& o) {
  cudaDeviceProp prop{};
  std::string why_none;
  if (!first_cuda_device(&prop, &why_none)) throw bad_request("--backend=cuda: no CUDA device (" + why_none + ")");
  const std::size_t n = o.values, bytes = n * sizeof(float);
  const double b = static_cast<double>(bytes);

  // The limits: a device-to-device copy (bytes read + bytes written) and y += x with the
  // CUDA kernels (3 * bytes), over the same size.
  device_buffer lx(n), ly(n);
  auto copy_rep = synced([&] {
    check_cuda(cudaMemcpy(ly.get(), lx.get(), bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy");
  });
  auto add_rep = synced([&] { kernels_cuda::add(ly.get(), lx.get(), n); });
  std::vector<double> all_copy, all_add;

  for (const auto& sname : o.strategies) {
    const strategy how = parse_strategy(sname);
    for (std::size_t devices : o.devices) {
      std::vector<std::unique_ptr<device_buffer>> device(devices);
      for (auto& d : device) d = std::make_unique<device_buffer>(n);
      device_buffer host(n);  // the plan's host buffer: the push buffer, in device memory
      auto buffer = [&](std::size_t id) { return id == devices ? host.get() : device[id]->get(); };
      for (bool in_place : {true, false}) {
        const auto plan = make_plan(how, in_place ? plan_goal::reduce_in_place : plan_goal::reduce, devices);
        auto reduce_rep = synced([&] {
          for (const auto& phase : plan.phases)
            for (const auto& op : phase)
              apply_op(plan, op, n, buffer, [](float* dst, const std::vector<const float*>& srcs, std::size_t c) {
                kernels_cuda::sum_n(dst, srcs.data(), srcs.size(), c);
              });
        });
        auto [t, tl] = bench::interleaved(o.reps, reduce_rep, copy_rep, all_copy);
        const double gbps = static_cast<double>(devices + 1) * b / t / 1e9, limit = 2 * b / tl / 1e9;
        const std::size_t plan_bytes = plan_traffic(plan, n) * sizeof(float);
        const double plan_gbps = static_cast<double>(plan_bytes) / t / 1e9;
        bench::print_line({{"backend", "cuda"}, {"device", prop.name}, {"strategy", sname}, {"devices", devices},
                           {"bytes", bytes}, {"result", in_place ? "in_place" : "host_buffer"}, {"gbps", gbps},
                           {"limit_gbps", limit}, {"pct_of_limit", 100 * gbps / limit}, {"ms", t * 1e3},
                           {"counted", "N*bytes read + bytes written"}, {"plan_bytes", plan_bytes},
                           {"plan_gbps", plan_gbps}, {"plan_pct_of_limit", 100 * plan_gbps / limit}});
      }
    }
  }
  if (all_copy.empty()) bench::interleaved(o.reps, copy_rep, copy_rep, all_copy);
  bench::interleaved(o.reps, copy_rep, add_rep, all_add);
  bench::print_line({{"backend", "cuda"}, {"device", prop.name}, {"limit", "cuda_copy"}, {"bytes", bytes},
                     {"gbps", 2 * b / bench::median(all_copy) / 1e9}, {"samples", all_copy.size()},
                     {"counted", "bytes read + bytes written: 2*bytes"}});
  bench::print_line({{"backend", "cuda"}, {"device", prop.name}, {"limit", "stream_add"}, {"bytes", bytes},
                     {"gbps", 3 * b / bench::median(all_add) / 1e9}, {"samples", all_add.size()},
                     {"counted", "x and y read, y written: 3*bytes"}});
}

#endif

}  // namespace ps
