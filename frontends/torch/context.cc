// at::Tensor <-> kolo::TensorView, Handles and the Context's collectives
// (the default context behind the free functions: default_context.cc).
#include "kolo/torch/context.h"

#include <c10/core/Event.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace torch {

Error::Error(const absl::Status& status)
    : std::runtime_error(std::string(status.message())), code_(status.code()) {}

Error::Error(absl::StatusCode code, const std::string& message)
    : std::runtime_error(message), code_(code) {}

Error::Error(const absl::Status& status, Outcome)
    : std::runtime_error(std::string(status.message())),
      code_(status.code()),
      outcome_(true) {}

namespace detail {

// The tensors of one collective: one but for a grouped allreduce, so kept
// inline (a submission allocates no vector for them).
using Tensors = absl::InlinedVector<at::Tensor, 1>;

// One submitted collective. The runtime reads and writes the memory of
// `buffers` (and the results that allocators create) until `work`
// completes; holding their storages here keeps that memory alive however
// the caller treats its Handle, and whatever it does to its own tensors
// meanwhile (`set_`, `.data =`, `model.to()` repoint a tensor at other
// memory). A storage, not a tensor: the buffer is often the caller's own
// tensor, and a copy of its storage costs a reference count, where a
// detached alias would cost a TensorImpl per call.
struct PendingOp {
  std::string name;
  kolo::Work work;
  absl::InlinedVector<c10::Storage, 1> buffers;
  // In-place collectives on non-contiguous tensors: once the collective
  // succeeded, each `second` (a contiguous buffer) is copied into `first`
  // (a detached alias of the caller's tensor as it was submitted).
  std::vector<std::pair<at::Tensor, at::Tensor>> copy_backs;

  Mutex mu;
  Tensors results KOLO_GUARDED_BY(mu);  // (allocators write it)
  bool finished KOLO_GUARDED_BY(mu) = false;
  absl::Status status KOLO_GUARDED_BY(mu);
};

}  // namespace detail

namespace {

using detail::PendingOp;
using detail::Tensors;

absl::Status Invalid(const char* op, const std::string& name,
                     const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat(op, " \"", name, "\": ", what));
}

kolo::DataType ToDataType(const at::Tensor& t, const char* op,
                          const std::string& name) {
  switch (t.scalar_type()) {
    case at::kByte:
      return kolo::DataType::kUint8;
    case at::kChar:
      return kolo::DataType::kInt8;
    case at::kShort:
      return kolo::DataType::kInt16;
    case at::kBool:
      return kolo::DataType::kBool;
    case at::kInt:
      return kolo::DataType::kInt32;
    case at::kLong:
      return kolo::DataType::kInt64;
    case at::kHalf:
      return kolo::DataType::kFloat16;
    case at::kBFloat16:
      return kolo::DataType::kBfloat16;
    case at::kFloat:
      return kolo::DataType::kFloat32;
    case at::kDouble:
      return kolo::DataType::kFloat64;
    default:
      throw Error(Invalid(
          op, name,
          absl::StrCat("dtype ", c10::toString(t.scalar_type()),
                       " is not supported (kolo supports uint8, int8, int16, "
                       "int32, int64, float16, bfloat16, float32, float64, "
                       "and bool for broadcast, allgather and alltoall)")));
  }
}

kolo::Device ToDevice(const at::Tensor& t, const char* op,
                      const std::string& name) {
  if (t.device().is_cpu()) return kolo::Device::Cpu();
  if (t.device().is_cuda()) return kolo::Device::Cuda(t.device().index());
  throw Error(Invalid(op, name,
                      absl::StrCat("tensors on ", t.device().str(),
                                   " are not supported (CPU and CUDA only)")));
}

// Rejects what kolo cannot send. Returns `t` detached from autograd if it
// requires grad: the runtime reads and writes raw memory, which autograd
// must not record, and a contiguous copy must not be recorded either. A
// tensor that does not require grad (a gradient, the common case) is
// returned as it is: nothing it goes through is recorded, and a detached
// alias would cost a TensorImpl per call.
at::Tensor CheckedTensor(const at::Tensor& t, const char* op,
                         const std::string& name) {
  if (!t.defined()) throw Error(Invalid(op, name, "the tensor is undefined"));
  if (t.layout() != at::kStrided) {
    std::ostringstream layout;
    layout << t.layout();
    throw Error(Invalid(op, name,
                        absl::StrCat("layout ", layout.str(),
                                     " is not supported: kolo sends dense "
                                     "tensors (call to_dense() first)")));
  }
  ToDataType(t, op, name);
  ToDevice(t, op, name);
  return t.requires_grad() ? t.detach() : t;
}

