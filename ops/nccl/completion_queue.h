// CompletionQueue: the NCCL backend's completion thread and watchdog.
//
// Each Add() hands over a CUDA event recorded on the backend's stream after
// a response's collective and copies, the `done` callback of that
// response, and a deadline. One thread polls the oldest event
// (cudaEventQuery; events on one stream complete in order) and the
// communicators' asynchronous errors (the `check` hook), and runs `done`
// once the event has completed. It spins briefly, then sleeps at most 1 ms
// between polls, and blocks on a condition variable when nothing is pending,
// so that an idle job costs no CPU.
//
// On a CUDA error, an asynchronous NCCL error, or a deadline that passes
// (the watchdog), it calls the `abort` hook (the backend aborts its
// communicators, so that kernels stuck on a lost peer end) and then fails
// every pending `done` with that error; later Add()s fail at once.
//
// Threads: Add() and FailAll() from any thread; `done`, `check` and
// `abort` run on the completion thread (or, for Add() after a failure and
// for FailAll(), on the caller's) with no lock of the queue held, so they
// may call back into the queue and the backend.
#ifndef KOLO_OPS_NCCL_COMPLETION_QUEUE_H_
#define KOLO_OPS_NCCL_COMPLETION_QUEUE_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace nccl {

class CompletionQueue {
 public:
  struct Hooks {
    // Asynchronous errors of the communicators: non-OK fails everything.
    std::function<absl::Status()> check;
    // Called once, before pending work is failed, with the error.
    std::function<void(const absl::Status&)> abort;
  };
  // Starts the thread, which sets `device` as its current CUDA device.
  CompletionQueue(int device, Hooks hooks);
  // Stop() and drop what is pending unanswered: the owner calls FailAll()
  // first (the backend's destructor does).
  ~CompletionQueue();
  CompletionQueue(const CompletionQueue&) = delete;
  CompletionQueue& operator=(const CompletionQueue&) = delete;

  // Takes ownership of `event`. `what` ("allreduce") and `timeout` name the
  // collective in the watchdog's error.
  void Add(cudaEvent_t event, std::function<void(absl::Status)> done,
           absl::Duration timeout, std::string what);
  // Fails every pending `done` and every later Add() with `status` (the
  // first non-OK status given sticks). Does not call the abort hook.
  void FailAll(const absl::Status& status);
  // Stops and joins the thread (idempotent); Add() and FailAll() still work
  // afterwards, without polling. Not from a `done` callback.
  void Stop();
  // The sticky failure, OK while healthy.
  absl::Status failure() const;
  size_t pending() const;

 private:
  struct Entry {
    uint64_t id;
    cudaEvent_t event;
    std::function<void(absl::Status)> done;
    absl::Time deadline;
    absl::Duration timeout;
    std::string what;
  };
  void Loop();
  // Aborts (hook) and fails everything with `status`.
  void Fail(const absl::Status& status);

  const int device_;
  const Hooks hooks_;
  mutable Mutex mu_;
  CondVar cv_;
  std::deque<Entry> pending_ KOLO_GUARDED_BY(mu_);  // in stream order
  uint64_t next_id_ KOLO_GUARDED_BY(mu_) = 0;
  absl::Status failure_ KOLO_GUARDED_BY(mu_);
  bool stop_ KOLO_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace nccl
}  // namespace kolo

#endif  // KOLO_OPS_NCCL_COMPLETION_QUEUE_H_
