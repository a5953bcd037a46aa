#include "runtime/api/work_state.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/time/clock.h"
#include "runtime/sync/wakeup.h"
#include "runtime/util/format.h"

namespace kolo {
namespace internal {

// Note [Completion without a lock]
// A training step completes hundreds of collectives, and their callers
// mostly poll: neither side takes mu_ unless a waiter sleeps. Complete()
// claims the state (one winner), writes the status, publishes it with
// done_flag_, then looks at blocked_; a sleeper counts itself in blocked_
// under mu_ before it looks at done_flag_. Both are seq_cst, so either the
// completer sees the sleeper or the sleeper sees done_flag_ and does not
// sleep. A sleeper holds mu_ from its look until it waits, so once the
// completer has taken and released mu_ the sleeper waits on cv_ (or has
// seen the flag); the completer notifies after releasing it. Notified
// under mu_, a woken sleeper would block again at once on the mutex the
// completer still holds: on a core shared by the two threads, two more
// context switches and a system call per wake-up.
bool WorkState::Complete(absl::Status status, std::vector<int64_t> splits) {
  if (claimed_.exchange(true, std::memory_order_acq_rel)) return false;
  status_ = std::move(status);
  splits_ = std::move(splits);
  done_flag_.store(true, std::memory_order_seq_cst);
  if (blocked_.load(std::memory_order_seq_cst) > 0) {
    { MutexLock lock(&mu_); }
    cv_.NotifyAll();
  }
  return true;
}

void WorkState::Renew() {
  // The caller made sure that every earlier reader is done (Note [Works
  // recycled]) and that nobody else can reach this state.
  status_ = absl::OkStatus();
  splits_.clear();
  value_.store(0, std::memory_order_relaxed);
  done_flag_.store(false, std::memory_order_relaxed);
  claimed_.store(false, std::memory_order_release);
}

// By reference, and assigned only when it changes: a renewed state keeps
// its runtime's counter, and a copy per submission would write the
// counter's reference count, on the line the background thread polls
// (the count of waiters) while it spins.
void WorkState::SetWaitPolicy(
    absl::Duration spin, const std::shared_ptr<std::atomic<int>>& waiters) {
  spin_ = spin;
  if (waiters_ != waiters) waiters_ = waiters;
}

bool WorkState::IsCompleted() const {
  return done_flag_.load(std::memory_order_acquire);
}

absl::Status WorkState::Wait(absl::Duration timeout) const {
  if (!done_flag_.load(std::memory_order_acquire)) {
    // Counted as waiting (spinning or blocked) for the whole wait.
    struct Counted {
      explicit Counted(std::atomic<int>* w) : waiters(w) {
        if (waiters) waiters->fetch_add(1, std::memory_order_seq_cst);
      }
      ~Counted() {
        if (waiters) waiters->fetch_sub(1, std::memory_order_seq_cst);
      }
      std::atomic<int>* waiters;
    } counted(waiters_.get());
    const absl::Time start = absl::Now();
    SpinUntil([&] { return done_flag_.load(std::memory_order_acquire); },
              std::min(spin_, timeout));
    return WaitBlocking(timeout == absl::InfiniteDuration()
                            ? timeout
                            : timeout - (absl::Now() - start),
                        timeout);
  }
  return status_;
}

absl::Status WorkState::WaitQuietly(absl::Duration timeout) const {
  if (!done_flag_.load(std::memory_order_acquire)) {
    return WaitBlocking(timeout, timeout);
  }
  return status_;
}

absl::Status WorkState::WaitBlocking(absl::Duration remaining,
                                     absl::Duration timeout) const {
  const absl::Time deadline =
      remaining == absl::InfiniteDuration()
          ? absl::InfiniteFuture()
          : absl::Now() + std::max(remaining, absl::ZeroDuration());
  bool done;
  {
    MutexLock lock(&mu_);
    blocked_.fetch_add(1, std::memory_order_seq_cst);
    while (!(done = done_flag_.load(std::memory_order_seq_cst)) &&
           cv_.WaitUntil(&mu_, deadline)) {
    }
    // A completion that came with the deadline still counts.
    done = done_flag_.load(std::memory_order_seq_cst);
    blocked_.fetch_sub(1, std::memory_order_relaxed);
  }
  if (!done) {
    absl::Status expired = absl::DeadlineExceededError(
        "Work::Wait timed out after " + FormatSeconds(timeout) +
        "; the collective is still pending");
    expired.SetPayload(kWaitTimeoutPayload, absl::Cord("1"));
    return expired;
  }
  return status_;
}

absl::Status WorkState::status() const {
  if (!done_flag_.load(std::memory_order_acquire)) {
    return absl::UnknownError("pending");
  }
  return status_;
}

std::vector<int64_t> WorkState::splits() const {
  if (!done_flag_.load(std::memory_order_acquire)) return {};
  return splits_;
}

void WorkState::SetValue(int64_t value) {
  if (!claimed_.load(std::memory_order_acquire)) {
    value_.store(value, std::memory_order_relaxed);
  }
}

int64_t WorkState::value() const {
  // Set before Complete's release of done_flag_, read after its acquire.
  return value_.load(std::memory_order_relaxed);
}

}  // namespace internal
}  // namespace kolo