// The runtime's collectives run on their own streams: work queued on the
// tensor's current stream (the kernels that produce it, and earlier users
// of memory the caching allocator handed out again) must have finished
// before the runtime touches it. An event recorded on that stream now; the
// runtime polls it on its own thread, so the caller never blocks. Uses only
// c10's device-generic interface: it builds against a CPU-only LibTorch and
// works with a CUDA one.
class StreamReadyEvent : public kolo::ReadyEvent {
 public:
  explicit StreamReadyEvent(const at::Tensor& t) : event_(t.device().type()) {
    event_.record(c10::impl::getDeviceGuardImpl(t.device().type())
                      ->getStream(t.device()));
  }
  bool Ready() override {
    // c10::Event is not thread-safe; the runtime may poll from two threads.
    MutexLock lock(&mu_);
    return event_.query();
  }

 private:
  Mutex mu_;
  c10::Event event_;
};

kolo::TensorView ViewOf(const at::Tensor& contiguous, const char* op,
                        const std::string& name) {
  kolo::TensorView view(contiguous.data_ptr(), ToDataType(contiguous, op, name),
                        contiguous.sizes().vec(),
                        ToDevice(contiguous, op, name));
  if (!contiguous.device().is_cpu()) {
    view.ready = std::make_shared<StreamReadyEvent>(contiguous);
  }
  return view;
}

// The buffer the runtime works on for an in-place collective on `caller`'s
// tensor (`t`: CheckedTensor's): `t` itself when contiguous, else a
// contiguous copy that is copied back on success, into a detached alias
// (the copy back is not recorded, even if the caller's tensor requires
// grad by then, and goes to the memory submitted). The result is the
// caller's own tensor.
at::Tensor InPlaceBuffer(const at::Tensor& caller, const at::Tensor& t,
                         PendingOp* op) {
  at::Tensor buffer = t;
  if (!t.is_contiguous()) {
    buffer = t.contiguous();
    op->copy_backs.emplace_back(t.is_same(caller) ? t.detach() : t, buffer);
  }
  op->buffers.push_back(buffer.storage());
  MutexLock lock(&op->mu);  // Not shared yet: for the analysis.
  op->results.push_back(caller);
  return buffer;
}

// Output allocator for collectives whose result shape is known only after
// negotiation. Runs on the runtime's background thread. A weak reference,
// so that the runtime's copy of this callback never keeps the PendingOp
// alive (Context::Track does, until the Work completes).
kolo::OutputAllocator AllocatorFor(const std::shared_ptr<PendingOp>& op,
                                   at::TensorOptions options) {
  std::weak_ptr<PendingOp> weak = op;
  return [weak,
          options](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
    auto pending = weak.lock();
    if (!pending) return absl::CancelledError("the Handle was destroyed");
    at::Tensor out = at::empty(shape, options);
    MutexLock lock(&pending->mu);
    pending->results.assign(1, out);
    return out.data_ptr();
  };
}

// The op's collective ended with `status`: its copy-backs, its results (or
// its error, thrown).
const Tensors& Settle(PendingOp* op, const absl::Status& status) {
  MutexLock lock(&op->mu);
  if (!op->finished) {
    op->finished = true;
    op->status = status;
    if (status.ok()) {
      for (auto& [dst, src] : op->copy_backs) dst.copy_(src);
    }
    // The runtime is done with the memory; the results alone stay.
    op->buffers.clear();
    op->copy_backs.clear();
  }
  if (!op->status.ok()) throw Error(op->status, Error::Outcome{});
  return op->results;
}

const Tensors& Finish(PendingOp* op) { return Settle(op, op->work.Wait()); }

}  // namespace

void Handle::block() const {
  if (op_) op_->work.WaitQuietly().IgnoreError();
}

bool Handle::poll() const { return op_ && op_->work.IsCompleted(); }

const std::string& Handle::name() const {
  static const std::string* empty = new std::string;
  return op_ ? op_->name : *empty;
}

namespace {

const Tensors& Results(const std::shared_ptr<PendingOp>& op) {
  if (!op) {
    throw Error(absl::StatusCode::kFailedPrecondition,
                "wait() on an empty kolo::torch::Handle");
  }
  return Finish(op.get());
}

}  // namespace

