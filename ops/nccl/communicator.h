// Communicator: one non-blocking NCCL communicator, safe to abort from any
// thread.
//
// Every NCCL call on the communicator runs under one mutex through Run().
// The communicator is created with ncclConfig_t::blocking = 0, so NCCL host
// calls never block on peers: they may return ncclInProgress, after which
// Run() polls ncclCommGetAsyncError (the mutex released between polls)
// until the work is enqueued on the stream, the deadline passes, or the
// communicator is aborted. Abort() takes the same mutex, so it never races
// an NCCL call, and it is idempotent: later calls fail with the reason
// given to the first Abort().
//
// Threads: the backend's thread creates it and calls Run(); AsyncError()
// and Abort() may run on any thread (the completion thread, Close()).
#ifndef KOLO_OPS_NCCL_COMMUNICATOR_H_
#define KOLO_OPS_NCCL_COMMUNICATOR_H_

#include <nccl.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/store.h"
#include "kolo/types.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace nccl {

class Communicator {
 public:
  // Rank `rank` of `size` on the calling thread's current CUDA device.
  // Rank 0 creates the unique id and publishes it (hex) under `key` in
  // `store`; the others read it. Blocks until the communicator is ready,
  // at most `timeout` in all (KOLO_START_TIMEOUT), then aborts it and
  // fails with DeadlineExceeded. `label` names it in errors ("NCCL
  // communicator of 4 ranks", ...). `store` may be null when size is 1.
  static absl::StatusOr<std::unique_ptr<Communicator>> Create(
      Store* store, const std::string& key, int rank, int size,
      absl::Duration timeout, const std::string& label);

  ~Communicator();  // Aborts the communicator if it is still alive.
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& label() const { return label_; }

  // Runs `issue` (NCCL calls on the communicator, e.g. a group) under the
  // mutex, then waits until NCCL has enqueued them (non-blocking mode), up
  // to `deadline`. `what` names the call in errors ("ncclAllReduce").
  absl::Status Run(const char* what, absl::Time deadline,
                   const std::function<ncclResult_t(ncclComm_t)>& issue);
  // Run() for one reduction: `issue` gets the NCCL op for `op`, or, when
  // `premul` is not 1 (op must be kSum, dtype floating point), a PreMulSum
  // op multiplying every input by `premul` (created before and destroyed
  // after `issue`, on this communicator).
  absl::Status RunReduction(
      const char* what, absl::Time deadline, DataType dtype, ReduceOp op,
      double premul,
      const std::function<ncclResult_t(ncclComm_t, ncclRedOp_t)>& issue);
  // ncclCommGetAsyncError: OK while healthy (also while work is being
  // enqueued), the error otherwise, or the abort reason after Abort().
  // Never blocks on peers.
  absl::Status AsyncError();
  // ncclCommAbort, once; `reason` is what later calls report.
  void Abort(const absl::Status& reason);
  bool aborted();

 private:
  Communicator(ncclComm_t comm, int rank, int size, std::string label)
      : comm_(comm), rank_(rank), size_(size), label_(std::move(label)) {}
  absl::Status AbortedStatus() const KOLO_REQUIRES(mu_);

  Mutex mu_;
  ncclComm_t comm_ KOLO_GUARDED_BY(mu_);  // null once aborted
  absl::Status aborted_ KOLO_GUARDED_BY(mu_);
  const int rank_;
  const int size_;
  const std::string label_;
};

// Polling back-off shared by the backend's waits: yields for the first
// polls, then sleeps, growing to at most 1 ms (so a long wait costs little
// CPU and a short one little latency).
class Backoff {
 public:
  void Pause();
  // The sleep the next Pause() would take (zero while still yielding).
  absl::Duration next() const;
  // Counts a poll without pausing (the caller waits next() itself).
  void Tick() { ++polls_; }
  void Reset() { polls_ = 0; }

 private:
  int polls_ = 0;
};

}  // namespace nccl
}  // namespace kolo

#endif  // KOLO_OPS_NCCL_COMMUNICATOR_H_
