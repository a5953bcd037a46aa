// The public Runtime: argument checks, then hand-off to RuntimeImpl.
#include "kolo/runtime.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/api/config.h"
#include "runtime/api/exit_guard.h"
#include "runtime/api/work_state.h"
#include "runtime/loop/backend.h"
#include "runtime/loop/runtime_impl.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/format.h"
#include "runtime/util/status_macros.h"

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
      return Invalid(op, name,
                     absl::StrCat(role, " has a negative dimension: ",
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
  if (t.device.type == DeviceType::kCuda && t.dtype == DataType::kInt16) {
    // NCCL, the only CUDA backend, has no 16-bit integer type.
    return Invalid(
        op, name,
        absl::StrCat(role, " is an int16 tensor on ", t.device.ToString(),
                     ": NCCL has no 16-bit integer type; use int32 "
                     "(or int16 on the CPU)"));
  }
  if (t.device.index < 0) {
    return Invalid(
        op, name,
        absl::StrCat(role, " has a negative device index ", t.device.index));
  }
  absl::Status usable = BackendRegistry::Get().CheckDevice(t.device);
  if (!usable.ok()) {
    return absl::Status(
        usable.code(),
        absl::StrCat(op, " \"", name, "\": ", role, " is on ",
                     t.device.ToString(), ": ", usable.message()));
  }
  return absl::OkStatus();
}

// A request's own timeout (Note [Request timeouts] in
// runtime/negotiation/collectives.h): 0 takes the job's op timeout.
absl::Status CheckTimeout(const char* op, const std::string& name,
                          absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) {
    return Invalid(op, name,
                   absl::StrCat("timeout ", FormatSeconds(timeout),
                                " is negative (0: the job's op timeout)"));
  }
  return absl::OkStatus();
}

// In whole microseconds, at least 1 for a positive one (0: none).
int64_t TimeoutMicros(absl::Duration timeout) {
  if (timeout <= absl::ZeroDuration()) return 0;
  return std::max<int64_t>(1, absl::ToInt64Microseconds(timeout));
}

void FillRequest(wire::CollectiveType type, const std::string& name,
                 const TensorView& t, wire::Request* r) {
  r->set_type(type);
  r->set_name(name);
  r->set_dtype(static_cast<int>(t.dtype));
  r->mutable_shape()->Reserve(static_cast<int>(t.shape.size()));
  for (int64_t d : t.shape) r->add_shape(d);
  r->set_device_type(static_cast<int>(t.device.type));
  r->set_device_index(t.device.index);
  r->set_prescale(1.0);
  r->set_postscale(1.0);
}

wire::Request BaseRequest(wire::CollectiveType type, const std::string& name,
                          const TensorView& t) {
  wire::Request r;
  FillRequest(type, name, t, &r);
  return r;
}

// The reduce op must be one kolo knows. Whether the dtype can be reduced
// (bool cannot) is checked in negotiation (collectives.cc), so that a rank
// whose tensor differs from the others' fails together with them.
absl::Status CheckReduction(const char* op, const std::string& name,
                            ReduceOp reduce) {
  if (static_cast<int>(reduce) < 0 || static_cast<int>(reduce) > 4) {
    return Invalid(op, name, "unknown reduce op");
  }
  return absl::OkStatus();
}

// The request's own checks; CheckAllreduce adds its process set's.
absl::Status CheckAllreduceTensors(const AllreduceRequest& req) {
  const char* op = "allreduce";
  KOLO_RETURN_IF_ERROR(CheckTensor(op, req.name, "input", req.input));
  const bool same = req.output.dtype == req.input.dtype &&
                    req.output.shape == req.input.shape &&
                    req.output.device == req.input.device;
  // An output like the checked input needs no check of its own but its
  // data pointer's (this runs for every tensor of every step).
  if (!same || (req.output.data == nullptr && req.input.data != nullptr)) {
    KOLO_RETURN_IF_ERROR(CheckTensor(op, req.name, "output", req.output));
  }
  if (req.timeout != absl::ZeroDuration()) {
    KOLO_RETURN_IF_ERROR(CheckTimeout(op, req.name, req.timeout));
  }
  if (!same) {
    return Invalid(
        op, req.name,
        absl::StrCat("output (", DataTypeName(req.output.dtype),
                     ShapeToString(req.output.shape), ") must match input (",
                     DataTypeName(req.input.dtype),
                     ShapeToString(req.input.shape), ")"));
  }
  return CheckReduction(op, req.name, req.op);
}

absl::Status CheckAllreduce(const RuntimeImpl& impl,
                            const AllreduceRequest& req) {
  KOLO_RETURN_IF_ERROR(CheckAllreduceTensors(req));
  return impl.sets().CheckMember(req.process_set, "allreduce", req.name);
}