std::vector<at::Tensor> Handle::wait_all() const {
  const Tensors& results = Results(op_);
  return std::vector<at::Tensor>(results.begin(), results.end());
}

at::Tensor Handle::wait() const {
  const Tensors& results = Results(op_);
  return results.empty() ? at::Tensor() : results.front();
}

std::vector<int64_t> Handle::received_splits() const {
  return op_ ? op_->work.received_splits() : std::vector<int64_t>();
}

std::shared_ptr<Context> Context::Create(const kolo::Options& options) {
  auto runtime = kolo::Runtime::Create(options);
  if (!runtime.ok()) throw Error(runtime.status());
  return std::make_shared<Context>(
      std::shared_ptr<kolo::Runtime>(std::move(*runtime)));
}

std::shared_ptr<Context> Context::FromEnvironment() {
  auto options = kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) throw Error(options.status());
  return Create(*options);
}

struct Context::Tracking {
  Mutex mu;
  // Counters for generated names, per collective and process set.
  std::map<std::pair<int, int>, int64_t> unnamed KOLO_GUARDED_BY(mu);
  // Submitted collectives, pruned of completed ones when the list reaches
  // prune_at (amortised O(1) per submit).
  std::vector<std::shared_ptr<PendingOp>> in_flight KOLO_GUARDED_BY(mu);
  size_t prune_at KOLO_GUARDED_BY(mu) = 64;
};

Context::Context(std::shared_ptr<kolo::Runtime> runtime)
    : runtime_(std::move(runtime)), tracking_(std::make_unique<Tracking>()) {
  if (!runtime_) {
    throw Error(absl::StatusCode::kInvalidArgument,
                "kolo::torch::Context needs a runtime");
  }
}

Context::~Context() {
  // Drop the runtime before the tensors in flight: if this was its last
  // reference it aborts, failing the pending collectives that use them.
  runtime_.reset();
}

int Context::rank() const { return runtime_->rank(); }
int Context::size() const { return runtime_->size(); }
int Context::local_rank() const { return runtime_->local_rank(); }
int Context::local_size() const { return runtime_->local_size(); }
int Context::cross_rank() const { return runtime_->cross_rank(); }
int Context::cross_size() const { return runtime_->cross_size(); }

template <typename Submit>
Handle Context::Track(std::shared_ptr<PendingOp> op, Submit submit) {
  absl::StatusOr<kolo::Work> work = submit();
  if (!work.ok()) throw Error(work.status());
  op->work = *std::move(work);
  Tracking& t = *tracking_;
  MutexLock lock(&t.mu);
  if (t.in_flight.size() >= t.prune_at) {
    t.in_flight.erase(std::remove_if(t.in_flight.begin(), t.in_flight.end(),
                                     [](const std::shared_ptr<PendingOp>& p) {
                                       return p->work.IsCompleted();
                                     }),
                      t.in_flight.end());
    t.prune_at = std::max<size_t>(64, 2 * t.in_flight.size());
  }
  t.in_flight.push_back(op);
  return Handle(std::move(op));
}

std::string Context::NameFor(Collective collective, const std::string& given,
                             int process_set) {
  if (!given.empty()) return given;
  static const char* const kPrefix[kNumCollectives] = {
      "allreduce.noname.", "grouped_allreduce.noname.",
      "allgather.noname.", "broadcast.noname.",
      "alltoall.noname.",  "reducescatter.noname."};
  // Counted per process set: only its members make its collectives.
  int64_t n;
  {
    MutexLock lock(&tracking_->mu);
    n = tracking_->unnamed[{collective, process_set}]++;
  }
  if (process_set == kGlobalProcessSet)
    return absl::StrCat(kPrefix[collective], n);
  return absl::StrCat(kPrefix[collective], "set", process_set, ".", n);
}

