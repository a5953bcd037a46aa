#include "runtime/loop/job_state.h"

#include <utility>

namespace kolo {

bool JobState::Fail(const absl::Status& error) {
  {
    MutexLock lock(&mu_);
    if (!error_.ok()) return false;
    error_ = error;
    failed_.store(true, std::memory_order_release);
  }
  cv_.NotifyAll();
  return true;
}

absl::Status JobState::Error() const {
  MutexLock lock(&mu_);
  return error_;
}

absl::Status JobState::WaitForFailure(absl::Time until) {
  MutexLock lock(&mu_);
  while (error_.ok() && cv_.WaitUntil(&mu_, until)) {
  }
  return error_;
}

void JobState::LoopEnded() {
  {
    MutexLock lock(&mu_);
    loop_ended_ = true;
  }
  cv_.NotifyAll();
}

bool JobState::WaitLoopEnded(absl::Time deadline) {
  MutexLock lock(&mu_);
  while (!loop_ended_ && cv_.WaitUntil(&mu_, deadline)) {
  }
  return loop_ended_;
}

bool JobState::SetShutdownWaiting(std::vector<int> ranks) {
  MutexLock lock(&mu_);
  if (shutdown_waiting_known_ && shutdown_waiting_ == ranks) return false;
  shutdown_waiting_ = std::move(ranks);
  shutdown_waiting_known_ = true;
  return true;
}

std::vector<int> JobState::ShutdownWaiting() const {
  MutexLock lock(&mu_);
  return shutdown_waiting_;
}

}  // namespace kolo
