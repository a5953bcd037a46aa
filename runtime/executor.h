// Executor: runs one (possibly fused) response on this rank: pack into the
// persistent fusion buffer, one backend collective, unpack, scale, complete
// the Works. A lone tensor skips the fusion buffer (no copy fusion does not
// need).
//
// Thread: owned by the background thread.
#ifndef KOLO_RUNTIME_EXECUTOR_H_
#define KOLO_RUNTIME_EXECUTOR_H_

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "runtime/backend.h"
#include "runtime/tensor_queue.h"
#include "runtime/wire.pb.h"

namespace kolo {

class Executor {
 public:
  Executor(Backend* backend, int rank, int size)
      : backend_(backend), rank_(rank), size_(size) {}

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
  uint8_t* FusionBuffer(size_t bytes);

  Backend* const backend_;
  const int rank_;
  const int size_;
  std::vector<uint8_t> fusion_;       // persistent; grows, never shrinks
  std::vector<uint8_t> gather_send_;  // allgather: this rank's packed block
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_EXECUTOR_H_
