// The native part of the Python module (actorps._native): a job of a Python worker
// function run by the C++ runtime (embedded, as processes, or one role of a job across
// hosts), and the worker's client with numpy arrays in and out. The Python package
// (python/actorps/) wraps it with docstrings, tensors by name and the PyTorch modules.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <actorps/actorps.hpp>

#include <map>
#include <memory>

#include "libps/core/trace.hpp"
#include "libps/persist/trace_file.hpp"
#include "python/native/worker.hpp"

namespace py = pybind11;

namespace {

// What a worker function returned, as the JSON line the job reports.
std::string result_text(const py::object& out) {
  if (out.is_none()) return "{}";
  if (py::isinstance<py::str>(out)) return out.cast<std::string>();
  return py::module_::import("json").attr("dumps")(out).cast<std::string>();
}

// A Python app as the runtime knows it: registered once per name (the runtime's app table
// keeps its first definition), so what may change from one run to the next (the function,
// tensors and tables) is read through this entry at each call.
struct python_entry {
  py::function worker;
  std::vector<ps::tensor_spec> tensors;
  std::vector<ps::sparse_table_spec> tables;
  std::string rule, consistency;
};

std::shared_ptr<python_entry> entry_for(const std::string& name, python_entry given) {
  // Never destroyed: its Python objects must not be released after the interpreter ends.
  static auto* entries = new std::map<std::string, std::shared_ptr<python_entry>>;
  auto& e = (*entries)[name];
  if (e && (e->rule != given.rule || e->consistency != given.consistency))
    throw ps::bad_request("app " + name + " ran here before with rule " + e->rule + " and consistency " +
                          e->consistency + ": give a job with other defaults another name");
  if (!e) e = std::make_shared<python_entry>();
  *e = std::move(given);
  return e;
}

ps::app_definition python_app(const std::string& name, const std::shared_ptr<python_entry>& e) {
  auto run = [e](ps::worker_context& ctx) -> std::string {
    py::gil_scoped_acquire gil;
    try {
      auto w = std::make_shared<actorps_py::worker>(ctx, e->tensors);
      // The context ends with this call, however it ends: a worker kept past it refuses.
      struct closer {
        std::shared_ptr<actorps_py::worker> w;
        ~closer() { w->close(); }
      } closing{w};
      return result_text(e->worker(w));
    } catch (py::error_already_set& err) {
      throw std::runtime_error(err.what());  // the job reports the worker's failure with Python's message
    }
  };
  ps::app_definition app{name, "a Python worker function", run, e->rule, e->consistency,
                         [e](const ps::node_config&) { return e->tensors; }, {}};
  app.tables = [e](const ps::node_config&) { return e->tables; };
  return app;
}

int run_python_app(const std::string& name, py::function worker, std::vector<ps::tensor_spec> tensors,
                   std::vector<ps::sparse_table_spec> tables, const std::string& rule, const std::string& consistency,
                   const std::vector<std::string>& args, const std::string& program, const std::vector<std::string>& leading) {
  auto e = entry_for(name, {std::move(worker), std::move(tensors), std::move(tables), rule, consistency});
  auto app = python_app(name, e);
  py::gil_scoped_release free;  // workers call back into Python from the runtime's threads
  return ps::run_app(app, args, program, leading);
}

ps::sparse_table_spec table_spec(const std::string& name, std::uint32_t dim, const std::string& rule, float lr,
                                 float init_scale, std::uint64_t seed, float eps) {
  ps::sparse_table_spec t;
  t.name = name;
  t.dim = dim;
  t.rule.kind = rule;
  t.rule.lr = lr;
  t.rule.eps = eps;
  t.init_scale = init_scale;
  t.seed = seed;
  t.validate();
  return t;
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "ActorPS's native client and runtime (use the actorps package)";
  m.attr("__version__") = ACTORPS_VERSION;
  m.attr("protocol_version") = ps::protocol_version;
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const ps::kv_error& e) {
      error(e.what());
    } catch (const ps::bad_request& e) {
      error(e.what());
    }
  });
  py::class_<ps::tensor_spec>(m, "TensorSpec")
    .def(py::init([](const std::string& name, ps::key_type begin, ps::key_type size) {
           return ps::tensor_spec{name, {begin, begin + size}, {size}};
         }),
         py::arg("name"), py::arg("begin"), py::arg("size"))
    .def_property_readonly("name", [](const ps::tensor_spec& t) { return t.name; })
    .def_property_readonly("begin", [](const ps::tensor_spec& t) { return t.keys.begin; })
    .def_property_readonly("size", [](const ps::tensor_spec& t) { return t.keys.end - t.keys.begin; });
  py::class_<ps::sparse_table_spec>(m, "TableSpec")
    .def(py::init(&table_spec), py::arg("name"), py::arg("dim"), py::arg("rule") = "sum", py::arg("lr") = 0.01f,
         py::arg("init_scale") = 0.01f, py::arg("seed") = 1, py::arg("eps") = 1e-8f)
    .def_property_readonly("name", [](const ps::sparse_table_spec& t) { return t.name; })
    .def_property_readonly("dim", [](const ps::sparse_table_spec& t) { return t.dim; });
  m.def("run", &run_python_app, py::arg("name"), py::arg("worker"), py::arg("tensors"), py::arg("tables"),
        py::arg("rule"), py::arg("consistency"), py::arg("args"), py::arg("program"), py::arg("leading"));
  m.def("buffer", &actorps_py::make_buffer, py::arg("n"));
  m.def(
    "check_trace",
    [](const std::string& path) {
      auto r = ps::check_trace(ps::read_trace(path));
      py::dict out;
      out["pushes"] = r.pushes;
      out["pulls"] = r.pulls;
      out["max_lag"] = r.max_lag;
      out["reads_after_leave"] = r.reads_after_leave;
      out["violations"] = r.violations;
      return out;
    },
    py::arg("path"));
  actorps_py::bind_worker(m);
}
