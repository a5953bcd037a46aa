// Note [NCCL backend]
//
// One NcclBackend per process set and rank, on one GPU (context.device),
// created lazily by the runtime when the set's first CUDA response runs.
//
// Streams and ordering. Everything the backend does to memory is queued on
// one non-blocking stream of its own: the executor's packing copies
// (Copy: cudaMemcpyAsync, cudaMemcpyDefault, so host zeros of joined ranks
// work too), the NCCL collectives, the unpacking copies, and the memory it
// hands out (Allocate/Free: cudaMallocFromPoolAsync/cudaFreeAsync on a
// pool of its own, so that freeing never synchronises the device, which a
// kernel stuck on a lost peer would turn into a hang). WaitReady orders the
// stream after the tensors' producers: a ReadyEvent is polled on the
// background thread until Ready() or the op timeout; a tensor without one
// is ordered after the legacy default stream (an event recorded there and
// waited for on ours).
//
// Communicators. The flat communicator spans the set (rank 0's unique id
// travels through context.store, which is authenticated; NCCL's own
// traffic is not). All communicators are non-blocking (see
// communicator.h): host calls never wait for peers; creation is bounded by
// the start timeout and aborted after it. Scaling without kernels of our
// own: a sum is scaled by a PreMulSum op; a scaled min/max/product is
// rewritten (PlanScaledReduction) into a plain op followed by a
// multiplication, which is a PreMulSum allreduce on a one-rank "self"
// communicator (NCCL scales on one rank with its own kernel).
//
// Completion. Finish(done) records an event after the response's work and
// hands it to the CompletionQueue, whose thread runs `done` once the event
// has completed. The queue is also the watchdog: on an asynchronous NCCL
// error, a CUDA error or a collective that exceeds the op timeout it aborts
// every communicator (kernels waiting for a dead peer then end) and fails
// every pending `done` with an error naming what failed. Close() does the
// same from the runtime (another rank was lost). Every later call fails
// with the first error.
//
// Threads: the public methods run on the runtime's background thread,
// except Close() (any thread) and Free() (also on the completion thread,
// from the executor's `done`). Each sets this backend's device for its
// duration and restores the caller's.
#include "ops/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/nccl/communicator.h"
#include "ops/nccl/completion_queue.h"
#include "ops/nccl/cuda_util.h"
#include "ops/nccl/hierarchical.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace nccl {
namespace {

// Makes `device` current for a scope and restores the previous one, so the
// backend never changes a thread's device behind its owner's back.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
    }
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess &&
        now != previous_) {
      cudaSetDevice(previous_);
    }
  }
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// Keep up to this much freed memory in the backend's pool for reuse.
constexpr uint64_t kPoolReleaseThreshold = 256ull << 20;

// Runs `calls` between ncclGroupStart and ncclGroupEnd; the first error.
template <typename F>
ncclResult_t Group(F&& calls) {
  ncclResult_t first = ncclGroupStart();
  if (first != ncclSuccess) return first;
  first = calls();
  const ncclResult_t end = ncclGroupEnd();
  return first != ncclSuccess ? first : end;
}

class NcclBackend : public Backend {
 public:
  explicit NcclBackend(const BackendContext& context)
      : context_(context), device_(context.device.index) {}
  ~NcclBackend() override;

  absl::Status Init();

  const char* name() const override { return "nccl"; }
  bool host_memory() const override { return false; }

