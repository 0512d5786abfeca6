#pragma once
// The worker's local aggregator: N compute devices, each with its own gradient and parameter
// buffers, reduced before a single push and refreshed from a single pull. Here a device is a
// CPU device (there is no GPU on these machines): its own buffers, and its part of every phase
// of a schedule from actors/reduction_plan.hpp, with a barrier between phases. Its kernels (the
// host build of kernels/, one OpenMP thread each) run on one of min(devices, cores) executor
// threads: device d on executor d mod that count, so one core works for one device at a time.
// When the executors take every CPU the process may use, each is pinned to its own.
// (One thread per device taking turns for a core token was slower: bench_aggregate, block in
// place, 8 devices on 2 cores: 75-90% of the memory limit against 88-96% with executors.)
//
//   ps::gpu_aggregator agg(4, n, ps::parse_strategy("ring"));
//   compute into agg.gradient(r) for r < agg.devices() ...
//   agg.reduce(push_buffer.data());          // push_buffer = sum of the devices' gradients
//   for (auto p : agg.reduce_in_place()) ... // or: the sum where it lies, piece by piece
//   agg.broadcast(pulled.data());            // every agg.params(r) = pulled
//   agg.remove_device(2);                    // ranks 3.. become 2..; the ring is rebuilt
//
// Not thread-safe: one caller at a time (the worker actor that owns it).
#include <barrier>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "actors/reduction_plan.hpp"

namespace ps {

class gpu_aggregator {
 public:
  // `values` floats per device. Throws bad_request when devices == 0.
  gpu_aggregator(std::size_t devices, std::size_t values, strategy how);
  ~gpu_aggregator();
  gpu_aggregator(const gpu_aggregator&) = delete;
  gpu_aggregator& operator=(const gpu_aggregator&) = delete;

  std::size_t devices() const { return devices_.size(); }
  std::size_t size() const { return values_; }
  strategy how() const { return how_; }

  // Device `rank`'s buffers (throws bad_request for a rank out of range). Parameter buffers
  // are allocated on the first broadcast.
  float* gradient(std::size_t rank);
  const float* params(std::size_t rank) const;

  // The sum over devices of gradient(r), left in the devices' gradient buffers (no buffer
  // written beyond them; the fastest form): pieces in value order, covering [0, size) (or
  // [offset, offset + count)), each pointing into some device's gradient buffer, valid until
  // the next call that runs the devices. Push each piece, or copy them out. The other values
  // of the gradient buffers are scratch afterwards.
  struct piece {
    std::size_t offset = 0, count = 0;  // values [offset, offset + count) of the sum
    const float* data = nullptr;
  };
  std::vector<piece> reduce_in_place();
  std::vector<piece> reduce_in_place(std::size_t offset, std::size_t count);

  // out[0, size) = sum over devices of gradient(r). The gradient buffers are scratch space
  // afterwards (ring leaves partial sums in them). Integer-valued floats give exact sums.
  void reduce(float* out);
  // The same for values [offset, offset + count) only (push a layer as soon as it is ready).
  void reduce(float* out, std::size_t offset, std::size_t count);
  // Every gradient(r) = the sum (the all-reduce of data-parallel training without a server).
  void allreduce();
  // Every params(r) = params[0, size).
  void broadcast(const float* params);
  void broadcast(const float* params, std::size_t offset, std::size_t count);

  // The device leaves: its gradient is no longer counted, ranks above it move down by one
  // and the plans are rebuilt for devices() - 1. Throws bad_request for a bad rank or when it
  // is the last device.
  void remove_device(std::size_t rank);

 private:
  struct device {
    std::vector<float> gradient;
    std::vector<float> params;
  };
  struct job {
    const reduction_plan* plan = nullptr;
    bool on_params = false;  // device buffers: params instead of gradients
    float* host = nullptr;   // the host buffer, already offset
    std::size_t offset = 0, count = 0;
  };

  void run(const reduction_plan& plan, bool on_params, float* host, std::size_t offset,
           std::size_t count);
  void check_range(std::size_t offset, std::size_t count, const char* what) const;
  void start_threads();
  void stop_threads();
  void executor_main(std::size_t executor, std::uint64_t seen);
  void execute(std::size_t executor, const job& j);
  void rebuild_plans();

  std::size_t values_;
  strategy how_;
  std::vector<std::unique_ptr<device>> devices_;
  reduction_plan in_place_plan_, reduce_plan_, allreduce_plan_, broadcast_plan_;

  std::size_t executors_ = 0;  // min(devices, CPUs allowed), set before the threads start
  std::vector<std::thread> threads_;
  std::unique_ptr<std::barrier<>> barrier_;
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  std::uint64_t generation_ = 0;  // bumped per job
  std::size_t finished_ = 0;
  bool stopping_ = false;
  job job_;
  std::exception_ptr error_;
};

}  // namespace ps
