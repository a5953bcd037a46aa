// kolo as a torch.distributed backend: ProcessGroupKolo, whose collectives
// are kolo's, through the LibTorch frontend's Context (frontends/torch).
// On torch 2.x it is a c10d::Backend, which torch wraps in its ProcessGroup
// (registered for cpu and cuda); on 1.13 it is the c10d::ProcessGroup
// itself (1.13's API): one source, a version switch (KoloBackendBase).
// kolo/torch/distributed.py registers it as backend "kolo"
// (docs/torch_distributed.md). Its Works: work.h (Note [Futures of a
// process group]).
//
// Note [Collectives named by sequence]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// torch.distributed's collectives carry no names, and kolo matches
// collectives across ranks by name. Every collective of a group is named by
// the group and its position in the group's sequence: "c10d/<group>/<n>"
// (n counts from 0 on every rank). Ranks that issue the same collectives in
// the same order match them; kolo's negotiation then checks what they
// submitted. A rank that issues a different collective, or the same one with
// another shape, dtype, op or root, at position n gets the mismatch as an
// error on every rank, naming "c10d/<group>/<n>" and each rank's value (the
// check TORCH_DISTRIBUTED_DEBUG=DETAIL makes with an extra collective, here
// a part of the one negotiation every collective has). A rank that stops
// issuing collectives leaves the others' position n waiting: KOLO_OP_TIMEOUT
// names it. A lost rank fails every pending collective at once.
//
// Threads: every method may be called from any thread (torch calls them
// with the GIL released).
#ifndef KOLO_FRONTENDS_PYTHON_SRC_PROCESS_GROUP_H_
#define KOLO_FRONTENDS_PYTHON_SRC_PROCESS_GROUP_H_

#include <torch/version.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "frontends/python/src/point_to_point.h"
#include "frontends/python/src/work.h"
#include "kolo/torch/context.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace torch {

#if TORCH_VERSION_MAJOR >= 2
using KoloBackendBase = c10d::Backend;
#else
using KoloBackendBase = c10d::ProcessGroup;
#endif

class ProcessGroupKolo : public KoloBackendBase {
 public:
  // `process_set`: the kolo process set of this group (0: the whole job);
  // `rank`, `size`: this rank's place in it. `group`: the group's name in
  // collective names (Note [Collectives named by sequence]). `timeout`:
  // the group's (init_process_group's or new_group's timeout), for every
  // collective whose options leave theirs unset, as ProcessGroupGloo
  // does; 0: kolo's op timeout (KOLO_OP_TIMEOUT). Either becomes the kolo
  // request's timeout (docs/guide.md, "Timeouts").
  ProcessGroupKolo(std::shared_ptr<Context> context, int process_set, int rank,
                   int size, std::string group,
                   std::chrono::milliseconds timeout);
  ~ProcessGroupKolo() override;

  const std::string getBackendName() const override { return "kolo"; }
  int process_set() const { return set_; }

  c10::intrusive_ptr<c10d::Work> broadcast(
      std::vector<at::Tensor>& tensors,
      const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts =
          c10d::AllreduceCoalescedOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(
      std::vector<at::Tensor>& tensors,
      const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(
      std::vector<std::vector<at::Tensor>>& outputs,
      std::vector<at::Tensor>& inputs,
      const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs,
      std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
#if TORCH_VERSION_MAJOR >= 2
  // The coalesced forms of _allgather_base and _reduce_scatter_base (FSDP,
  // dist._coalescing_manager): one Work over the pairs, each pair a
  // collective of its own, named "<name>.<i>".
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts =
          c10d::ReduceScatterOptions()) override;
#endif
  c10::intrusive_ptr<c10d::Work> alltoall_base(
      at::Tensor& output, at::Tensor& input,
      std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> barrier(
      const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  // gloo's monitored barrier, from kolo's barrier: group rank 0 names the
  // ranks that did not arrive within the timeout (the first of them, or all
  // with `wait_all_ranks`), as ProcessGroupGloo words it; the others report
  // that they arrived and rank 0 did not answer. kolo's negotiation names
  // the missing ranks on every rank, so no rank waits longer than the
  // timeout.
  void monitoredBarrier(const c10d::BarrierOptions& opts,
                        bool wait_all_ranks = false) override;
  // Point-to-point (Note [Point-to-point of a process group]): connected
  // by ConnectPointToPoint, which every member calls once when the group is
  // made (kolo/torch/distributed.py does).
  void ConnectPointToPoint(const c10::intrusive_ptr<c10d::Store>& store);
  // Which transport it took (PointToPoint::transport()); empty before.
  std::string PointToPointTransport() const;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors,
                                      int dst_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors,
                                      int src_rank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                               int tag) override;
  // torch's sequence number of the group (TORCH_DISTRIBUTED_DEBUG=DETAIL
  // compares it across ranks): the position of the next collective, which
  // starts at 0 on every rank (Note [Collectives named by sequence]).
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return next_; }

 private:
  // The next collective's name (Note [Collectives named by sequence]).
  std::string NextName();
  // The Work of a collective submitted as `handles`, whose finish step is
  // `finish` (waits for the collective, returns its outputs).
  c10::intrusive_ptr<c10d::Work> Enqueue(
      c10d::OpType type, const std::string& name, std::vector<Handle> handles,
      std::function<std::vector<at::Tensor>()> finish);
#if TORCH_VERSION_MAJOR >= 2
  // The Work of a coalesced collective: handles[i] fills outputs[i].
  c10::intrusive_ptr<c10d::Work> EnqueueCoalesced(
      const std::string& name, std::vector<Handle> handles,
      std::vector<at::Tensor> outputs, const char* what);
#endif

  std::vector<int> MissingGroupRanks(const std::string& error) const;
  c10::intrusive_ptr<c10d::Work> SparseAllreduce(
      at::Tensor t, const c10d::AllreduceOptions& opts);
  std::chrono::milliseconds PointToPointTimeout() const;
  PointToPoint& Peers(const char* what);

  // An op's timeout: its options' own, else the group's.
  std::chrono::milliseconds Timeout(std::chrono::milliseconds own) const {
    return own == c10d::kUnsetTimeout ? timeout_ : own;
  }

  const std::shared_ptr<Context> context_;
  const int set_;
  const std::string group_;
  const std::chrono::milliseconds timeout_;
  std::atomic<uint64_t> next_{0};

  const std::shared_ptr<Completer> completer_;
  // Set once by ConnectPointToPoint, before the group is handed to torch.
  std::shared_ptr<PointToPoint> point_to_point_;
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_FRONTENDS_PYTHON_SRC_PROCESS_GROUP_H_