  absl::Status Allreduce(void* data, size_t count, DataType dtype,
                         ReduceOp op) override {
    return AllreduceScaled(data, count, dtype, op, 1.0, 1.0);
  }
  absl::Status AllreduceScaled(void* data, size_t count, DataType dtype,
                               ReduceOp op, double prescale,
                               double postscale) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Allgatherv(const void* input, void* output,
                          const std::vector<size_t>& bytes_per_rank) override;
  absl::Status Alltoallv(const void* input,
                         const std::vector<size_t>& send_bytes, void* output,
                         const std::vector<size_t>& recv_bytes) override;
  absl::Status Reducescatterv(const void* input, void* output,
                              const std::vector<size_t>& counts, DataType dtype,
                              ReduceOp op, double prescale,
                              double postscale) override;
  void Combine(void* out, const void* in, size_t count, DataType dtype,
               ReduceOp op) override;
  void Scale(void* data, size_t count, DataType dtype, double factor) override;
  void Close() override;

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* data) override;
  void Copy(void* dst, const void* src, size_t bytes) override;
  absl::Status WaitReady(
      const std::vector<std::shared_ptr<ReadyEvent>>& ready) override;
  void Finish(std::function<void(absl::Status)> done) override;

 private:
  // Every collective starts here: names it for the watchdog and fails with
  // the first error once the backend is broken.
  absl::Status Begin(const char* what);
  absl::Time OpDeadline() const { return absl::Now() + context_.op_timeout; }
  // The flat communicator, created on first use in hierarchical mode.
  absl::StatusOr<Communicator*> Flat();
  // data[i] *= factor on the stream (PreMulSum on a one-rank communicator).
  absl::Status DeviceScale(void* data, size_t count, DataType dtype,
                           double factor);
  // Aborts every communicator (and the CPU backend between hosts).
  void AbortCommunicators(const absl::Status& reason);
  absl::Status AsyncErrors();
  void RecordError(const absl::Status& s);
  // Adds the backend and the collective to an error.
  absl::Status Named(const absl::Status& s) const;

  const BackendContext context_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t legacy_ready_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  std::string what_ = "collective";  // background thread

  Mutex comms_mu_;  // the pointers below; the objects lock themselves
  std::unique_ptr<Communicator> flat_ KOLO_GUARDED_BY(comms_mu_);
  std::unique_ptr<Communicator> self_ KOLO_GUARDED_BY(comms_mu_);
  std::unique_ptr<HierarchicalAllreduce> hierarchical_
      KOLO_GUARDED_BY(comms_mu_);
  absl::Status broken_ KOLO_GUARDED_BY(comms_mu_);

  Mutex error_mu_;
  absl::Status copy_error_
      KOLO_GUARDED_BY(error_mu_);  // failed Copy, for Finish

  std::unique_ptr<CompletionQueue> queue_;
};

absl::Status NcclBackend::Named(const absl::Status& s) const {
  if (s.ok()) return s;
  return absl::Status(
      s.code(), absl::StrCat("NCCL ", what_, " on ", context_.device.ToString(),
                             ": ", s.message()));
}

absl::Status NcclBackend::Init() {
  DeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  KOLO_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                 "cudaStreamCreateWithFlags"));
  KOLO_RETURN_IF_ERROR(CudaStatus(
      cudaEventCreateWithFlags(&legacy_ready_, cudaEventDisableTiming),
      "cudaEventCreateWithFlags"));
  cudaMemPoolProps props = {};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_;
  KOLO_RETURN_IF_ERROR(
      CudaStatus(cudaMemPoolCreate(&pool_, &props),
                 "cudaMemPoolCreate (stream-ordered memory pools)"));
  uint64_t threshold = kPoolReleaseThreshold;
  KOLO_RETURN_IF_ERROR(
      CudaStatus(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold,
                                         &threshold),
                 "cudaMemPoolSetAttribute"));

  HostPlan plan;
  if (context_.hierarchical_allreduce) {
    plan = MakeHostPlan(context_.hosts, context_.rank);
    if (!plan.usable && plan.host_count > 1 && context_.rank == 0) {
      std::fprintf(stderr,
                   "[kolo] WARNING: KOLO_HIERARCHICAL_ALLREDUCE: %s; CUDA "
                   "allreduce uses one NCCL communicator over the set\n",
                   plan.why_not.c_str());
    }
  }
  if (plan.usable) {
    auto h = HierarchicalAllreduce::Create(context_, plan, stream_);
    if (!h.ok()) return h.status();
    MutexLock lock(&comms_mu_);
    hierarchical_ = std::move(*h);
  } else {
    auto flat = Flat();
    if (!flat.ok()) return flat.status();
  }
  CompletionQueue::Hooks hooks;
  hooks.check = [this] { return AsyncErrors(); };
  hooks.abort = [this](const absl::Status& reason) {
    AbortCommunicators(reason);
  };
  queue_ = std::make_unique<CompletionQueue>(device_, std::move(hooks));
  return absl::OkStatus();
}