std::shared_ptr<PendingOp> Context::AllreduceOp(
    const at::Tensor& tensor, const AllreduceOptions& options, bool in_place,
    kolo::AllreduceRequest* request) {
  const char* op_name = "allreduce";
  auto op = std::make_shared<PendingOp>();
  // The name lives in the request until it is submitted, then in the op
  // (Context::Allreduce moves it there): one copy of it, not two.
  request->name = NameFor(kAllreduce, options.name(), options.process_set());
  const std::string& name = request->name;
  at::Tensor t = CheckedTensor(tensor, op_name, name);
  if (in_place) {
    request->input = request->output =
        ViewOf(InPlaceBuffer(tensor, t, op.get()), op_name, name);
  } else {
    at::Tensor in = t.contiguous();
    at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
    op->buffers = {in.storage()};
    MutexLock lock(&op->mu);  // Not shared yet: for the analysis.
    op->results = {out};
    request->input = ViewOf(in, op_name, name);
    request->output = ViewOf(out, op_name, name);
  }
  request->op = options.op();
  request->prescale = options.prescale();
  request->postscale = options.postscale();
  request->process_set = options.process_set();
  request->timeout = absl::FromChrono(options.timeout());
  return op;
}

Handle Context::Allreduce(const at::Tensor& tensor,
                          const AllreduceOptions& options, bool in_place) {
  kolo::AllreduceRequest request;
  std::shared_ptr<PendingOp> op =
      AllreduceOp(tensor, options, in_place, &request);
  PendingOp* pending = op.get();
  return Track(std::move(op), [&] {
    absl::StatusOr<kolo::Work> work = runtime_->Allreduce(request);
    pending->name = std::move(request.name);  // the runtime copied it
    return work;
  });
}

at::Tensor Context::AllreduceBlocking(const at::Tensor& tensor,
                                      const AllreduceOptions& options,
                                      bool in_place) {
  kolo::AllreduceRequest request;
  std::shared_ptr<PendingOp> op =
      AllreduceOp(tensor, options, in_place, &request);
  // Not tracked: nothing of it is in flight once the call returns.
  const BlockingResult result =
      runtime_->AllreduceAndWait(request, absl::InfiniteDuration());
  if (!result.submitted) throw Error(result.status);
  const Tensors& results = Settle(op.get(), result.status);
  return results.empty() ? at::Tensor() : results.front();
}

Handle Context::allreduce_async(const at::Tensor& tensor,
                                const AllreduceOptions& options) {
  return Allreduce(tensor, options, /*in_place=*/false);
}

Handle Context::allreduce_async_(const at::Tensor& tensor,
                                 const AllreduceOptions& options) {
  return Allreduce(tensor, options, /*in_place=*/true);
}

at::Tensor Context::allreduce(const at::Tensor& tensor,
                              const AllreduceOptions& options) {
  return AllreduceBlocking(tensor, options, /*in_place=*/false);
}

at::Tensor Context::allreduce_(const at::Tensor& tensor,
                               const AllreduceOptions& options) {
  return AllreduceBlocking(tensor, options, /*in_place=*/true);
}

Handle Context::GroupedAllreduce(const std::vector<at::Tensor>& tensors,
                                 const GroupedAllreduceOptions& options,
                                 bool in_place) {
  const char* op_name = "grouped allreduce";
  auto op = std::make_shared<PendingOp>();
  op->name = NameFor(kGroupedAllreduce, options.name(), options.process_set());
  if (!options.names().empty() && options.names().size() != tensors.size()) {
    throw Error(Invalid(op_name, op->name,
                        absl::StrCat(options.names().size(), " names for ",
                                     tensors.size(), " tensors")));
  }
  std::vector<kolo::AllreduceRequest> requests(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    kolo::AllreduceRequest& request = requests[i];
    request.name = options.names().empty() ? absl::StrCat(op->name, ".", i)
                                           : options.names()[i];
    at::Tensor t = CheckedTensor(tensors[i], op_name, request.name);
    if (in_place) {
      request.input = request.output =
          ViewOf(InPlaceBuffer(tensors[i], t, op.get()), op_name, request.name);
    } else {
      at::Tensor in = t.contiguous();
      at::Tensor out = at::empty_like(in, at::MemoryFormat::Contiguous);
      op->buffers.push_back(in.storage());
      MutexLock lock(&op->mu);  // Not shared yet: for the analysis.
      op->results.push_back(out);
      request.input = ViewOf(in, op_name, request.name);
      request.output = ViewOf(out, op_name, request.name);
    }
    request.op = options.op();
    request.prescale = options.prescale();
    request.postscale = options.postscale();
    request.process_set = options.process_set();
    request.timeout = absl::FromChrono(options.timeout());
  }
  return Track(std::move(op),
               [&] { return runtime_->GroupedAllreduce(requests); });
}

Handle Context::grouped_allreduce_async(
    const std::vector<at::Tensor>& tensors,
    const GroupedAllreduceOptions& options) {
  return GroupedAllreduce(tensors, options, /*in_place=*/false);
}

