// Executor: runs one (possibly fused) response on this rank: pack into the
// persistent fusion buffer, one backend collective, unpack, scale, complete
// the Works. A lone tensor skips the fusion buffer (no copy fusion does not
// need).
//
// Thread: owned by the background thread.
#ifndef KOLO_RUNTIME_EXECUTOR_H_
#define KOLO_RUNTIME_EXECUTOR_H_

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/backend.h"
#include "runtime/tensor_queue.h"
#include "runtime/timeline.h"
#include "runtime/wire.pb.h"

namespace kolo {

class Executor {
 public:
  // `rank` and `size` are within the process set.
  // `timeline` (may be null) receives the execution phases of each tensor.
  Executor(Backend* backend, int rank, int size, bool average_over_set_size,
           Timeline* timeline)
      : backend_(backend),
        rank_(rank),
        size_(size),
        average_over_set_size_(average_over_set_size),
        timeline_(timeline) {}

  // `entries[i]` is this rank's entry for response.names(i). Completes every
  // entry's Work. Returns a non-OK status only when the collective itself
  // failed (the ranks are then out of step: the caller treats it as fatal);
  // per-tensor problems (an allocator error) fail just that Work.
  absl::Status Execute(const wire::Response& response,
                       std::vector<std::unique_ptr<TensorEntry>>& entries);

  // Bytes held by the persistent fusion buffers.
  size_t fusion_buffer_bytes() const {
    return fusion_.capacity() + gather_send_.capacity();
  }

 private:
  absl::Status Allreduce(const wire::Response& r,
                         std::vector<std::unique_ptr<TensorEntry>>& entries);
  absl::Status Broadcast(const wire::Response& r,
                         std::vector<std::unique_ptr<TensorEntry>>& entries);
  absl::Status Allgather(const wire::Response& r,
                         std::vector<std::unique_ptr<TensorEntry>>& entries);
  absl::Status Alltoall(const wire::Response& r, TensorEntry& entry);
  absl::Status Reducescatter(const wire::Response& r, TensorEntry& entry);
  uint8_t* FusionBuffer(size_t bytes);
  // "GLOO_ALLREDUCE" for op "ALLREDUCE"; the pointer stays valid.
  const char* CollectivePhase(const char* op);
  // Runs `body` as timeline phase `phase` of every tensor of `r`.
  template <typename F>
  auto Phase(const wire::Response& r, const char* phase, F&& body,
             const std::string& args = "");

  Backend* const backend_;
  const int rank_;
  const int size_;
  const bool average_over_set_size_;
  Timeline* const timeline_;
  int64_t batch_ = 0;  // fused-batch id, for the timeline
  std::set<std::string> phase_names_;
  std::vector<uint8_t> fusion_;       // persistent; grows, never shrinks
  std::vector<uint8_t> gather_send_;  // allgather: this rank's packed block;
                                      // reducescatter: received chunks
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_EXECUTOR_H_
