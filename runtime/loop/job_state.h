// JobState: what this rank knows of the job as a whole: the error that
// ended it, whether the background loop has ended, and the ranks a
// shutdown still waits for (as the coordinator last said). Any thread: one
// lock over all of it, and failed() is read without it (the loop asks
// several times a pass).
#ifndef KOLO_RUNTIME_LOOP_JOB_STATE_H_
#define KOLO_RUNTIME_LOOP_JOB_STATE_H_

#include <atomic>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/sync/mutex.h"

namespace kolo {

class JobState {
 public:
  // Records `error` (not OK) as the job's; false, changing nothing, if the
  // job had failed already (the first error is the one reported).
  bool Fail(const absl::Status& error);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The job's error; OK while it runs (without the lock, whose cache line
  // callers would otherwise fetch back on their next submission).
  absl::Status status() const { return failed() ? Error() : absl::OkStatus(); }
  // Waits until the job fails or `until` passes; the job's error, or OK.
  absl::Status WaitForFailure(absl::Time until);

  // The background loop ended (it runs nothing more).
  void LoopEnded();
  // Waits until the loop has ended or `deadline` passes; whether it ended.
  bool WaitLoopEnded(absl::Time deadline);

  // The ranks that have not asked to shut down although some have, as the
  // coordinator says (wire::ShutdownWaiting); false if it said so before.
  bool SetShutdownWaiting(std::vector<int> ranks);
  // Those ranks (empty: none, or not known).
  std::vector<int> ShutdownWaiting() const;

 private:
  absl::Status Error() const;

  mutable Mutex mu_;
  CondVar cv_;
  absl::Status error_ KOLO_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};  // error_ is set (written under mu_)
  bool loop_ended_ KOLO_GUARDED_BY(mu_) = false;
  std::vector<int> shutdown_waiting_ KOLO_GUARDED_BY(mu_);
  bool shutdown_waiting_known_ KOLO_GUARDED_BY(mu_) = false;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_JOB_STATE_H_
