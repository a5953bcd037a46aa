// Work: the completion handle of one asynchronous collective.
//
// A Work is a cheap, copyable reference to shared completion state, and
// opaque: only the runtime makes one (Runtime's collectives return it); a
// default-constructed Work is an already-failed handle. It is completed
// exactly once, by the runtime's background thread (or by the thread that
// observes a failure), with an absl::Status.
//
// Thread safety: every method may be called from any thread, on the same
// Work or on copies of it, at the same time. IsCompleted(), status() and
// received_splits() return at once; Wait() blocks up to its timeout.
//
// Errors: Wait() and status() return the collective's own status (the codes
// of kolo/runtime.h: InvalidArgument, DeadlineExceeded, Unavailable with
// LostRank(), Aborted); DeadlineExceeded with IsWaitTimeout() when Wait's own
// timeout passed first; FailedPrecondition on a default-constructed Work.
#ifndef KOLO_WORK_H_
#define KOLO_WORK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace kolo {

namespace internal {
class WorkState;  // private to kolo
struct WorkAccess;
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
  // it either). For helper threads that wait on
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

 private:
  // Only the runtime makes a Work from its state, and reaches the state of
  // one, through internal::WorkAccess (private to kolo).
  friend struct internal::WorkAccess;
  explicit Work(std::shared_ptr<internal::WorkState> state);

  std::shared_ptr<internal::WorkState> state_;
};

}  // namespace kolo

#endif  // KOLO_WORK_H_
