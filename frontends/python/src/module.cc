// kolo._C: the Python binding of kolo's LibTorch frontend (frontends/torch).
// A thin layer: every collective, the gradient reducer and the broadcasts
// are the C++ frontend's; kolo/torch/*.py gives them Horovod's names and
// arguments (docs/python.md).
//
// Errors: the runtime's errors (kolo::torch::Error) become
// kolo._C.KoloInternalError (a RuntimeError) carrying the message unchanged
// and the status code name in `.code`; an error the C++ frontend finds while
// submitting (bad argument, a name already in flight) becomes ValueError.
// Blocking calls release the GIL.
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/extension.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "frontends/python/src/process_group.h"
#include "kolo/runtime.h"
#include "kolo/torch/context.h"
#include "kolo/torch/elastic.h"
#include "kolo/torch/gradient_reducer.h"
#include "runtime/loop/backend.h"

namespace py = pybind11;

namespace kolo {
namespace torch {
namespace {

// A submission's error that the caller can fix (it becomes ValueError).
bool CallersError(const Error& e) {
  return e.code() == absl::StatusCode::kInvalidArgument ||
         e.code() == absl::StatusCode::kAlreadyExists;
}

template <typename F>
auto Submitting(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    if (CallersError(e)) throw py::value_error(e.what());
    throw;
  }
}

std::shared_ptr<Context> Default() { return default_context(); }

ReduceOp ToOp(int op) {
  if (op < 0 || op > static_cast<int>(ReduceOp::kProduct)) {
    throw py::value_error(absl::StrCat("unknown reduce op ", op));
  }
  return static_cast<ReduceOp>(op);
}

// The name is taken by value and moved: the string pybind11 made for the
// call is the one the options keep (a setter chain returns a reference,
// which `return` would copy).
AllreduceOptions OptionsOf(std::string name, int op, double prescale,
                           double postscale, int process_set) {
  AllreduceOptions options;
  options.name(std::move(name))
      .op(ToOp(op))
      .prescale(prescale)
      .postscale(postscale)
      .process_set(process_set);
  return options;
}

Handle Allreduce(const at::Tensor& tensor, std::string name, int op,
                 double prescale, double postscale, int process_set,
                 bool in_place) {
  const AllreduceOptions options =
      OptionsOf(std::move(name), op, prescale, postscale, process_set);
  return Submitting([&] {
    return in_place ? Default()->allreduce_async_(tensor, options)
                    : Default()->allreduce_async(tensor, options);
  });
}

// allreduce / allreduce_: a blocking call (Runtime::AllreduceAndWait), the
// GIL released while it runs; a submission's error is ValueError as for
// allreduce_async, the collective's KoloInternalError as for synchronize.
at::Tensor AllreduceBlocking(const at::Tensor& tensor, std::string name, int op,
                             double prescale, double postscale, int process_set,
                             bool in_place) {
  const AllreduceOptions options =
      OptionsOf(std::move(name), op, prescale, postscale, process_set);
  try {
    py::gil_scoped_release release;
    return in_place ? Default()->allreduce_(tensor, options)
                    : Default()->allreduce(tensor, options);
  } catch (const Error& e) {
    if (!e.outcome() && CallersError(e)) throw py::value_error(e.what());
    throw;
  }
}

Handle GroupedAllreduce(const std::vector<at::Tensor>& tensors,
                        const std::string& name, int op, double prescale,
                        double postscale, int process_set, bool in_place) {
  const GroupedAllreduceOptions options = GroupedAllreduceOptions()
                                              .name(name)
                                              .op(ToOp(op))
                                              .prescale(prescale)
                                              .postscale(postscale)
                                              .process_set(process_set);
  return Submitting([&] {
    return in_place ? Default()->grouped_allreduce_async_(tensors, options)
                    : Default()->grouped_allreduce_async(tensors, options);
  });
}

Handle Broadcast(const at::Tensor& tensor, int root, const std::string& name,
                 int process_set, bool in_place) {
  const BroadcastOptions options =
      BroadcastOptions().name(name).root(root).process_set(process_set);
  return Submitting([&] {
    return in_place ? Default()->broadcast_async_(tensor, options)
                    : Default()->broadcast_async(tensor, options);
  });
}

DistributedOptimizerOptions ReducerOptions(
    int op, int backward_passes_per_step, int compression,
    double gradient_predivide_factor, bool sparse_as_dense, int num_groups,
    std::vector<std::vector<std::string>> groups, int process_set,
    const std::string& name_prefix) {
  if (compression < 0 || compression > static_cast<int>(Compression::kBf16)) {
    throw py::value_error(absl::StrCat("unknown compression ", compression));
  }
  return DistributedOptimizerOptions()
      .op(ToOp(op))
      .backward_passes_per_step(backward_passes_per_step)
      .compression(static_cast<Compression>(compression))
      .gradient_predivide_factor(gradient_predivide_factor)
      .sparse_as_dense(sparse_as_dense)
      .num_groups(num_groups)
      .groups(std::move(groups))
      .process_set(process_set)
      .name_prefix(name_prefix);
}

bool Built(const char* what) {
  const std::string name = what;
  if (name == "cuda" || name == "nccl") {
    return BackendRegistry::Get().Has(DeviceType::kCuda);
  }
  if (name == "gloo")
    return BackendRegistry::Get().Has(DeviceType::kCpu, "gloo");
  return false;
}

}  // namespace
}  // namespace torch
}  // namespace kolo