NcclBackend::~NcclBackend() {
  DeviceGuard guard(device_);
  // Stop polling, answer what is left (the executor's callbacks still use
  // Free, so this runs before anything below goes), then abort.
  const absl::Status gone = absl::AbortedError(
      "the NCCL backend was shut down with this collective pending");
  if (queue_) {
    queue_->FailAll(gone);
    queue_->Stop();
  }
  AbortCommunicators(gone);
  {
    MutexLock lock(&comms_mu_);
    hierarchical_.reset();
    self_.reset();
    flat_.reset();
  }
  // Destroying a stream, an event or a pool with work outstanding is
  // allowed: CUDA releases them once that work is done.
  if (legacy_ready_ != nullptr) cudaEventDestroy(legacy_ready_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
}

absl::StatusOr<Communicator*> NcclBackend::Flat() {
  {
    MutexLock lock(&comms_mu_);
    if (!broken_.ok()) return broken_;
    if (flat_) return flat_.get();
  }
  auto comm = Communicator::Create(
      context_.store.get(), "nccl/flat", context_.rank, context_.size,
      context_.start_timeout,
      absl::StrCat("NCCL communicator of ", context_.size, " ranks"));
  if (!comm.ok()) return comm.status();
  MutexLock lock(&comms_mu_);
  if (!broken_.ok()) return broken_;  // closed meanwhile: *comm aborts
  flat_ = std::move(*comm);
  return flat_.get();
}

void NcclBackend::AbortCommunicators(const absl::Status& reason) {
  MutexLock lock(&comms_mu_);
  if (broken_.ok()) broken_ = reason;
  if (flat_) flat_->Abort(reason);
  if (self_) self_->Abort(reason);
  if (hierarchical_) hierarchical_->Abort(reason);
}

absl::Status NcclBackend::AsyncErrors() {
  MutexLock lock(&comms_mu_);
  if (!broken_.ok()) return broken_;
  for (Communicator* c : {flat_.get(), self_.get()}) {
    if (c == nullptr) continue;
    KOLO_RETURN_IF_ERROR(c->AsyncError());
  }
  if (hierarchical_) return hierarchical_->AsyncError();
  return absl::OkStatus();
}

void NcclBackend::Close() {
  const absl::Status reason = absl::AbortedError(
      "NCCL communicators aborted: the job failed elsewhere (see the first "
      "error)");
  AbortCommunicators(reason);
  if (queue_) queue_->FailAll(reason);
}

void NcclBackend::RecordError(const absl::Status& s) {
  if (s.ok()) return;
  MutexLock lock(&error_mu_);
  if (copy_error_.ok()) copy_error_ = s;
}

absl::Status NcclBackend::Begin(const char* what) {
  what_ = what;
  {
    MutexLock lock(&comms_mu_);
    if (!broken_.ok()) return broken_;
  }
  MutexLock lock(&error_mu_);
  return copy_error_;
}

absl::StatusOr<void*> NcclBackend::Allocate(size_t bytes) {
  DeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  void* p = nullptr;
  // Never null, also for 0 bytes (the executor treats null as failure).
  const size_t size = bytes < 256 ? 256 : bytes;
  absl::Status s = CudaStatus(cudaMallocFromPoolAsync(&p, size, pool_, stream_),
                              "cudaMallocFromPoolAsync");
  if (!s.ok()) {
    return absl::Status(
        s.code(), absl::StrCat("cannot allocate ", bytes, " bytes on ",
                               context_.device.ToString(), ": ", s.message()));
  }
  return p;
}

void NcclBackend::Free(void* data) {
  if (data == nullptr) return;
  DeviceGuard guard(device_);
  // Stream-ordered: after everything queued so far that may still use it.
  cudaFreeAsync(data, stream_);
}

void NcclBackend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  DeviceGuard guard(device_);
  RecordError(guard.status());
  RecordError(Named(
      CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_),
                 "cudaMemcpyAsync")));
}

