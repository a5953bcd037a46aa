#include "runtime/work_state.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/time/clock.h"
#include "runtime/format.h"
#include "runtime/sync/wakeup.h"

namespace kolo {
namespace internal {

bool WorkState::Complete(absl::Status status, std::vector<int64_t> splits) {
  bool wake = false;
  {
    MutexLock lock(&mu_);
    if (done_) return false;
    done_ = true;
    status_ = std::move(status);
    splits_ = std::move(splits);
    done_flag_.store(true, std::memory_order_release);
    // Most Works are waited for by polling (or not yet at all): no system
    // call unless someone sleeps on cv_.
    wake = blocked_ > 0;
  }
  if (wake) cv_.NotifyAll();
  return true;
}

void WorkState::SetWaitPolicy(absl::Duration spin,
                              std::shared_ptr<std::atomic<int>> waiters) {
  spin_ = spin;
  waiters_ = std::move(waiters);
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
  MutexLock lock(&mu_);
  return status_;
}

absl::Status WorkState::WaitQuietly(absl::Duration timeout) const {
  if (!done_flag_.load(std::memory_order_acquire)) {
    return WaitBlocking(timeout, timeout);
  }
  MutexLock lock(&mu_);
  return status_;
}

absl::Status WorkState::WaitBlocking(absl::Duration remaining,
                                     absl::Duration timeout) const {
  MutexLock lock(&mu_);
  ++blocked_;
  const absl::Time deadline =
      remaining == absl::InfiniteDuration()
          ? absl::InfiniteFuture()
          : absl::Now() + std::max(remaining, absl::ZeroDuration());
  while (!done_ && cv_.WaitUntil(&mu_, deadline)) {
  }
  --blocked_;
  if (!done_) {
    absl::Status expired = absl::DeadlineExceededError(
        "Work::Wait timed out after " + FormatSeconds(timeout) +
        "; the collective is still pending");
    expired.SetPayload(kWaitTimeoutPayload, absl::Cord("1"));
    return expired;
  }
  return status_;
}

absl::Status WorkState::status() const {
  MutexLock lock(&mu_);
  if (!done_) return absl::UnknownError("pending");
  return status_;
}

std::vector<int64_t> WorkState::splits() const {
  MutexLock lock(&mu_);
  return splits_;
}

void WorkState::SetValue(int64_t value) {
  MutexLock lock(&mu_);
  if (!done_) value_ = value;
}

int64_t WorkState::value() const {
  MutexLock lock(&mu_);
  return value_;
}

}  // namespace internal
}  // namespace kolo
