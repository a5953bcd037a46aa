// The public Runtime: argument checks, then hand-off to RuntimeImpl.
#include "kolo/runtime.h"

#include "absl/strings/str_cat.h"
#include "runtime/backend.h"
#include "runtime/config.h"
#include "runtime/runtime_impl.h"

namespace kolo {
namespace {

absl::Status Invalid(const char* op, const std::string& name,
                     const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, " \"", name, "\": ", what));
}

absl::Status CheckTensor(const char* op, const std::string& name,
                         const char* role, const TensorView& t) {
  if (name.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": every collective needs a non-empty name"));
  }
  if (static_cast<int>(t.dtype) < 0 ||
      static_cast<int>(t.dtype) >= kNumDataTypes) {
    return Invalid(op, name, absl::StrCat(role, " has an unknown dtype"));
  }
  for (int64_t d : t.shape) {
    if (d < 0) {
      return Invalid(op, name, absl::StrCat(role, " has a negative dimension: ",
                                            ShapeToString(t.shape)));
    }
  }
  if (t.data == nullptr && t.NumElements() > 0) {
    return Invalid(op, name, absl::StrCat(role, " has no data pointer"));
  }
  if (!BackendRegistry::Get().Has(t.device.type)) {
    return Invalid(op, name,
                   absl::StrCat(role, " is on ", t.device.ToString(),
                                ", for which this build has no backend"));
  }
  return absl::OkStatus();
}

wire::Request BaseRequest(wire::CollectiveType type, const std::string& name,
                          const TensorView& t) {
  wire::Request r;
  r.set_type(type);
  r.set_name(name);
  r.set_dtype(static_cast<int>(t.dtype));
  for (int64_t d : t.shape) r.add_shape(d);
  r.set_device_type(static_cast<int>(t.device.type));
  r.set_device_index(t.device.index);
  r.set_prescale(1.0);
  r.set_postscale(1.0);
  return r;
}

}  // namespace

Runtime::Runtime(std::shared_ptr<RuntimeImpl> impl) : impl_(std::move(impl)) {}

Runtime::~Runtime() {
  if (impl_) impl_->Abort();
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(const Options& options) {
  absl::Status s = ValidateOptions(options);
  if (!s.ok()) return s;
  auto impl = std::make_shared<RuntimeImpl>(options);
  s = impl->Start();
  if (!s.ok()) {
    impl->Abort();
    return s;
  }
  return std::unique_ptr<Runtime>(new Runtime(std::move(impl)));
}

absl::StatusOr<Options> Runtime::OptionsFromEnvironment() {
  return ParseOptions(ProcessEnvironment());
}

int Runtime::rank() const { return impl_->options().rank; }
int Runtime::size() const { return impl_->options().size; }
int Runtime::local_rank() const { return impl_->options().local_rank; }
int Runtime::local_size() const { return impl_->options().local_size; }
int Runtime::cross_rank() const { return impl_->options().cross_rank; }
int Runtime::cross_size() const { return impl_->options().cross_size; }

absl::StatusOr<Work> Runtime::Allreduce(const AllreduceRequest& req) {
  const char* op = "allreduce";
  absl::Status s = CheckTensor(op, req.name, "input", req.input);
  if (!s.ok()) return s;
  s = CheckTensor(op, req.name, "output", req.output);
  if (!s.ok()) return s;
  if (req.output.dtype != req.input.dtype ||
      req.output.shape != req.input.shape ||
      req.output.device != req.input.device) {
    return Invalid(op, req.name,
                   absl::StrCat("output (", DataTypeName(req.output.dtype),
                                ShapeToString(req.output.shape),
                                ") must match input (",
                                DataTypeName(req.input.dtype),
                                ShapeToString(req.input.shape), ")"));
  }
  if (static_cast<int>(req.op) < 0 || static_cast<int>(req.op) > 4) {
    return Invalid(op, req.name, "unknown reduce op");
  }
  if (!IsFloatingPoint(req.input.dtype)) {
    if (req.op == ReduceOp::kAverage) {
      return Invalid(op, req.name,
                     absl::StrCat("average is not defined for integer dtype ",
                                  DataTypeName(req.input.dtype),
                                  "; use sum and divide"));
    }
    if (req.prescale != 1.0 || req.postscale != 1.0) {
      return Invalid(op, req.name,
                     absl::StrCat("scale factors other than 1 are not defined "
                                  "for integer dtype ",
                                  DataTypeName(req.input.dtype)));
    }
  }
  TensorEntry entry;
  entry.request = BaseRequest(wire::ALLREDUCE, req.name, req.input);
  entry.request.set_op(static_cast<int>(req.op));
  entry.request.set_prescale(req.prescale);
  entry.request.set_postscale(req.postscale);
  entry.input = req.input;
  entry.output = req.output;
  return impl_->Submit(std::move(entry));
}

absl::StatusOr<Work> Runtime::Broadcast(const BroadcastRequest& req) {
  const char* op = "broadcast";
  absl::Status s = CheckTensor(op, req.name, "tensor", req.tensor);
  if (!s.ok()) return s;
  if (req.root < 0 || req.root >= size()) {
    return Invalid(op, req.name,
                   absl::StrCat("root ", req.root,
                                " is not a rank of this job (size ", size(),
                                ")"));
  }
  TensorEntry entry;
  entry.request = BaseRequest(wire::BROADCAST, req.name, req.tensor);
  entry.request.set_root(req.root);
  entry.input = req.tensor;
  entry.output = req.tensor;
  return impl_->Submit(std::move(entry));
}

absl::StatusOr<Work> Runtime::Allgather(const AllgatherRequest& req) {
  const char* op = "allgather";
  absl::Status s = CheckTensor(op, req.name, "input", req.input);
  if (!s.ok()) return s;
  if (req.input.shape.empty()) {
    return Invalid(op, req.name,
                   "input must have at least one dimension (the one gathered)");
  }
  if (!req.allocator) {
    return Invalid(op, req.name, "an output allocator is required");
  }
  TensorEntry entry;
  entry.request = BaseRequest(wire::ALLGATHER, req.name, req.input);
  entry.input = req.input;
  entry.allocator = req.allocator;
  return impl_->Submit(std::move(entry));
}

absl::Status Runtime::Shutdown(absl::Duration timeout) {
  return impl_->Shutdown(timeout);
}

void Runtime::Abort() { impl_->Abort(); }

}  // namespace kolo