absl::Status NcclBackend::WaitReady(
    const std::vector<std::shared_ptr<ReadyEvent>>& ready) {
  DeviceGuard guard(device_);
  if (!guard.status().ok()) return guard.status();
  const absl::Time deadline = OpDeadline();
  bool after_legacy_stream = false;
  for (const auto& event : ready) {
    if (!event) {
      after_legacy_stream = true;
      continue;
    }
    Backoff backoff;
    while (!event->Ready()) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("a CUDA tensor was not ready (its ReadyEvent) within ",
                         absl::ToDoubleSeconds(context_.op_timeout),
                         " s (KOLO_OP_TIMEOUT)"));
      }
      backoff.Pause();
    }
  }
  if (after_legacy_stream) {
    absl::Status s =
        CudaStatus(cudaEventRecord(legacy_ready_, cudaStreamLegacy),
                   "cudaEventRecord (default stream)");
    if (s.ok()) {
      s = CudaStatus(cudaStreamWaitEvent(stream_, legacy_ready_, 0),
                     "cudaStreamWaitEvent");
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void NcclBackend::Finish(std::function<void(absl::Status)> done) {
  DeviceGuard guard(device_);
  absl::Status failed = guard.status();
  if (failed.ok()) {
    MutexLock lock(&error_mu_);
    failed = copy_error_;
    copy_error_ = absl::OkStatus();  // reported once, with this response
  }
  cudaEvent_t event = nullptr;
  if (failed.ok()) {
    failed =
        CudaStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming),
                   "cudaEventCreateWithFlags");
  }
  if (failed.ok()) {
    failed = CudaStatus(cudaEventRecord(event, stream_), "cudaEventRecord");
    if (!failed.ok()) cudaEventDestroy(event);
  }
  if (!failed.ok()) {
    done(failed);
    return;
  }
  queue_->Add(event, std::move(done), context_.op_timeout, what_);
}

absl::Status NcclBackend::DeviceScale(void* data, size_t count, DataType dtype,
                                      double factor) {
  if (factor == 1.0 || count == 0) return absl::OkStatus();
  Communicator* self = nullptr;
  if (context_.size == 1) {
    auto flat = Flat();
    if (!flat.ok()) return flat.status();
    self = *flat;
  } else {
    {
      MutexLock lock(&comms_mu_);
      self = self_.get();
    }
    if (self == nullptr) {
      auto comm =
          Communicator::Create(nullptr, "", 0, 1, context_.start_timeout,
                               "NCCL one-rank communicator (scaling)");
      if (!comm.ok()) return comm.status();
      MutexLock lock(&comms_mu_);
      if (!broken_.ok()) return broken_;
      self_ = std::move(*comm);
      self = self_.get();
    }
  }
  const ncclDataType_t type = ToNcclDataType(dtype);
  return self->RunReduction(
      "ncclAllReduce (scaling)", OpDeadline(), dtype, ReduceOp::kSum, factor,
      [&](ncclComm_t comm, ncclRedOp_t op) {
        return ncclAllReduce(data, data, count, type, op, comm, stream_);
      });
}

absl::Status NcclBackend::AllreduceScaled(void* data, size_t count,
                                          DataType dtype, ReduceOp op,
                                          double prescale, double postscale) {
  DeviceGuard guard(device_);
  absl::Status s = guard.status().ok() ? Begin("allreduce") : guard.status();
  if (!s.ok() || count == 0) return Named(s);
  const ScaledReduction plan =
      PlanScaledReduction(op, prescale, postscale, context_.size);
  HierarchicalAllreduce* hierarchical = nullptr;
  {
    MutexLock lock(&comms_mu_);
    hierarchical = hierarchical_.get();
  }
  if (hierarchical != nullptr) {
    return Named(hierarchical->Run(data, count, dtype, plan.op, plan.premul,
                                   plan.postscale, context_.op_timeout));
  }
  auto flat = Flat();
  if (!flat.ok()) return Named(flat.status());
  const ncclDataType_t type = ToNcclDataType(dtype);
  s = (*flat)->RunReduction(
      "ncclAllReduce", OpDeadline(), dtype, plan.op, plan.premul,
      [&](ncclComm_t comm, ncclRedOp_t nccl_op) {
        return ncclAllReduce(data, data, count, type, nccl_op, comm, stream_);
      });
  if (s.ok()) s = DeviceScale(data, count, dtype, plan.postscale);
  return Named(s);
}