Handle Context::grouped_allreduce_async_(
    const std::vector<at::Tensor>& tensors,
    const GroupedAllreduceOptions& options) {
  return GroupedAllreduce(tensors, options, /*in_place=*/true);
}

std::vector<at::Tensor> Context::grouped_allreduce(
    const std::vector<at::Tensor>& tensors,
    const GroupedAllreduceOptions& options) {
  return grouped_allreduce_async(tensors, options).wait_all();
}

std::vector<at::Tensor> Context::grouped_allreduce_(
    const std::vector<at::Tensor>& tensors,
    const GroupedAllreduceOptions& options) {
  return grouped_allreduce_async_(tensors, options).wait_all();
}

Handle Context::allgather_async(const at::Tensor& tensor,
                                const AllgatherOptions& options) {
  const char* op_name = "allgather";
  auto op = std::make_shared<PendingOp>();
  op->name = NameFor(kAllgather, options.name(), options.process_set());
  at::Tensor in = CheckedTensor(tensor, op_name, op->name).contiguous();
  op->buffers = {in.storage()};
  kolo::AllgatherRequest request;
  request.name = op->name;
  request.input = ViewOf(in, op_name, op->name);
  request.allocator = AllocatorFor(op, in.options());
  request.process_set = options.process_set();
  request.timeout = absl::FromChrono(options.timeout());
  return Track(std::move(op), [&] { return runtime_->Allgather(request); });
}

at::Tensor Context::allgather(const at::Tensor& tensor,
                              const AllgatherOptions& options) {
  return allgather_async(tensor, options).wait();
}

Handle Context::Broadcast(const at::Tensor& tensor,
                          const BroadcastOptions& options, bool in_place) {
  const char* op_name = "broadcast";
  auto op = std::make_shared<PendingOp>();
  op->name = NameFor(kBroadcast, options.name(), options.process_set());
  at::Tensor t = CheckedTensor(tensor, op_name, op->name);
  at::Tensor buffer;
  if (in_place) {
    buffer = InPlaceBuffer(tensor, t, op.get());
  } else {
    buffer = t.clone(at::MemoryFormat::Contiguous);
    op->buffers = {buffer.storage()};
    MutexLock lock(&op->mu);  // Not shared yet: for the analysis.
    op->results = {buffer};
  }
  kolo::BroadcastRequest request;
  request.name = op->name;
  request.tensor = ViewOf(buffer, op_name, op->name);
  request.root = options.root();
  request.process_set = options.process_set();
  request.timeout = absl::FromChrono(options.timeout());
  return Track(std::move(op), [&] { return runtime_->Broadcast(request); });
}

Handle Context::broadcast_async(const at::Tensor& tensor,
                                const BroadcastOptions& options) {
  return Broadcast(tensor, options, /*in_place=*/false);
}

Handle Context::broadcast_async_(const at::Tensor& tensor,
                                 const BroadcastOptions& options) {
  return Broadcast(tensor, options, /*in_place=*/true);
}

at::Tensor Context::broadcast(const at::Tensor& tensor,
                              const BroadcastOptions& options) {
  return broadcast_async(tensor, options).wait();
}

at::Tensor Context::broadcast_(const at::Tensor& tensor,
                               const BroadcastOptions& options) {
  return broadcast_async_(tensor, options).wait();
}

std::string Context::broadcast_bytes(const std::string& bytes,
                                     const BroadcastOptions& options) {
  const std::string name =
      NameFor(kBroadcast, options.name(), options.process_set());
  at::Tensor length =
      at::full({1}, static_cast<int64_t>(bytes.size()), at::kLong);
  broadcast_(length, BroadcastOptions(options).name(name + ".length"));
  const int64_t n = length.item<int64_t>();
  at::Tensor data = at::empty({n}, at::kByte);
  if (n > 0 && static_cast<int64_t>(bytes.size()) == n) {
    // Root's bytes (other ranks' are overwritten; their length may differ).
    std::memcpy(data.data_ptr(), bytes.data(), n);
  }
  broadcast_(data, BroadcastOptions(options).name(name + ".data"));
  return std::string(static_cast<const char*>(data.data_ptr()), n);
}

