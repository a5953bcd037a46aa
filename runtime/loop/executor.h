// Executor: runs one (possibly fused) response on this rank: pack into the
// persistent fusion buffer, one backend collective, unpack, scale, complete
// the Works. A lone tensor skips the fusion buffer (no copy fusion does not
// need). One executor per process set and device type: it reaches tensor
// memory only through its backend (memcpy for host backends, copies queued
// on the stream for NCCL), and completes the Works when the backend says
// the response is done (at once for host backends, from the completion
// thread for device backends).
//
// Thread: owned by the background thread; FailPending from any thread.
#ifndef KOLO_RUNTIME_LOOP_EXECUTOR_H_
#define KOLO_RUNTIME_LOOP_EXECUTOR_H_

#include <atomic>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/loop/backend.h"
#include "runtime/loop/tensor_queue.h"
#include "runtime/negotiation/timeline.h"
#include "runtime/wire.pb.h"

namespace kolo {

class Executor {
 public:
  // `rank` and `size` are within the process set.
  // `timeline` (may be null) receives the execution phases of each tensor.
  // `on_async_failure` (may be empty) is told, from the backend's
  // completion thread, when a response the backend completes later failed.
  // `explain_failure` (may be empty) maps a failed collective's status to
  // its cause when there is a better one (the runtime's: "rank 3 lost"),
  // or returns it unchanged.
  Executor(
      Backend* backend, int rank, int size, bool average_over_set_size,
      Timeline* timeline,
      std::function<void(const absl::Status&)> on_async_failure = {},
      std::function<absl::Status(const absl::Status&)> explain_failure = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Bytes of the staging buffers it holds (any thread).
  int64_t buffer_bytes() const { return buffer_bytes_.load(); }

  // Options::phase_times: Execute times its completion of the Works, into
  // complete_ns() (read by the caller of Execute between calls).
  void set_phase_times(bool on) { phase_times_ = on; }
  int64_t complete_ns() const {
    return complete_ns_.load(std::memory_order_relaxed);
  }

  // `entries[i]` is this rank's entry for response.names(i). Completes every
  // entry's Work. Returns a non-OK status only when the collective itself
  // failed (the ranks are then out of step: the caller treats it as fatal);
  // per-tensor problems (an allocator error) fail just that Work.
  absl::Status Execute(const wire::Response& response,
                       std::vector<std::unique_ptr<TensorEntry>>& entries);

  // Fails the Works of responses whose collectives were issued but have not
  // completed (device backends). Thread-safe.
  void FailPending(const absl::Status& status);
  // Responses issued and not completed yet.
  size_t pending() const;

 private:
  bool phase_times_ = false;
  std::atomic<int64_t> complete_ns_{0};
  struct Pending;
  struct Outcome {
    absl::Status status;
    std::vector<int64_t> splits;
  };
  // Hands the entries to the backend's completion: each completes with
  // outcomes[i] (or the backend's error); `temps` are freed then.
  void Finish(std::vector<std::unique_ptr<TensorEntry>>& entries,
              std::vector<Outcome> outcomes, std::vector<void*> temps);
  // Device backends: the data of entries that the caller no longer owns
  // (timed out) or that a joined rank contributes lives in host scratch;
  // moves it to backend memory (freed with `temps`).
  absl::Status MoveScratchToBackend(
      std::vector<std::unique_ptr<TensorEntry>>& entries,
      std::vector<void*>* temps);
  // Memory for an output whose allocator failed: the rank still takes part.
  void* FallbackOutput(size_t bytes, std::vector<void*>* temps);
  absl::Status Allreduce(const wire::Response& r,
                         std::vector<std::unique_ptr<TensorEntry>>& entries);
  absl::Status Broadcast(const wire::Response& r,
                         std::vector<std::unique_ptr<TensorEntry>>& entries);
  absl::Status Allgather(const wire::Response& r,
                         std::vector<std::unique_ptr<TensorEntry>>& entries,
                         std::vector<Outcome>* outcomes,
                         std::vector<void*>* temps);
  absl::Status Alltoall(const wire::Response& r, TensorEntry& entry,
                        Outcome* outcome, std::vector<void*>* temps);
  absl::Status Reducescatter(const wire::Response& r, TensorEntry& entry);
  // Backend memory, allocated once and reused; grows, never shrinks.
  struct Buffer {
    uint8_t* data = nullptr;
    size_t bytes = 0;
  };
  // `buffer`, grown to at least `bytes`. Null when the backend cannot
  // allocate (the response then fails on this rank).
  uint8_t* Grow(Buffer& buffer, size_t bytes);
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
  // Bytes of fusion_ and gather_send_ (written by the background thread,
  // read by Runtime::stats()).
  std::atomic<int64_t> buffer_bytes_{0};
  Buffer fusion_;
  Buffer gather_send_;  // allgather: this rank's packed block;
                        // reducescatter: received chunks
  std::function<void(const absl::Status&)> on_async_failure_;
  std::function<absl::Status(const absl::Status&)> explain_failure_;
  // Entries handed to the backend and not completed yet; shared with the
  // completion callbacks, which may outlive a response.
  std::shared_ptr<Pending> pending_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_EXECUTOR_H_
