// HierarchicalAllreduce: NCCL within a host, the CPU backend between hosts
// (KOLO_HIERARCHICAL_ALLREDUCE). See Note [Hierarchical allreduce] in
// hierarchical.cc.
//
// Threads: Run() on the backend's (background) thread only; AsyncError()
// and Abort() from any thread.
#ifndef KOLO_OPS_NCCL_HIERARCHICAL_H_
#define KOLO_OPS_NCCL_HIERARCHICAL_H_

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ops/nccl/communicator.h"
#include "runtime/loop/backend.h"

namespace kolo {
namespace nccl {

// Where a rank sits when a process set is split by host. Pure: computed
// alike on every rank from BackendContext::hosts.
struct HostPlan {
  bool usable = false;  // more than one host, all with the same rank count
  std::string why_not;  // when !usable: for a log line
  int host_index = 0;   // hosts numbered in order of their lowest set rank
  int host_count = 0;
  int local_rank = 0;  // my index among the ranks of my host
  int local_size = 0;
  std::vector<int> local_ranks;  // set ranks on my host, ascending
};
HostPlan MakeHostPlan(const std::vector<std::string>& hosts, int rank);

class HierarchicalAllreduce {
 public:
  // Collective over the set: joins the host's NCCL communicator (unique id
  // under "nccl/host<i>" in context.store) and the CPU backend among the
  // ranks with my local index (store prefix "nccl/cross<j>"). The calling
  // thread's current device must be context.device.
  static absl::StatusOr<std::unique_ptr<HierarchicalAllreduce>> Create(
      const BackendContext& context, const HostPlan& plan, cudaStream_t stream);
  ~HierarchicalAllreduce();

  // In place on `count` elements on the device, queued on the stream; blocks
  // while its shard crosses hosts. `premul` (sum of floating point only)
  // multiplies every input; `postscale` multiplies the result (applied on
  // the host, before the shard goes back to the device). Bounded by
  // `op_timeout` (then the local communicator is aborted).
  absl::Status Run(void* data, size_t count, DataType dtype, ReduceOp op,
                   double premul, double postscale, absl::Duration op_timeout);

  absl::Status AsyncError();
  // Aborts the local communicator and closes the CPU backend.
  void Abort(const absl::Status& reason);

 private:
  HierarchicalAllreduce(const HostPlan& plan, cudaStream_t stream)
      : plan_(plan), stream_(stream) {}
  absl::Status WaitForStream(absl::Time deadline);

  const HostPlan plan_;
  const cudaStream_t stream_;
  std::unique_ptr<Communicator> local_;
  std::unique_ptr<Backend> cross_;
  cudaEvent_t copied_ = nullptr;
  void* staging_ = nullptr;  // pinned, grows, kept
  size_t staging_bytes_ = 0;
};

}  // namespace nccl
}  // namespace kolo

#endif  // KOLO_OPS_NCCL_HIERARCHICAL_H_