Handle Context::alltoall_async(const at::Tensor& tensor,
                               const AlltoallOptions& options) {
  const char* op_name = "alltoall";
  auto op = std::make_shared<PendingOp>();
  op->name = NameFor(kAlltoall, options.name(), options.process_set());
  at::Tensor in = CheckedTensor(tensor, op_name, op->name).contiguous();
  op->buffers = {in.storage()};
  kolo::AlltoallRequest request;
  request.name = op->name;
  request.input = ViewOf(in, op_name, op->name);
  request.splits = options.splits();
  request.allocator = AllocatorFor(op, in.options());
  request.process_set = options.process_set();
  request.timeout = absl::FromChrono(options.timeout());
  return Track(std::move(op), [&] { return runtime_->Alltoall(request); });
}

at::Tensor Context::alltoall(const at::Tensor& tensor,
                             const AlltoallOptions& options) {
  return alltoall_async(tensor, options).wait();
}

Handle Context::reducescatter_async(const at::Tensor& tensor,
                                    const ReducescatterOptions& options) {
  const char* op_name = "reducescatter";
  auto op = std::make_shared<PendingOp>();
  op->name = NameFor(kReducescatter, options.name(), options.process_set());
  at::Tensor in = CheckedTensor(tensor, op_name, op->name).contiguous();
  // This rank's share: its position within the set decides it.
  const std::vector<int> ranks = process_set_ranks(options.process_set());
  const auto me = std::find(ranks.begin(), ranks.end(), rank());
  if (me == ranks.end()) {
    throw Error(Invalid(op_name, op->name,
                        absl::StrCat("rank ", rank(), " is not in process set ",
                                     options.process_set())));
  }
  std::vector<int64_t> out_shape =
      in.dim() == 0 ? std::vector<int64_t>{}
                    : kolo::ReducescatterShape(
                          in.sizes().vec(), static_cast<int>(ranks.size()),
                          static_cast<int>(me - ranks.begin()));
  at::Tensor out = at::empty(out_shape, in.options());
  op->buffers = {in.storage()};
  {
    MutexLock lock(&op->mu);  // Not shared yet: for the analysis.
    op->results = {out};
  }
  kolo::ReducescatterRequest request;
  request.name = op->name;
  request.input = ViewOf(in, op_name, op->name);
  request.output = ViewOf(out, op_name, op->name);
  request.op = options.op();
  request.prescale = options.prescale();
  request.postscale = options.postscale();
  request.process_set = options.process_set();
  request.timeout = absl::FromChrono(options.timeout());
  return Track(std::move(op), [&] { return runtime_->Reducescatter(request); });
}

at::Tensor Context::reducescatter(const at::Tensor& tensor,
                                  const ReducescatterOptions& options) {
  return reducescatter_async(tensor, options).wait();
}

void Context::barrier(int process_set, std::chrono::milliseconds timeout) {
  absl::StatusOr<kolo::Work> work =
      runtime_->Barrier(process_set, absl::FromChrono(timeout));
  if (!work.ok()) throw Error(work.status());
  absl::Status status = work->Wait();
  if (!status.ok()) throw Error(status);
}

int Context::join() {
  absl::StatusOr<int> last = runtime_->Join();
  if (!last.ok()) throw Error(last.status());
  return *last;
}

int Context::add_process_set(const std::vector<int>& ranks) {
  absl::StatusOr<int> id = runtime_->AddProcessSet(ranks);
  if (!id.ok()) throw Error(id.status());
  return *id;
}

int Context::add_member_process_set(const std::vector<int>& ranks,
                                    const std::string& key) {
  absl::StatusOr<int> id = runtime_->AddMemberProcessSet(ranks, key);
  if (!id.ok()) throw Error(id.status());
  return *id;
}

void Context::remove_process_set(int process_set) {
  absl::Status s = runtime_->RemoveProcessSet(process_set);
  if (!s.ok()) throw Error(s);
}

std::vector<int> Context::process_set_ranks(int process_set) const {
  absl::StatusOr<std::vector<int>> ranks =
      runtime_->ProcessSetRanks(process_set);
  if (!ranks.ok()) throw Error(ranks.status());
  return *std::move(ranks);
}

void Context::shutdown(absl::Duration timeout) {
  if (shut_down_.exchange(true)) return;
  absl::Status status = runtime_->Shutdown(timeout);
  {
    // Every Work has completed now (Shutdown completes or fails them all).
    MutexLock lock(&tracking_->mu);
    tracking_->in_flight.clear();
  }
  if (!status.ok()) throw Error(status);
}

}  // namespace torch
}  // namespace kolo