// Filled where it will live (a moved protobuf is a new one plus a swap), in
// an entry from the runtime (Note [Entries recycled]).
void FillAllreduce(const AllreduceRequest& req, TensorEntry* entry) {
  FillRequest(wire::ALLREDUCE, req.name, req.input, &entry->request);
  entry->request.set_op(static_cast<int>(req.op));
  entry->request.set_prescale(req.prescale);
  entry->request.set_postscale(req.postscale);
  entry->request.set_process_set(req.process_set);
  entry->request.set_timeout_us(TimeoutMicros(req.timeout));
  entry->input = req.input;
  entry->output = req.output;
}

}  // namespace

Runtime::Runtime(std::shared_ptr<RuntimeImpl> impl) : impl_(std::move(impl)) {}

Runtime::~Runtime() {
  if (!impl_) return;
  ForgetAtExit(impl_.get());
  impl_->Abort();
}

absl::StatusOr<std::unique_ptr<Runtime>> Runtime::Create(
    const Options& options) {
  absl::Status s = ValidateOptions(options);
  if (!s.ok()) return s;
  auto impl = std::make_shared<RuntimeImpl>(options);
  s = impl->Start();
  for (size_t i = 0; s.ok() && i < options.process_sets.size(); ++i) {
    auto id = impl->AddProcessSet(options.process_sets[i]);
    if (!id.ok()) {
      s = id.status();
    } else if (*id != static_cast<int>(i) + 1) {
      s = absl::InternalError("process sets of the options got unexpected ids");
    }
  }
  if (!s.ok()) {
    impl->Abort();
    return s;
  }
  StopAtExit(impl);  // Note [Runtimes at exit]
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
const Options& Runtime::options() const { return impl_->options(); }

absl::StatusOr<Work> Runtime::Allreduce(const AllreduceRequest& req) {
  KOLO_RETURN_IF_ERROR(CheckAllreduce(*impl_, req));
  std::unique_ptr<TensorEntry> entry = impl_->NewEntry();
  FillAllreduce(req, entry.get());
  return impl_->Submit(std::move(entry));
}

BlockingResult Runtime::AllreduceAndWait(const AllreduceRequest& req,
                                         absl::Duration timeout) {
  if (absl::Status refused = CheckAllreduce(*impl_, req); !refused.ok()) {
    BlockingResult result;
    result.status = std::move(refused);
    return result;
  }
  std::unique_ptr<TensorEntry> entry = impl_->NewEntry();
  FillAllreduce(req, entry.get());
  return impl_->SubmitAndWait(std::move(entry), timeout);
}

absl::StatusOr<std::vector<Work>> Runtime::AllreduceBatch(
    const std::vector<AllreduceRequest>& requests) {
  // A batch names one process set, or a few in runs: each run's set is
  // looked up once.
  int checked_set = -1;
  for (const AllreduceRequest& req : requests) {
    KOLO_RETURN_IF_ERROR(CheckAllreduceTensors(req));
    if (req.process_set != checked_set || checked_set < 0) {
      KOLO_RETURN_IF_ERROR(
          impl_->sets().CheckMember(req.process_set, "allreduce", req.name));
      checked_set = req.process_set;
    }
  }
  std::vector<std::unique_ptr<TensorEntry>> entries;
  impl_->NewEntries(requests.size(), &entries);
  for (size_t i = 0; i < requests.size(); ++i) {
    FillAllreduce(requests[i], entries[i].get());
  }
  return impl_->SubmitAll(&entries);
}

absl::StatusOr<Work> Runtime::Broadcast(const BroadcastRequest& req) {
  const char* op = "broadcast";
  KOLO_RETURN_IF_ERROR(CheckTensor(op, req.name, "tensor", req.tensor));
  KOLO_RETURN_IF_ERROR(CheckTimeout(op, req.name, req.timeout));
  auto set = impl_->sets().Member(req.process_set, op, req.name);
  if (!set.ok()) return set.status();
  if (req.root < 0) {
    return Invalid(op, req.name,
                   absl::StrCat("root ", req.root, " is not a rank"));
  }
  // The root, a rank of the job, travels as its rank in the set, or as
  // -1 - root when it is not a member: negotiation refuses that on every
  // rank (collectives.cc), since the ranks may disagree on the root.
  const std::vector<int>& ranks = (*set)->ranks;  // sorted
  const auto member = std::lower_bound(ranks.begin(), ranks.end(), req.root);
  const int root = member != ranks.end() && *member == req.root
                       ? static_cast<int>(member - ranks.begin())
                       : -1 - req.root;
  TensorEntry entry;
  entry.request = BaseRequest(wire::BROADCAST, req.name, req.tensor);
  entry.request.set_root(root);
  entry.request.set_process_set(req.process_set);
  entry.request.set_timeout_us(TimeoutMicros(req.timeout));
  entry.input = req.tensor;
  entry.output = req.tensor;
  return impl_->Submit(std::move(entry));
}

absl::StatusOr<Work> Runtime::Allgather(const AllgatherRequest& req) {
  const char* op = "allgather";
  KOLO_RETURN_IF_ERROR(CheckTensor(op, req.name, "input", req.input));
  if (req.input.shape.empty()) {
    return Invalid(op, req.name,
                   "input must have at least one dimension (the one gathered)");
  }
  if (!req.allocator) {
    return Invalid(op, req.name, "an output allocator is required");
  }
  KOLO_RETURN_IF_ERROR(CheckTimeout(op, req.name, req.timeout));
  auto set = impl_->sets().Member(req.process_set, op, req.name);
  if (!set.ok()) return set.status();
  TensorEntry entry;
  entry.request = BaseRequest(wire::ALLGATHER, req.name, req.input);
  entry.request.set_process_set(req.process_set);
  entry.request.set_timeout_us(TimeoutMicros(req.timeout));
  entry.input = req.input;
  entry.allocator = req.allocator;
  return impl_->Submit(std::move(entry));
}

std::vector<int64_t> ReducescatterShape(const std::vector<int64_t>& input,
                                        int size, int rank) {
  std::vector<int64_t> shape = input.empty() ? std::vector<int64_t>{1} : input;
  shape[0] = shape[0] / size + (rank < shape[0] % size ? 1 : 0);
  return shape;
}

absl::StatusOr<Work> Runtime::Alltoall(const AlltoallRequest& req) {
  const char* op = "alltoall";
  KOLO_RETURN_IF_ERROR(CheckTensor(op, req.name, "input", req.input));
  if (req.input.shape.empty()) {
    return Invalid(op, req.name, "input must have at least one dimension");
  }
  if (!req.allocator)
    return Invalid(op, req.name, "an output allocator is required");
  KOLO_RETURN_IF_ERROR(CheckTimeout(op, req.name, req.timeout));
  auto set = impl_->sets().Member(req.process_set, op, req.name);
  if (!set.ok()) return set.status();
  const int n = (*set)->size();
  const int64_t rows = req.input.shape[0];
  std::vector<int64_t> splits = req.splits;
  if (splits.empty()) {
    if (rows % n != 0) {
      return Invalid(op, req.name,
                     absl::StrCat("the first dimension (", rows,
                                  ") does not divide evenly among ", n,
                                  " ranks; pass splits"));
    }
    splits.assign(n, rows / n);
  }
  int64_t sum = 0;
  for (int64_t v : splits) {
    if (v < 0) return Invalid(op, req.name, "splits must not be negative");
    sum += v;
  }
  if (static_cast<int>(splits.size()) != n || sum != rows) {
    return Invalid(
        op, req.name,
        absl::StrCat("splits [", absl::StrJoin(splits, ", "),
                     "] must have one entry per rank (", n,
                     ") and add up to the first dimension (", rows, ")"));
  }
  TensorEntry entry;
  entry.request = BaseRequest(wire::ALLTOALL, req.name, req.input);
  entry.request.set_process_set(req.process_set);
  entry.request.set_timeout_us(TimeoutMicros(req.timeout));
  for (int64_t v : splits) entry.request.add_splits(v);
  entry.input = req.input;
  entry.allocator = req.allocator;
  return impl_->Submit(std::move(entry));
}

absl::StatusOr<Work> Runtime::Reducescatter(const ReducescatterRequest& req) {
  const char* op = "reducescatter";
  KOLO_RETURN_IF_ERROR(CheckTensor(op, req.name, "input", req.input));
  KOLO_RETURN_IF_ERROR(CheckTensor(op, req.name, "output", req.output));
  KOLO_RETURN_IF_ERROR(CheckReduction(op, req.name, req.op));
  KOLO_RETURN_IF_ERROR(CheckTimeout(op, req.name, req.timeout));
  auto set = impl_->sets().Member(req.process_set, op, req.name);
  if (!set.ok()) return set.status();
  const std::vector<int64_t> want =
      ReducescatterShape(req.input.shape, (*set)->size(), (*set)->rank);
  if (req.output.dtype != req.input.dtype || req.output.shape != want ||
      req.input.shape.empty()) {
    return Invalid(
        op, req.name,
        absl::StrCat("output must be ", DataTypeName(req.input.dtype),
                     ShapeToString(want), " on rank ", (*set)->rank, " of ",
                     (*set)->size(), ", got ", DataTypeName(req.output.dtype),
                     ShapeToString(req.output.shape)));
  }
  TensorEntry entry;
  entry.request = BaseRequest(wire::REDUCESCATTER, req.name, req.input);
  entry.request.set_process_set(req.process_set);
  entry.request.set_timeout_us(TimeoutMicros(req.timeout));
  entry.request.set_op(static_cast<int>(req.op));
  entry.request.set_prescale(req.prescale);
  entry.request.set_postscale(req.postscale);
  entry.input = req.input;
  entry.output = req.output;
  return impl_->Submit(std::move(entry));
}

absl::StatusOr<Work> Runtime::GroupedAllreduce(
    const std::vector<AllreduceRequest>& requests) {
  if (requests.empty()) {
    return absl::InvalidArgumentError("grouped allreduce: no tensors");
  }
  // The group's key is the same on every rank that groups the same names.
  std::string key = absl::StrCat(requests[0].name, "+", requests.size() - 1);
  auto group =
      std::make_shared<GroupCompletion>(static_cast<int>(requests.size()));
  group->work = std::make_shared<internal::WorkState>();
  std::vector<std::unique_ptr<TensorEntry>> entries;
  for (const AllreduceRequest& req : requests) {
    if (req.process_set != requests[0].process_set) {
      return absl::InvalidArgumentError(
          absl::StrCat("grouped allreduce \"", key,
                       "\": every member must name the same "
                       "process set"));
    }
    // Validates like a lone allreduce, without submitting.
    KOLO_RETURN_IF_ERROR(CheckAllreduce(*impl_, req));
    std::unique_ptr<TensorEntry> entry = impl_->NewEntry();
    FillAllreduce(req, entry.get());
    entry->request.set_group(key);
    entry->request.set_group_size(static_cast<int>(requests.size()));
    entry->group = group;
    entries.push_back(std::move(entry));
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    auto work = impl_->Submit(std::move(entries[i]));
    if (!work.ok()) {
      // Members already queued still run (the other ranks submit them); the
      // group reports this failure once they are done.
      bool last = false;
      absl::Status final_status;
      {
        MutexLock lock(&group->mu);
        if (group->status.ok()) group->status = work.status();
        group->remaining -= static_cast<int>(entries.size() - i);
        last = group->remaining == 0;
        final_status = group->status;
      }
      if (last) group->work->Complete(final_status);
      return work.status();
    }
  }
  return internal::WorkAccess::Make(group->work);
}

absl::StatusOr<Work> Runtime::Barrier(int process_set, absl::Duration timeout) {
  if (timeout < absl::ZeroDuration()) {  // (before a barrier is numbered)
    return absl::InvalidArgumentError(
        absl::StrCat("barrier: timeout ", FormatSeconds(timeout),
                     " is negative (0: the job's op timeout)"));
  }
  auto set = impl_->sets().Member(process_set, "barrier");
  if (!set.ok()) return set.status();
  TensorEntry entry;
  entry.request.set_type(wire::BARRIER);
  entry.request.set_process_set(process_set);
  entry.request.set_name(absl::StrCat("__kolo_barrier_", (*set)->barriers++));
  entry.request.set_timeout_us(TimeoutMicros(timeout));
  return impl_->Submit(std::move(entry));
}

absl::StatusOr<int> Runtime::Join() { return impl_->Join(); }

absl::StatusOr<int> Runtime::AddMemberProcessSet(const std::vector<int>& ranks,
                                                 const std::string& key) {
  return impl_->AddMemberProcessSet(ranks, key);
}

absl::StatusOr<int> Runtime::AddProcessSet(const std::vector<int>& ranks) {
  return impl_->AddProcessSet(ranks);
}

absl::Status Runtime::RemoveProcessSet(int process_set) {
  return impl_->RemoveProcessSet(process_set);
}

absl::StatusOr<std::vector<int>> Runtime::ProcessSetRanks(
    int process_set) const {
  return impl_->sets().Ranks(process_set);
}

absl::Status Runtime::StartTimeline(const std::string& path, bool mark_cycles) {
  return impl_->StartTimeline(path, mark_cycles);
}

absl::Status Runtime::StopTimeline() { return impl_->StopTimeline(); }

absl::Status Runtime::status() const { return impl_->status(); }

RuntimeStats Runtime::stats() const { return impl_->stats(); }

std::map<std::string, int64_t> Runtime::Counters() const {
  return impl_->Counters();
}

absl::StatusOr<int64_t> Runtime::Counter(const std::string& name) const {
  const std::map<std::string, int64_t> counters = impl_->Counters();
  auto it = counters.find(name);
  if (it == counters.end()) {
    return absl::NotFoundError(absl::StrCat(
        "no counter named \"", name, "\" (Runtime::Counters() lists them)"));
  }
  return it->second;
}

absl::Status Runtime::Shutdown(absl::Duration timeout) {
  return impl_->Shutdown(timeout);
}

void Runtime::Abort() { impl_->Abort(); }

}  // namespace kolo
