// WorkState: the completion state behind a kolo::Work, and WorkAccess, the
// one door between the two. Private to kolo (//runtime:work_state, visible
// to the runtime, the frontends and the tests; never installed): the public
// kolo/work.h only forward-declares both, so that a user can neither make a
// Work from a state of their own nor complete one.
//
// Thread safety: a WorkState is completed exactly once (later Complete()
// calls are ignored), by the background thread or by the thread that
// observes a failure; any thread may query or wait on it. SetWaitPolicy()
// and SetValue() are called by the runtime before the Work is handed out
// (SetValue: before it is completed); Renew() only where no Work shares
// the state any more (Note [Works recycled] in runtime/loop/tensor_queue.cc).
//
// Completing and waiting take no lock unless a waiter sleeps (Note
// [Completion without a lock] in work_state.cc).
//
// Errors: Wait()/WaitQuietly() return the collective's status, or
// DeadlineExceeded with kWaitTimeoutPayload when their timeout passes first.
#ifndef KOLO_RUNTIME_API_WORK_STATE_H_
#define KOLO_RUNTIME_API_WORK_STATE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kolo/work.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace internal {

// Shared completion state. Completed once; later Complete() calls are ignored.
class WorkState {
 public:
  // Returns false if already completed.
  bool Complete(absl::Status status, std::vector<int64_t> splits = {});
  // Makes a completed state pending again, for a later collective. Only
  // for a state that nothing else shares (no Work, no waiter).
  void Renew();
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
  // thread spins while some caller waits (and otherwise only after new
  // submissions).
  void SetWaitPolicy(absl::Duration spin,
                     const std::shared_ptr<std::atomic<int>>& waiters);

 private:
  // Blocks up to `remaining`; errors name the caller's whole `timeout`.
  absl::Status WaitBlocking(absl::Duration remaining,
                            absl::Duration timeout) const;

  // What Complete, a poller and Renew touch comes first, together (48
  // bytes: one cache line with make_shared's control block when the
  // allocation is so aligned, two at most), ahead of the wait policy and
  // the sleepers' mutex and condition variable.
  // Set by the one Complete() that wins; the others return at once.
  std::atomic<bool> claimed_{false};
  // Set (seq_cst) once status_ and splits_ are written: from then on they
  // are read without a lock and never written again (until Renew).
  std::atomic<bool> done_flag_{false};
  // Waiters asleep on cv_ (changed under mu_, read by Complete without it).
  mutable std::atomic<int> blocked_{0};
  std::atomic<int64_t> value_{0};
  absl::Status status_;
  std::vector<int64_t> splits_;
  absl::Duration spin_ = absl::ZeroDuration();
  std::shared_ptr<std::atomic<int>> waiters_;
  mutable Mutex mu_;
  mutable CondVar cv_;
};

// The only way to make a Work from a WorkState, or to reach a Work's state
// (Work's constructor and state are private, with WorkAccess its friend).
// For the runtime, which hands Works out, and the frontends' glue.
struct WorkAccess {
  static Work Make(std::shared_ptr<WorkState> state) {
    return Work(std::move(state));
  }
  // Null for a default-constructed Work.
  static const std::shared_ptr<WorkState>& State(const Work& work) {
    return work.state_;
  }
};

}  // namespace internal
}  // namespace kolo

#endif  // KOLO_RUNTIME_API_WORK_STATE_H_