PYBIND11_MODULE(_C, m) {
  using namespace kolo::torch;
  m.doc() = "kolo's C++ frontend; use kolo.torch (Horovod's API) instead.";

  static py::exception<Error> internal_error(m, "KoloInternalError",
                                             PyExc_RuntimeError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      py::object type =
          py::reinterpret_borrow<py::object>(internal_error.ptr());
      py::object error = type(e.what());
      error.attr("code") = py::str(absl::StatusCodeToString(e.code()));
      PyErr_SetObject(internal_error.ptr(), error.ptr());
    }
  });

  // Horovod's semantics: while ranks have joined, Average divides by the
  // set size (joined ranks contribute zeros).
  m.def(
      "init",
      [] {
        absl::StatusOr<kolo::Options> options =
            kolo::Runtime::OptionsFromEnvironment();
        if (!options.ok()) throw Error(options.status());
        options->join_average_over_set_size = true;
        init(*options);
      },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "shutdown", [] { shutdown(); }, py::call_guard<py::gil_scoped_release>());
  // Elastic jobs (kolo/torch/elastic.py over kolo::torch::elastic).
  m.def("elastic_enabled", &elastic::enabled);
  m.def("elastic_generation", &elastic::generation);
  m.def("elastic_hosts_updated", &elastic::hosts_updated,
        py::call_guard<py::gil_scoped_release>());
  m.def(
      "elastic_reset",
      [] {
        return elastic::reset([](kolo::Options* options) {
          options->join_average_over_set_size = true;
        });
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("is_initialized", &is_initialized);
  m.def("rank", [] { return rank(); });
  m.def("size", [] { return size(); });
  m.def("local_rank", [] { return local_rank(); });
  m.def("local_size", [] { return local_size(); });
  m.def("cross_rank", [] { return cross_rank(); });
  m.def("cross_size", [] { return cross_size(); });
  m.def("built", &Built, "Whether this build has a backend: cuda, nccl, gloo");
  m.def(
      "nccl_version",
      [] {
        return kolo::BackendRegistry::Get().Version(kolo::DeviceType::kCuda,
                                                    "nccl");
      },
      "NCCL_VERSION_CODE of the NCCL this build uses (e.g. 22803); 0: none");
  // The runtime's statistics (kolo::RuntimeStats) and its mechanisms'
  // counters (kolo::Runtime::Counters: benchmarks, diagnostics).
  m.def("stats", [] {
    const kolo::RuntimeStats s = default_context()->runtime().stats();
    py::dict d;
    d["tensors_executed"] = s.tensors_executed;
    d["collectives_executed"] = s.collectives_executed;
    d["negotiation_messages_sent"] = s.negotiation_messages_sent;
    d["negotiation_messages_received"] = s.negotiation_messages_received;
    d["host_buffer_bytes"] = s.host_buffer_bytes;
    return d;
  });
  m.def("counters", [] { return default_context()->runtime().Counters(); });

  py::class_<Handle>(m, "Handle")
      .def("poll", &Handle::poll)
      .def("wait", &Handle::wait, py::call_guard<py::gil_scoped_release>())
      .def("wait_all", &Handle::wait_all,
           py::call_guard<py::gil_scoped_release>())
      .def("received_splits", &Handle::received_splits)
      .def_property_readonly("name", &Handle::name);

  m.def("allreduce_async", &Allreduce, py::arg("tensor"), py::arg("name"),
        py::arg("op"), py::arg("prescale"), py::arg("postscale"),
        py::arg("process_set"), py::arg("in_place"));
  m.def("allreduce", &AllreduceBlocking, py::arg("tensor"), py::arg("name"),
        py::arg("op"), py::arg("prescale"), py::arg("postscale"),
        py::arg("process_set"), py::arg("in_place"));
  m.def("grouped_allreduce_async", &GroupedAllreduce, py::arg("tensors"),
        py::arg("name"), py::arg("op"), py::arg("prescale"),
        py::arg("postscale"), py::arg("process_set"), py::arg("in_place"));
  m.def("broadcast_async", &Broadcast, py::arg("tensor"), py::arg("root"),
        py::arg("name"), py::arg("process_set"), py::arg("in_place"));
  m.def(
      "allgather_async",
      [](const at::Tensor& tensor, const std::string& name, int process_set) {
        return Submitting([&] {
          return default_context()->allgather_async(
              tensor, AllgatherOptions().name(name).process_set(process_set));
        });
      },
      py::arg("tensor"), py::arg("name"), py::arg("process_set"));
  m.def(
      "alltoall_async",
      [](const at::Tensor& tensor, std::vector<int64_t> splits,
         const std::string& name, int process_set) {
        return Submitting([&] {
          return default_context()->alltoall_async(
              tensor, AlltoallOptions()
                          .name(name)
                          .splits(std::move(splits))
                          .process_set(process_set));
        });
      },
      py::arg("tensor"), py::arg("splits"), py::arg("name"),
      py::arg("process_set"));
  m.def(
      "reducescatter_async",
      [](const at::Tensor& tensor, const std::string& name, int op,
         double prescale, double postscale, int process_set) {
        return Submitting([&] {
          return default_context()->reducescatter_async(
              tensor, ReducescatterOptions()
                          .name(name)
                          .op(ToOp(op))
                          .prescale(prescale)
                          .postscale(postscale)
                          .process_set(process_set));
        });
      },
      py::arg("tensor"), py::arg("name"), py::arg("op"), py::arg("prescale"),
      py::arg("postscale"), py::arg("process_set"));
  m.def(
      "broadcast_bytes",
      [](const py::bytes& data, int root, const std::string& name,
         int process_set) {
        std::string in = data;
        std::string out;
        {
          py::gil_scoped_release release;
          out = Submitting([&] {
            return default_context()->broadcast_bytes(
                in, BroadcastOptions().name(name).root(root).process_set(
                        process_set));
          });
        }
        return py::bytes(out);
      },
      py::arg("data"), py::arg("root"), py::arg("name"),
      py::arg("process_set"));
  m.def(
      "barrier",
      [](int process_set) { default_context()->barrier(process_set); },
      py::arg("process_set"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "join", [] { return default_context()->join(); },
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "add_process_set",
      [](const std::vector<int>& ranks) {
        return Submitting(
            [&] { return default_context()->add_process_set(ranks); });
      },
      py::arg("ranks"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "add_process_set_of_members",
      [](const std::vector<int>& ranks, const std::string& key) {
        return Submitting([&] {
          return default_context()->add_member_process_set(ranks, key);
        });
      },
      py::arg("ranks"), py::arg("key"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "remove_process_set",
      [](int id) {
        Submitting([&] {
          default_context()->remove_process_set(id);
          return 0;
        });
      },
      py::arg("process_set"), py::call_guard<py::gil_scoped_release>());
  m.def(
      "process_set_ranks",
      [](int id) { return default_context()->process_set_ranks(id); },
      py::arg("process_set"));
  m.def(
      "start_timeline",
      [](const std::string& path, bool mark_cycles) {
        absl::Status s =
            default_context()->runtime().StartTimeline(path, mark_cycles);
        if (!s.ok()) throw Error(s);
      },
      py::arg("path"), py::arg("mark_cycles"));
  m.def("stop_timeline", [] {
    absl::Status s = default_context()->runtime().StopTimeline();
    if (!s.ok()) throw Error(s);
  });

  py::class_<GradientReducer>(m, "GradientReducer")
      .def(py::init([](std::vector<std::pair<std::string, at::Tensor>> params,
                       int op, int backward_passes_per_step, int compression,
                       double gradient_predivide_factor, bool sparse_as_dense,
                       int num_groups,
                       std::vector<std::vector<std::string>> groups,
                       int process_set, const std::string& name_prefix) {
             return Submitting([&] {
               return std::make_unique<GradientReducer>(
                   std::move(params),
                   ReducerOptions(op, backward_passes_per_step, compression,
                                  gradient_predivide_factor, sparse_as_dense,
                                  num_groups, std::move(groups), process_set,
                                  name_prefix));
             });
           }),
           py::arg("parameters"), py::arg("op"),
           py::arg("backward_passes_per_step"), py::arg("compression"),
           py::arg("gradient_predivide_factor"), py::arg("sparse_as_dense"),
           py::arg("num_groups"), py::arg("groups"), py::arg("process_set"),
           py::arg("name_prefix"))
      .def("synchronize", &GradientReducer::synchronize,
           py::call_guard<py::gil_scoped_release>())
      .def("skip_synchronize", &GradientReducer::skip_synchronize)
      .def("before_step", &GradientReducer::BeforeStep,
           py::call_guard<py::gil_scoped_release>())
      .def("after_step", &GradientReducer::AfterStep)
      .def("before_zero_grad", &GradientReducer::BeforeZeroGrad)
      .def("reset", &GradientReducer::reset,
           py::call_guard<py::gil_scoped_release>())
      .def("names", &GradientReducer::names);

  // The torch.distributed backend (kolo/torch/distributed.py registers it):
  // a subclass of torch's Backend (its ProcessGroup on 1.13), whose Python
  // type torch.distributed defines (imported first).
  py::module_::import("torch.distributed");
  py::class_<ProcessGroupKolo, KoloBackendBase,
             c10::intrusive_ptr<ProcessGroupKolo>>(m, "ProcessGroupKolo")
      .def(py::init([](int process_set, int rank, int size,
                       const std::string& group, int64_t timeout_ms) {
             if (timeout_ms < 0) {
               throw py::value_error(absl::StrCat(
                   "the kolo backend's timeout must not be negative, got ",
                   timeout_ms, " ms"));
             }
             return c10::make_intrusive<ProcessGroupKolo>(
                 default_context(), process_set, rank, size, group,
                 std::chrono::milliseconds(timeout_ms));
           }),
           py::arg("process_set"), py::arg("rank"), py::arg("size"),
           py::arg("group"), py::arg("timeout_ms") = 0)
      .def("_connect_point_to_point", &ProcessGroupKolo::ConnectPointToPoint,
           py::arg("store"), py::call_guard<py::gil_scoped_release>())
      .def("_point_to_point_transport",
           &ProcessGroupKolo::PointToPointTransport)
      .def_property_readonly("process_set", &ProcessGroupKolo::process_set);
}
