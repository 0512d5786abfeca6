#include "actors/gpu_aggregator.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <string>

#include "kernels/kernels.hpp"
#include "libps/keys/keys.hpp"

namespace ps {

namespace {

// The CPUs this process may run on.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  return cpus;
}

void pin_to(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  pthread_setaffinity_np(pthread_self(), sizeof one, &one);  // best effort: unpinned still works
}

}  // namespace

gpu_aggregator::gpu_aggregator(std::size_t devices, std::size_t values, strategy how)
    : values_(values), how_(how) {
  if (devices == 0) throw bad_request("gpu_aggregator: needs at least one device");
  for (std::size_t d = 0; d < devices; ++d) {
    devices_.push_back(std::make_unique<device>());
    devices_.back()->gradient.assign(values, 0.0f);
  }
  rebuild_plans();
  start_threads();
}

gpu_aggregator::~gpu_aggregator() { stop_threads(); }

float* gpu_aggregator::gradient(std::size_t rank) {
  if (rank >= devices_.size())
    throw bad_request("gpu_aggregator: no device of rank " + std::to_string(rank) + " (" +
                      std::to_string(devices_.size()) + " devices)");
  return devices_[rank]->gradient.data();
}

const float* gpu_aggregator::params(std::size_t rank) const {
  if (rank >= devices_.size())
    throw bad_request("gpu_aggregator: no device of rank " + std::to_string(rank) + " (" +
                      std::to_string(devices_.size()) + " devices)");
  return devices_[rank]->params.empty() ? nullptr : devices_[rank]->params.data();
}

void gpu_aggregator::check_range(std::size_t offset, std::size_t count, const char* what) const {
  if (offset > values_ || count > values_ - offset)
    throw bad_request(std::string("gpu_aggregator: ") + what + " of values [" + std::to_string(offset) + ", " +
                      std::to_string(offset + count) + ") outside the " + std::to_string(values_) + " per device");
}

std::vector<gpu_aggregator::piece> gpu_aggregator::reduce_in_place() { return reduce_in_place(0, values_); }

std::vector<gpu_aggregator::piece> gpu_aggregator::reduce_in_place(std::size_t offset, std::size_t count) {
  check_range(offset, count, "reduce");
  run(in_place_plan_, false, nullptr, offset, count);
  std::vector<piece> pieces;
  for (std::size_t b = 0; b < in_place_plan_.parts; ++b) {
    const elem_range r = block_range(count, in_place_plan_.parts, b);
    if (r.size() == 0) continue;
    const std::size_t at = offset + r.begin;
    pieces.push_back({at, r.size(), devices_[in_place_plan_.result_owner[b]]->gradient.data() + at});
  }
  return pieces;
}

void gpu_aggregator::reduce(float* out) { reduce(out, 0, values_); }

void gpu_aggregator::reduce(float* out, std::size_t offset, std::size_t count) {
  check_range(offset, count, "reduce");
  run(reduce_plan_, false, out, offset, count);
}

void gpu_aggregator::allreduce() { run(allreduce_plan_, false, nullptr, 0, values_); }

void gpu_aggregator::broadcast(const float* params) { broadcast(params, 0, values_); }

void gpu_aggregator::broadcast(const float* params, std::size_t offset, std::size_t count) {
  check_range(offset, count, "broadcast");
  for (auto& d : devices_)
    if (d->params.size() != values_) d->params.assign(values_, 0.0f);
  // The host buffer is only read by a broadcast plan.
  run(broadcast_plan_, true, const_cast<float*>(params), offset, count);
}

void gpu_aggregator::remove_device(std::size_t rank) {
  if (rank >= devices_.size())
    throw bad_request("gpu_aggregator: cannot remove device " + std::to_string(rank) + " of " +
                      std::to_string(devices_.size()));
  if (devices_.size() == 1) throw bad_request("gpu_aggregator: cannot remove the last device");
  stop_threads();
  devices_.erase(devices_.begin() + static_cast<std::ptrdiff_t>(rank));
  rebuild_plans();
  start_threads();
}

void gpu_aggregator::rebuild_plans() {
  in_place_plan_ = make_plan(how_, plan_goal::reduce_in_place, devices_.size());
  reduce_plan_ = make_plan(how_, plan_goal::reduce, devices_.size());
  allreduce_plan_ = make_plan(how_, plan_goal::allreduce, devices_.size());
  broadcast_plan_ = make_plan(how_, plan_goal::broadcast, devices_.size());
}

void gpu_aggregator::start_threads() {
  stopping_ = false;
  finished_ = 0;
  // One executor per CPU this process may use (its affinity mask, so taskset counts), at most
  // one per device. When the executors take every such CPU, executor e is pinned to the
  // e-th: unpinned, the scheduler at times kept both executors of 2 on one CPU for tens of
  // milliseconds (bench_aggregate, block, 2 devices in place: the first cell of a run at
  // 67-76% of the limit in 5 of about 20 runs, 97-115% in 12 of 12 pinned). With fewer
  // executors than CPUs they stay unpinned, so that several processes can share a machine.
  const auto cpus = allowed_cpus();
  executors_ = std::min(devices_.size(), std::max<std::size_t>(1, cpus.size()));
  barrier_ = std::make_unique<std::barrier<>>(static_cast<std::ptrdiff_t>(executors_));
  const bool pin = executors_ > 1 && cpus.size() == executors_;
  // A thread waits for jobs after the current generation (read here, before any job of
  // this thread set can be posted).
  const std::uint64_t gen = generation_;
  for (std::size_t e = 0; e < executors_; ++e)
    threads_.emplace_back([this, e, gen, cpu = pin ? cpus[e] : -1] {
      if (cpu >= 0) pin_to(cpu);
      executor_main(e, gen);
    });
}

void gpu_aggregator::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void gpu_aggregator::run(const reduction_plan& plan, bool on_params, float* host, std::size_t offset,
                         std::size_t count) {
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = job{&plan, on_params, host, offset, count};
  finished_ = 0;
  error_ = nullptr;
  ++generation_;
  start_cv_.notify_all();
  done_cv_.wait(lock, [&] { return finished_ == executors_; });
  if (error_) std::rethrow_exception(error_);
}

void gpu_aggregator::executor_main(std::size_t executor, std::uint64_t seen) {
  kernels::set_thread_limit(1);  // an executor is one core
  for (;;) {
    job j;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      start_cv_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      j = job_;
    }
    execute(executor, j);
    std::lock_guard<std::mutex> lock(mutex_);
    if (++finished_ == executors_) done_cv_.notify_one();
  }
}

void gpu_aggregator::execute(std::size_t executor, const job& j) {
  const reduction_plan& plan = *j.plan;
  auto buffer = [&](std::size_t id) -> float* {
    if (id == plan.host()) return j.host;
    auto& d = *devices_[id];
    return (j.on_params ? d.params.data() : d.gradient.data()) + j.offset;
  };
  for (std::size_t p = 0; p < plan.phases.size(); ++p) {
    if (p > 0) barrier_->arrive_and_wait();
    for (const auto& op : plan.phases[p]) {
      if (op.device % executors_ != executor) continue;
      try {
        apply_op(plan, op, j.count, buffer, [](float* dst, const std::vector<const float*>& srcs, std::size_t count) {
          kernels::sum_n(dst, srcs.data(), srcs.size(), count);  // one source: a copy
        });
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
    }
  }
}

}  // namespace ps
