// Note [Hierarchical allreduce]
//
// With KOLO_HIERARCHICAL_ALLREDUCE=1 and ranks on more than one host, a CUDA
// allreduce of `count` elements runs in three steps, so that only 1/L of the
// data (L = ranks per host) crosses hosts, over the CPU backend (gloo):
//
//   1. Within the host (NCCL, the host's own communicator): the buffer is
//      split into L shards (SplitEvenly); a grouped ncclReduce sends shard
//      k to local rank k, which reduces it in place. Scaling of a sum is a
//      PreMulSum op here.
//   2. Between hosts (CPU): local rank k copies its shard to a pinned
//      staging buffer, waits for the stream (polling an event, bounded by
//      the op timeout), allreduces it with local rank k of every other host
//      (the CPU backend among "the k-th ranks"), applies the postscale in
//      the CPU kernels and copies it back.
//   3. Within the host: a grouped ncclBroadcast of shard k from local rank
//      k.
//
// Bitwise identity: each shard is reduced once within a host (by its
// owner), the CPU backend gives its group identical bits, and the result is
// broadcast; so every rank ends with the same bits.
//
// Requirements and fallbacks: every host must run the same number of ranks
// of the set (else the k-th ranks do not line up): otherwise, and with one
// host, the backend uses its flat communicator and logs why (more than one
// host only). Only allreduce is hierarchical; broadcast, allgather,
// alltoall and reducescatter use the flat communicator over the whole set,
// which the backend then creates when the first of them runs (on every rank
// at the same point of the response order).
//
// Step 2 blocks the background thread for the shard's trip between hosts,
// as gloo collectives always do; steps 1 and 3 are queued on the stream.
#include "ops/nccl/hierarchical.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "ops/cpu/reduce.h"
#include "ops/nccl/cuda_util.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace nccl {

HostPlan MakeHostPlan(const std::vector<std::string>& hosts, int rank) {
  HostPlan plan;
  if (rank < 0 || rank >= static_cast<int>(hosts.size())) {
    plan.why_not = absl::StrCat("no host identity for set rank ", rank);
    return plan;
  }
  // Host index by first appearance, i.e. by lowest set rank.
  std::map<std::string, int> index;
  std::vector<int> ranks_on(0);
  for (const std::string& h : hosts) {
    auto [it, added] = index.emplace(h, static_cast<int>(index.size()));
    if (added) ranks_on.push_back(0);
    ++ranks_on[it->second];
  }
  plan.host_count = static_cast<int>(index.size());
  plan.host_index = index.at(hosts[rank]);
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    if (hosts[r] == hosts[rank]) {
      if (r == rank)
        plan.local_rank = static_cast<int>(plan.local_ranks.size());
      plan.local_ranks.push_back(r);
    }
  }
  plan.local_size = static_cast<int>(plan.local_ranks.size());
  if (plan.host_count < 2) {
    plan.why_not = "all ranks are on one host";
    return plan;
  }
  for (int n : ranks_on) {
    if (n != ranks_on[0]) {
      std::string counts;
      for (int m : ranks_on)
        absl::StrAppend(&counts, counts.empty() ? "" : ", ", m);
      plan.why_not =
          absl::StrCat("hosts run different numbers of ranks (", counts, ")");
      return plan;
    }
  }
  plan.usable = true;
  return plan;
}

absl::StatusOr<std::unique_ptr<HierarchicalAllreduce>>
HierarchicalAllreduce::Create(const BackendContext& context,
                              const HostPlan& plan, cudaStream_t stream) {
  std::unique_ptr<HierarchicalAllreduce> h(
      new HierarchicalAllreduce(plan, stream));
  KOLO_RETURN_IF_ERROR(
      CudaStatus(cudaEventCreateWithFlags(&h->copied_, cudaEventDisableTiming),
                 "cudaEventCreateWithFlags"));
  auto local = Communicator::Create(
      context.store.get(), absl::StrCat("nccl/host", plan.host_index),
      plan.local_rank, plan.local_size, context.start_timeout,
      absl::StrCat("NCCL communicator of the ", plan.local_size,
                   " ranks on host ", plan.host_index, " (",
                   context.hosts[context.rank], ")"));
  if (!local.ok()) return local.status();
  h->local_ = std::move(*local);

  BackendContext cross = context;
  cross.rank = plan.host_index;
  cross.size = plan.host_count;
  cross.store = NewPrefixStore(absl::StrCat("nccl/cross", plan.local_rank),
                               context.store);
  cross.device = Device::Cpu();
  cross.all_ranks_on_host = false;
  cross.hosts.clear();
  cross.hierarchical_allreduce = false;
  auto backend = BackendRegistry::Get().Create(DeviceType::kCpu, "gloo", cross);
  if (!backend.ok() && absl::IsNotFound(backend.status())) {
    backend = BackendRegistry::Get().Create(DeviceType::kCpu, cross);
  }
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("hierarchical allreduce: the CPU backend "
                                     "between hosts did not start: ",
                                     backend.status().message()));
  }
  h->cross_ = std::move(*backend);
  return h;
}

