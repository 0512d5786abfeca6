// The worker's client on numpy arrays: pushes share an actorps buffer or copy an array
// once (as a C++ caller's vector would be), pulls land in an actorps buffer in place.
#include "python/native/worker.hpp"

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>

namespace actorps_py {

namespace {

constexpr const char* buffer_capsule = "actorps.buffer";

// The memory of an actorps.buffer array: a vector whose heap block never moves (a pull
// takes the vector and gives it back), lent to at most one request that writes into it
// and to none while pushes read it.
struct buffer_state {
  std::mutex mtx;
  std::vector<float> values;
  const float* data = nullptr;  // where the block is, lent or not
  std::size_t size = 0;
  bool lent = false;         // a pull holds the vector
  std::size_t reading = 0;   // pushes in flight read it
  // A pull into it failed: parts of it may still land, so the memory stays the failed
  // op's (kept alive here) and the buffer is not used again.
  std::optional<ps::kv_future> failed;

  // Refuses when a request in flight is using it in a way `what` cannot share.
  void check_free(const std::string& what, bool writes) {
    if (failed)
      throw ps::bad_request(what + ": a pull into this buffer failed, and parts of it may still land there: " +
                            "make a new one with actorps.buffer");
    if (lent || (writes && reading > 0))
      throw ps::bad_request(what + ": the buffer is in use by a " + (lent ? "pull" : "push") +
                            " still in flight (wait for its future first)");
  }
};

// The state behind an array made by make_buffer, when `a` is all of it; else null.
std::shared_ptr<buffer_state> buffer_of(const py::array& a) {
  py::object base = a.base();
  if (!base || !py::isinstance<py::capsule>(base)) return nullptr;
  auto cap = py::reinterpret_borrow<py::capsule>(base);
  if (cap.name() == nullptr || std::strcmp(cap.name(), buffer_capsule) != 0) return nullptr;
  auto& held = *cap.get_pointer<std::shared_ptr<buffer_state>>();
  if (a.data() != static_cast<const void*>(held->data) || static_cast<std::size_t>(a.size()) != held->size) return nullptr;
  return held;
}

// A push's values: an actorps buffer is shared for as long as the push reads it.
std::shared_ptr<std::vector<float>> lend_for_push(const std::shared_ptr<buffer_state>& b, const std::string& what) {
  std::lock_guard guard(b->mtx);
  b->check_free(what, false);
  ++b->reading;
  return std::shared_ptr<std::vector<float>>(b, &b->values);
}

// A float32 array's values: copied once (an actorps buffer is shared instead: lend_for_push).
std::shared_ptr<std::vector<float>> values_of(const py::array& a, std::size_t expected, const std::string& what) {
  if (!py::isinstance<py::array_t<float>>(a) || a.dtype().kind() != 'f' || a.itemsize() != 4)
    throw ps::bad_request(what + ": values must be a float32 array, not " + py::str(a.dtype()).cast<std::string>());
  if (static_cast<std::size_t>(a.size()) != expected)
    throw ps::bad_request(what + ": " + std::to_string(a.size()) + " values for " + std::to_string(expected));
  auto c = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(a);
  return std::make_shared<std::vector<float>>(c.data(), c.data() + c.size());
}

std::vector<std::uint64_t> ids_of(const py::array& ids) {
  const char kind = ids.dtype().kind();
  if (kind != 'u' && kind != 'i')
    throw ps::bad_request("row ids must be an integer array, not " + py::str(ids.dtype()).cast<std::string>());
  if (kind == 'i') {  // negative ids would wrap around to huge ones
    auto s = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(ids);
    for (py::ssize_t i = 0; i < s.size(); ++i)
      if (s.data()[i] < 0) throw ps::bad_request("row id " + std::to_string(s.data()[i]) + " is negative");
  }
  auto c = py::array_t<std::uint64_t, py::array::c_style | py::array::forcecast>::ensure(ids);
  return {c.data(), c.data() + c.size()};
}

}  // namespace

py::array make_buffer(std::size_t n) {
  auto state = std::make_shared<buffer_state>();
  state->values.assign(n, 0.0f);
  state->data = state->values.data();
  state->size = n;
  auto* held = new std::shared_ptr<buffer_state>(state);
  py::capsule owner(held, buffer_capsule, [](PyObject* cap) {
    delete static_cast<std::shared_ptr<buffer_state>*>(PyCapsule_GetPointer(cap, buffer_capsule));
  });
  return py::array_t<float>({static_cast<py::ssize_t>(n)}, {sizeof(float)}, state->data, owner);
}

bool future::wait(std::optional<double> timeout_s) {
  if (f_.ready()) {  // done already: no GIL hand-over (it costs microseconds per request)
    settle_(f_);
    return true;
  }
  bool done = false;
  {
    py::gil_scoped_release free;  // other Python threads go on meanwhile
    using namespace std::chrono;
    const auto until = steady_clock::now() + milliseconds(static_cast<std::int64_t>(timeout_s.value_or(0) * 1000));
    // In slices: a request of a job that has ended is never answered (its client is gone).
    for (;;) {
      auto slice = milliseconds(100);
      if (timeout_s) slice = std::min(slice, duration_cast<milliseconds>(until - steady_clock::now()));
      if ((done = f_.wait_for(std::max(slice, milliseconds(0)))) || (job_open_ && !*job_open_)) break;
      if (timeout_s && steady_clock::now() >= until) break;
    }
  }
  if (done) {
    settle_(f_);
  } else if (job_open_ && !*job_open_) {
    throw ps::kv_error("this request's job ended before it was answered (wait for requests inside the worker function)");
  }
  return done;
}

py::object future::result() {
  wait(std::nullopt);
  if (taken_) throw ps::bad_request("this future's result was taken already");
  taken_ = true;
  if (!into_.is_none()) {  // landed in place: the buffer is back in the caller's array
    if (auto err = f_.error(); !err.empty()) throw ps::kv_error(err);
    return into_;
  }
  auto values = f_.get();  // throws kv_error with the client's message
  if (shape_.empty()) return py::none();
  auto* held = new std::vector<float>(std::move(values));
  py::capsule owner(held, [](void* p) { delete static_cast<std::vector<float>*>(p); });
  return py::array_t<float>(shape_, held->data(), owner);
}

future worker::track(future f) const {
  f.job_open_ = open_;
  return f;
}

worker::worker(ps::worker_context& ctx, const std::vector<ps::tensor_spec>& tensors) : ctx_(&ctx) {
  for (const auto& t : tensors) tensors_[t.name] = t.keys;
}

ps::worker_context& worker::ctx() const {
  if (!ctx_) throw ps::bad_request("this worker's job has ended: use the worker only inside the worker function");
  return *ctx_;
}

ps::key_set worker::keys_of(const std::string& tensor) const {
  auto it = tensors_.find(tensor);
  if (it == tensors_.end()) {
    std::string known;
    for (const auto& [name, r] : tensors_) known += (known.empty() ? "" : ", ") + name;
    throw ps::bad_request("no tensor \"" + tensor + "\" in this job (its tensors: " + (known.empty() ? "none" : known) + ")");
  }
  return ps::key_set::single(it->second);
}

future worker::push(const std::string& tensor, py::array values) {
  auto keys = keys_of(tensor);
  const auto what = "push to " + tensor;
  auto shared = buffer_of(values);
  if (!shared) return track(future(ctx().kv.push(keys, values_of(values, keys.num_keys(), what))));
  if (shared->size != keys.num_keys())
    throw ps::bad_request(what + ": " + std::to_string(shared->size) + " values for " + std::to_string(keys.num_keys()));
  auto& kv = ctx().kv;  // a worker past its job refuses before the buffer is lent
  auto done_reading = [shared](ps::kv_future&) {
    std::lock_guard guard(shared->mtx);
    --shared->reading;
  };
  ps::kv_future f;
  try {
    f = kv.push(keys, lend_for_push(shared, what));  // no copy: the push reads the buffer
  } catch (...) {
    done_reading(f);
    throw;
  }
  return track(future(f, py::none(), {}, {.fn = done_reading}));
}

future worker::init(const std::string& tensor, py::array values) {
  auto keys = keys_of(tensor);
  auto v = values_of(values, keys.num_keys(), "init of " + tensor);
  return track(future(ctx().kv.init(keys, std::move(*v))));
}

future worker::pull(const std::string& tensor, py::object out) {
  auto keys = keys_of(tensor);
  const auto n = static_cast<py::ssize_t>(keys.num_keys());
  if (out.is_none()) return track(future(ctx().kv.pull(keys), py::none(), {n}));
  auto arr = py::reinterpret_borrow<py::array>(out);
  auto held = buffer_of(arr);
  const auto what = "pull of " + tensor;
  if (!held)
    throw ps::bad_request(what + ": out= takes an array made by actorps.buffer(" + std::to_string(n) +
                          ") (the pull lands in its memory), not another array");
  if (arr.size() != n)
    throw ps::bad_request(what + ": out= holds " + std::to_string(arr.size()) + " floats, the tensor " +
                          std::to_string(n));
  auto& kv = ctx().kv;  // a worker past its job refuses before the buffer is lent
  std::vector<float> lent;
  {
    std::lock_guard guard(held->mtx);
    held->check_free(what, true);
    held->lent = true;
    lent = std::move(held->values);
  }
  // The pull writes into the buffer's memory, which the op holds until it is done; then the
  // vector goes back to the buffer. (The keys are a declared tensor's: the request cannot be
  // refused before it leaves, which would free the memory with the vector.)
  auto f = kv.pull(keys, std::move(lent));
  return track(future(f, arr, {n}, {.fn = [held](ps::kv_future& done) {
                                std::lock_guard guard(held->mtx);
                                if (!done.error().empty()) {
                                  held->failed = done;  // its memory stays the op's
                                  return;
                                }
                                held->values = done.take_values();
                                held->lent = false;
                              }}));
}

future worker::push_rows(std::uint32_t table, py::array ids, py::array grads) {
  auto row_ids = ids_of(ids);
  auto g = values_of(grads, row_ids.size() * ctx().kv.table_dim(table), "push of rows");
  return track(future(ctx().kv.push_rows(table, row_ids, *g)));
}

future worker::pull_rows(std::uint32_t table, py::array ids) {
  auto row_ids = ids_of(ids);
  const auto dim = static_cast<py::ssize_t>(ctx().kv.table_dim(table));
  const auto rows = static_cast<py::ssize_t>(row_ids.size());
  return track(future(ctx().kv.pull_rows(table, row_ids), py::none(), {rows, dim}));
}

future worker::tick(std::uint64_t clock) { return track(future(ctx().kv.advance_clock(clock))); }
future worker::leave() { return track(future(ctx().kv.leave_clock_vector())); }

void worker::barrier() {
  auto& c = ctx();
  py::gil_scoped_release free;
  c.barrier();
}

void worker::report(const std::string& text) { ctx().report(text); }

void bind_worker(py::module_& m) {
  py::class_<future>(m, "Future", "A request in flight; waits release the GIL.")
    .def("done", &future::done, "Whether the request is done (never waits).")
    .def("wait", &future::wait, py::arg("timeout") = py::none(),
         "Waits, releasing the GIL, at most timeout seconds (None: until done); False when still pending.")
    .def("result", &future::result,
         "Waits; the pulled array (out= itself for a pull into a buffer), None for a push, init or tick; raises "
         "actorps.Error with the client's message when the request failed.");
  py::class_<worker, std::shared_ptr<worker>>(m, "Worker",
                                             "A worker's handle on its job, valid while the worker function runs.")
    .def_property_readonly("id", &worker::id)
    .def_property_readonly("num_workers", &worker::num_workers)
    .def_property_readonly("start_clock", &worker::start_clock)
    .def("push", &worker::push, py::arg("tensor"), py::arg("values"),
         "Folds float32 values (the whole tensor) into it with the job's rule; an actorps.buffer is not copied.")
    .def("init", &worker::init, py::arg("tensor"), py::arg("values"),
         "Sets the tensor where it was never set (the first initializer wins).")
    .def("pull", &worker::pull, py::arg("tensor"), py::arg("out") = py::none(),
         "The tensor's values: a new array, or landing in out= (an actorps.buffer of the tensor's size).")
    .def("push_rows", &worker::push_rows, py::arg("table"), py::arg("ids"), py::arg("grads"),
         "Folds grads (len(ids) x dim float32) into rows ids of table `table` (by index) with its rule.")
    .def("pull_rows", &worker::pull_rows, py::arg("table"), py::arg("ids"),
         "Rows ids of table `table` as a (len(ids), dim) array; rows never touched are created first.")
    .def("tick", &worker::tick, py::arg("clock"), "This worker has completed `clock` iterations (SSP, BSP).")
    .def("leave", &worker::leave, "This worker has finished its iterations: reads stop waiting for it.")
    .def("barrier", &worker::barrier, "Waits, releasing the GIL, until every running worker reached it.")
    .def("report", &worker::report, py::arg("text"), "A progress line for the job's observer.")
    .def("table_dim", &worker::table_dim, py::arg("table"));
}

}  // namespace actorps_py
