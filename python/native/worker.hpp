#pragma once
// A Python worker's side of the job: its client on numpy arrays (worker), the futures of
// its requests (future) and the float buffers pulls land in without a copy (make_buffer).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <actorps/actorps.hpp>

namespace actorps_py {

namespace py = pybind11;

// What must happen once a request is done, before its caller sees it done (a buffer given
// back to its array): run by whichever comes first, the client's thread or a wait.
struct settle {
  std::shared_ptr<std::once_flag> once = std::make_shared<std::once_flag>();
  std::function<void(ps::kv_future&)> fn;  // given the done request
  void operator()(ps::kv_future& done) const {
    if (fn) std::call_once(*once, fn, done);
  }
};

// A request in flight. Waiting releases the GIL; result() is the pulled array (None for a
// push, an init or a tick) or raises actorps.Error with the client's message.
class future {
 public:
  future(ps::kv_future f, py::object into = py::none(), std::vector<py::ssize_t> shape = {}, settle s = settle{})
      : f_(std::move(f)), into_(std::move(into)), shape_(std::move(shape)), settle_(std::move(s)) {
    if (settle_.fn) f_.then([s = settle_](ps::kv_future done) { s(done); });
  }
  // Never waits; a done request is settled first (a buffer back in its array).
  bool done() {
    if (!f_.ready()) return false;
    settle_(f_);
    return true;
  }
  // False when still pending after timeout_s (None: wait for it).
  bool wait(std::optional<double> timeout_s);
  py::object result();

 private:
  ps::kv_future f_;
  py::object into_;  // the caller's array a pull lands in (None: a fresh one)
  std::vector<py::ssize_t> shape_;
  settle settle_;
  bool taken_ = false;
  std::shared_ptr<const std::atomic<bool>> job_open_;  // the worker's: false once its job ended
  friend class worker;
};

// The worker function's handle on the job, valid while that function runs.
class worker {
 public:
  worker(ps::worker_context& ctx, const std::vector<ps::tensor_spec>& tensors);
  std::uint32_t id() const { return ctx().id; }
  std::uint32_t num_workers() const { return ctx().num_workers; }
  std::uint64_t start_clock() const { return ctx().start_clock; }
  future push(const std::string& tensor, py::array values);
  future init(const std::string& tensor, py::array values);
  future pull(const std::string& tensor, py::object out);
  future push_rows(std::uint32_t table, py::array ids, py::array grads);
  future pull_rows(std::uint32_t table, py::array ids);
  future tick(std::uint64_t clock);
  future leave();
  void barrier();
  void report(const std::string& text);
  std::uint32_t table_dim(std::uint32_t table) const { return ctx().kv.table_dim(table); }
  void close() {
    ctx_ = nullptr;
    *open_ = false;
  }

 private:
  ps::worker_context& ctx() const;
  ps::key_set keys_of(const std::string& tensor) const;
  future track(future f) const;  // the future learns when this worker's job ends
  ps::worker_context* ctx_;
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(true);
  std::map<std::string, ps::key_range> tensors_;
};

// n zeroed float32s as a numpy array whose memory a pull can land in, in place.
py::array make_buffer(std::size_t n);

void bind_worker(py::module_& m);

}  // namespace actorps_py
