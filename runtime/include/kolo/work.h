// Work: the completion handle of one asynchronous collective.
//
// A Work is a cheap, copyable reference to shared completion state. It is
// completed exactly once, by the runtime's background thread (or by the
// thread that observes a failure), with an absl::Status. Any thread may
// query or wait on it.
#ifndef KOLO_WORK_H_
#define KOLO_WORK_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kolo {

namespace internal {
class WorkState;
}  // namespace internal

// Whether `status` is a Work::Wait(timeout) that ran out before the
// collective completed (the caller's own deadline: the collective is still
// pending), as opposed to a collective that failed (any other status,
// DeadlineExceeded from KOLO_OP_TIMEOUT or a stall included). The status
// carries the payload kWaitTimeoutPayload.
inline constexpr char kWaitTimeoutPayload[] = "type.kolo.dev/WaitTimeout";
bool IsWaitTimeout(const absl::Status& status);

// The rank whose loss `status` reports (Unavailable "rank 2 lost: ...",
// "lost coordinator (rank 0): ..."), from the payload kLostRankPayload; -1
// for any other status. Elastic jobs (kolo/elastic.h) pass it on to the
// launcher, which removes that worker.
inline constexpr char kLostRankPayload[] = "type.kolo.dev/LostRank";
int LostRank(const absl::Status& status);

class Work {
 public:
  Work() = default;  // An already-failed handle (FailedPrecondition).

  // Non-blocking.
  bool IsCompleted() const;

  // Blocks until the collective completes or `timeout` passes. Returns the
  // collective's status, or DeadlineExceeded if `timeout` passed first (the
  // collective itself is not cancelled and may still complete later: Wait
  // again). A collective can fail with DeadlineExceeded of its own too
  // (KOLO_OP_TIMEOUT, a stall): IsWaitTimeout() tells the two apart.
  absl::Status Wait(absl::Duration timeout = absl::InfiniteDuration()) const;
  // Wait() without spinning: blocks in the kernel at once, and does not
  // count as a caller waiting (so the background thread does not spin for
  // it either; Note [Spin then block]). For helper threads that wait on
  // collectives in the background and must not take CPU from the training
  // loop.
  absl::Status WaitQuietly(
      absl::Duration timeout = absl::InfiniteDuration()) const;

  // The final status; Unknown("pending") while not completed.
  absl::Status status() const;

  // Allgather: the first dimension contributed by each rank, in rank order.
  // Alltoall: the rows this rank received from each rank, in rank order.
  // Empty for other collectives and until completed.
  std::vector<int64_t> received_splits() const;

  explicit Work(std::shared_ptr<internal::WorkState> state)
      : state_(std::move(state)) {}
  const std::shared_ptr<internal::WorkState>& state() const { return state_; }

 private:
  std::shared_ptr<internal::WorkState> state_;
};

namespace internal {

// Shared completion state. Completed once; later Complete() calls are ignored.
class WorkState {
 public:
  // Returns false if already completed.
  bool Complete(absl::Status status, std::vector<int64_t> splits = {});
  bool IsCompleted() const;
  absl::Status Wait(absl::Duration timeout) const;
  absl::Status WaitQuietly(absl::Duration timeout) const;
  absl::Status status() const;
  std::vector<int64_t> splits() const;
  // A collective's result that is one number (join: the rank that joined
  // last; creating a process set: its id), set by the runtime before it
  // completes the Work. 0 until set.
  void SetValue(int64_t value);
  int64_t value() const;

  // Set by the runtime before the Work is handed out: Wait() first polls
  // for `spin` (Note [Spin then block] in runtime/sync/wakeup.h), and
  // counts itself in `waiters` while it waits, so that the background
  // thread spins only while some caller waits.
  void SetWaitPolicy(absl::Duration spin,
                     std::shared_ptr<std::atomic<int>> waiters);

 private:
  // Blocks up to `remaining`; errors name the caller's whole `timeout`.
  absl::Status WaitBlocking(absl::Duration remaining,
                            absl::Duration timeout) const;

  absl::Duration spin_ = absl::ZeroDuration();
  std::shared_ptr<std::atomic<int>> waiters_;
  std::atomic<bool> done_flag_{false};  // done_, readable without mu_
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;                   // guarded by mu_
  mutable int blocked_ = 0;             // waiters on cv_, guarded by mu_
  absl::Status status_;                 // guarded by mu_
  std::vector<int64_t> splits_;         // guarded by mu_
  int64_t value_ = 0;                   // guarded by mu_
};

}  // namespace internal
}  // namespace kolo

#endif  // KOLO_WORK_H_