absl::Status NcclBackend::Broadcast(void* data, size_t bytes, int root) {
  DeviceGuard guard(device_);
  absl::Status s = guard.status().ok() ? Begin("broadcast") : guard.status();
  if (!s.ok() || bytes == 0) return Named(s);
  auto flat = Flat();
  if (!flat.ok()) return Named(flat.status());
  return Named(
      (*flat)->Run("ncclBroadcast", OpDeadline(), [&](ncclComm_t comm) {
        return ncclBroadcast(data, data, bytes, ncclUint8, root, comm, stream_);
      }));
}

absl::Status NcclBackend::Allgatherv(
    const void* input, void* output,
    const std::vector<size_t>& bytes_per_rank) {
  DeviceGuard guard(device_);
  absl::Status s = guard.status().ok() ? Begin("allgather") : guard.status();
  if (!s.ok()) return Named(s);
  size_t total = 0;
  bool even = true;
  for (size_t b : bytes_per_rank) {
    total += b;
    even = even && b == bytes_per_rank[0];
  }
  if (total == 0) return absl::OkStatus();
  auto flat = Flat();
  if (!flat.ok()) return Named(flat.status());
  uint8_t* out = static_cast<uint8_t*>(output);
  if (even) {
    return Named(
        (*flat)->Run("ncclAllGather", OpDeadline(), [&](ncclComm_t comm) {
          return ncclAllGather(input, output, bytes_per_rank[0], ncclUint8,
                               comm, stream_);
        }));
  }
  // Uneven: one broadcast per rank, from its input into its block.
  return Named((*flat)->Run(
      "ncclBroadcast (allgather)", OpDeadline(), [&](ncclComm_t comm) {
        return Group([&] {
          size_t offset = 0;
          for (int k = 0; k < context_.size; ++k) {
            const size_t bytes = bytes_per_rank[k];
            if (bytes > 0) {
              const void* send = k == context_.rank ? input : out + offset;
              ncclResult_t r = ncclBroadcast(send, out + offset, bytes,
                                             ncclUint8, k, comm, stream_);
              if (r != ncclSuccess) return r;
            }
            offset += bytes;
          }
          return ncclSuccess;
        });
      }));
}

absl::Status NcclBackend::Alltoallv(const void* input,
                                    const std::vector<size_t>& send_bytes,
                                    void* output,
                                    const std::vector<size_t>& recv_bytes) {
  DeviceGuard guard(device_);
  absl::Status s = guard.status().ok() ? Begin("alltoall") : guard.status();
  if (!s.ok()) return Named(s);
  const uint8_t* in = static_cast<const uint8_t*>(input);
  uint8_t* out = static_cast<uint8_t*>(output);
  std::vector<size_t> send_offset(context_.size), recv_offset(context_.size);
  size_t so = 0, ro = 0, remote = 0;
  for (int k = 0; k < context_.size; ++k) {
    send_offset[k] = so;
    recv_offset[k] = ro;
    so += send_bytes[k];
    ro += recv_bytes[k];
    if (k != context_.rank) remote += send_bytes[k] + recv_bytes[k];
  }
  const int me = context_.rank;
  if (send_bytes[me] > 0) {
    s = CudaStatus(cudaMemcpyAsync(out + recv_offset[me], in + send_offset[me],
                                   send_bytes[me], cudaMemcpyDefault, stream_),
                   "cudaMemcpyAsync (own block)");
    if (!s.ok()) return Named(s);
  }
  if (remote == 0) return absl::OkStatus();
  auto flat = Flat();
  if (!flat.ok()) return Named(flat.status());
  return Named(
      (*flat)->Run("ncclSend/ncclRecv", OpDeadline(), [&](ncclComm_t comm) {
        return Group([&] {
          for (int k = 0; k < context_.size; ++k) {
            if (k == me) continue;
            if (send_bytes[k] > 0) {
              ncclResult_t r = ncclSend(in + send_offset[k], send_bytes[k],
                                        ncclUint8, k, comm, stream_);
              if (r != ncclSuccess) return r;
            }
            if (recv_bytes[k] > 0) {
              ncclResult_t r = ncclRecv(out + recv_offset[k], recv_bytes[k],
                                        ncclUint8, k, comm, stream_);
              if (r != ncclSuccess) return r;
            }
          }
          return ncclSuccess;
        });
      }));
}