HierarchicalAllreduce::~HierarchicalAllreduce() {
  local_.reset();  // aborts: nothing of ours is pending any more
  cross_.reset();
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (copied_ != nullptr) cudaEventDestroy(copied_);
}

absl::Status HierarchicalAllreduce::AsyncError() {
  return local_ ? local_->AsyncError() : absl::OkStatus();
}

void HierarchicalAllreduce::Abort(const absl::Status& reason) {
  if (local_) local_->Abort(reason);
  if (cross_) cross_->Close();
}

absl::Status HierarchicalAllreduce::WaitForStream(absl::Time deadline) {
  KOLO_RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(copied_, stream_), "cudaEventRecord"));
  Backoff backoff;
  while (true) {
    const cudaError_t q = cudaEventQuery(copied_);
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) return CudaStatus(q, "cudaEventQuery");
    KOLO_RETURN_IF_ERROR(local_->AsyncError());
    if (absl::Now() > deadline) {
      absl::Status timeout = absl::DeadlineExceededError(
          "NCCL reduce within the host did not complete within the op timeout "
          "(KOLO_OP_TIMEOUT); communicator aborted");
      local_->Abort(timeout);
      return timeout;
    }
    backoff.Pause();
  }
}

absl::Status HierarchicalAllreduce::Run(void* data, size_t count,
                                        DataType dtype, ReduceOp op,
                                        double premul, double postscale,
                                        absl::Duration op_timeout) {
  if (count == 0) return absl::OkStatus();
  const absl::Time deadline = absl::Now() + op_timeout;
  const size_t elem = DataTypeSize(dtype);
  const ncclDataType_t type = ToNcclDataType(dtype);
  const std::vector<Shard> shards = SplitEvenly(count, plan_.local_size);
  uint8_t* base = static_cast<uint8_t*>(data);

  // 1. Shard k reduced onto local rank k.
  absl::Status s = local_->RunReduction(
      "ncclReduce", deadline, dtype, op, premul,
      [&](ncclComm_t comm, ncclRedOp_t nccl_op) {
        ncclResult_t first = ncclGroupStart();
        if (first != ncclSuccess) return first;
        for (int k = 0; k < plan_.local_size; ++k) {
          if (shards[k].count == 0) continue;
          void* shard = base + shards[k].offset * elem;
          ncclResult_t r = ncclReduce(shard, shard, shards[k].count, type,
                                      nccl_op, k, comm, stream_);
          if (first == ncclSuccess) first = r;
        }
        ncclResult_t end = ncclGroupEnd();
        return first != ncclSuccess ? first : end;
      });
  if (!s.ok()) return s;

  // 2. My shard between hosts, through pinned host memory.
  const Shard mine = shards[plan_.local_rank];
  const size_t bytes = mine.count * elem;
  if (bytes > 0) {
    if (staging_bytes_ < bytes) {
      if (staging_ != nullptr) {
        // The last call's copy back from it must be done first.
        KOLO_RETURN_IF_ERROR(WaitForStream(deadline));
        cudaFreeHost(staging_);
        staging_ = nullptr;
        staging_bytes_ = 0;
      }
      KOLO_RETURN_IF_ERROR(
          CudaStatus(cudaMallocHost(&staging_, bytes), "cudaMallocHost"));
      staging_bytes_ = bytes;
    }
    void* shard = base + mine.offset * elem;
    KOLO_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(staging_, shard, bytes,
                                   cudaMemcpyDeviceToHost, stream_),
                   "cudaMemcpyAsync (device to host)"));
    KOLO_RETURN_IF_ERROR(WaitForStream(deadline));
    KOLO_RETURN_IF_ERROR(cross_->Allreduce(staging_, mine.count, dtype, op));
    if (postscale != 1.0) cpu::Scale(dtype, staging_, mine.count, postscale);
    KOLO_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(shard, staging_, bytes,
                                   cudaMemcpyHostToDevice, stream_),
                   "cudaMemcpyAsync (host to device)"));
  }

  // 3. Shard k from local rank k to the host.
  return local_->Run("ncclBroadcast", deadline, [&](ncclComm_t comm) {
    ncclResult_t first = ncclGroupStart();
    if (first != ncclSuccess) return first;
    for (int k = 0; k < plan_.local_size; ++k) {
      if (shards[k].count == 0) continue;
      void* shard = base + shards[k].offset * elem;
      ncclResult_t r =
          ncclBroadcast(shard, shard, shards[k].count, type, k, comm, stream_);
      if (first == ncclSuccess) first = r;
    }
    ncclResult_t end = ncclGroupEnd();
    return first != ncclSuccess ? first : end;
  });
}

}  // namespace nccl
}  // namespace kolo
