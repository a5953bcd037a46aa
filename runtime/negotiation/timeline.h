// Timeline: a Chrome trace (chrome://tracing, Perfetto) of what rank 0 does
// with each tensor, under Horovod's activity names (users' tools read them):
// NEGOTIATE_ALLREDUCE (first request seen -> every rank submitted; likewise
// NEGOTIATE_BROADCAST, ...), then the operation (ALLREDUCE, ...) holding
// QUEUE (ready -> executed), MEMCPY_IN_FUSION_BUFFER, the collective (e.g.
// GLOO_ALLREDUCE, with size and fused-batch id) and MEMCPY_OUT_FUSION_BUFFER;
// with mark_cycles, a CYCLE_START marker for each pass of the background
// loop. One row per tensor.
//
// Events go through a bounded queue to a writer thread of its own, so the
// background thread never waits on the disk; when the queue is full, events
// are dropped and counted. Stop() (also on Abort) closes the JSON array, so
// the file is valid JSON whenever the timeline was stopped.
//
// Thread safety: every method is thread-safe; event methods cost one atomic
// load when the timeline is off.
#ifndef KOLO_RUNTIME_NEGOTIATION_TIMELINE_H_
#define KOLO_RUNTIME_NEGOTIATION_TIMELINE_H_

#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/status/status.h"
#include "runtime/sync/mutex.h"

namespace kolo {

// Horovod's names of the activities of a tensor: "NEGOTIATE_ALLREDUCE" for a
// wire::RequestType ("NEGOTIATE" for the others), "ALLREDUCE" for a
// wire::ResponseType that an executor runs (nullptr for the others).
const char* NegotiatePhase(int request_type);
const char* OperationPhase(int response_type);

class Timeline {
 public:
  static constexpr size_t kMaxQueued = 1 << 16;

  Timeline() = default;
  ~Timeline() { Stop(); }

  // FailedPrecondition if already started; InvalidArgument if the file
  // cannot be created. `mark_cycles`: CycleStart() writes markers.
  absl::Status Start(const std::string& path, bool mark_cycles = false);
  // Flushes, closes the JSON array and the file. Idempotent.
  void Stop();
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // `args` is the inside of a JSON object ("\"size\": 4096"), or empty.
  void Begin(const std::string& tensor, const char* phase,
             const std::string& args = "");
  void End(const std::string& tensor, const char* phase);
  void Marker(const char* name);
  // A CYCLE_START marker, if the timeline marks cycles.
  void CycleStart() {
    if (mark_cycles_.load(std::memory_order_relaxed)) Marker("CYCLE_START");
  }
  int64_t dropped() const { return dropped_.load(); }

 private:
  struct Event {
    char type;  // 'B', 'E' or 'i'
    std::string tensor;
    const char* phase;
    int64_t micros;
    std::string args;
  };
  void Push(Event event);
  void WriterLoop();
  void Write(const Event& event);

  std::atomic<bool> enabled_{false};
  std::atomic<bool> mark_cycles_{false};
  std::atomic<int64_t> dropped_{0};
  std::chrono::steady_clock::time_point start_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Event> queue_ KOLO_GUARDED_BY(mu_);
  bool stopping_ KOLO_GUARDED_BY(mu_) = false;
  std::thread writer_;
  Mutex lifecycle_mu_;  // serializes Start/Stop
  // Writer thread only:
  std::FILE* file_ = nullptr;
  bool first_event_ = true;
  std::unordered_map<std::string, int> tids_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_NEGOTIATION_TIMELINE_H_