absl::Status NcclBackend::Reducescatterv(const void* input, void* output,
                                         const std::vector<size_t>& counts,
                                         DataType dtype, ReduceOp op,
                                         double prescale, double postscale) {
  DeviceGuard guard(device_);
  absl::Status s =
      guard.status().ok() ? Begin("reducescatter") : guard.status();
  if (!s.ok()) return Named(s);
  size_t total = 0;
  bool even = true;
  for (size_t c : counts) {
    total += c;
    even = even && c == counts[0];
  }
  if (total == 0) return absl::OkStatus();
  auto flat = Flat();
  if (!flat.ok()) return Named(flat.status());
  const ScaledReduction plan =
      PlanScaledReduction(op, prescale, postscale, context_.size);
  const ncclDataType_t type = ToNcclDataType(dtype);
  const size_t elem = DataTypeSize(dtype);
  const uint8_t* in = static_cast<const uint8_t*>(input);
  s = (*flat)->RunReduction(
      even ? "ncclReduceScatter" : "ncclReduce (reducescatter)", OpDeadline(),
      dtype, plan.op, plan.premul, [&](ncclComm_t comm, ncclRedOp_t nccl_op) {
        if (even) {
          return ncclReduceScatter(input, output, counts[0], type, nccl_op,
                                   comm, stream_);
        }
        // Uneven: one reduce per rank onto its owner; only the root writes
        // its receive buffer, so the others pass their input.
        return Group([&] {
          size_t offset = 0;
          for (int k = 0; k < context_.size; ++k) {
            if (counts[k] > 0) {
              const void* send = in + offset * elem;
              void* recv =
                  k == context_.rank ? output : const_cast<void*>(send);
              ncclResult_t r = ncclReduce(send, recv, counts[k], type, nccl_op,
                                          k, comm, stream_);
              if (r != ncclSuccess) return r;
            }
            offset += counts[k];
          }
          return ncclSuccess;
        });
      });
  if (s.ok()) {
    s = DeviceScale(output, counts[context_.rank], dtype, plan.postscale);
  }
  return Named(s);
}

void NcclBackend::Combine(void*, const void*, size_t, DataType, ReduceOp) {
  // The executor combines only on host-memory backends.
  RecordError(absl::InternalError(
      "the NCCL backend has no element-wise Combine on the device (the "
      "executor must use Reducescatterv/AllreduceScaled for device memory)"));
}

void NcclBackend::Scale(void* data, size_t count, DataType dtype,
                        double factor) {
  DeviceGuard guard(device_);
  RecordError(guard.status());
  if (guard.status().ok())
    RecordError(Named(DeviceScale(data, count, dtype, factor)));
}

absl::StatusOr<std::unique_ptr<Backend>> Create(const BackendContext& context) {
  absl::Status usable = ProbeCudaDevice(context.device);
  if (!usable.ok()) return usable;
  auto backend = std::make_unique<NcclBackend>(context);
  KOLO_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<Backend>(std::move(backend));
}

const BackendRegistrar kRegistrar(DeviceType::kCuda, "nccl", Create,
                                  ProbeCudaDevice, NCCL_VERSION_CODE);

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    const BackendContext& context) {
  return Create(context);
}

}  // namespace nccl
}  // namespace kolo
