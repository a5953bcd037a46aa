#include "kolo/work.h"

namespace kolo {

bool Work::IsCompleted() const { return state_ && state_->IsCompleted(); }

absl::Status Work::Wait(absl::Duration timeout) const {
  if (!state_) return absl::FailedPreconditionError("empty Work handle");
  return state_->Wait(timeout);
}

absl::Status Work::status() const {
  if (!state_) return absl::FailedPreconditionError("empty Work handle");
  return state_->status();
}

std::vector<int64_t> Work::received_splits() const {
  if (!state_) return {};
  return state_->splits();
}

namespace internal {

bool WorkState::Complete(absl::Status status, std::vector<int64_t> splits) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return false;
    done_ = true;
    status_ = std::move(status);
    splits_ = std::move(splits);
  }
  cv_.notify_all();
  return true;
}

bool WorkState::IsCompleted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

absl::Status WorkState::Wait(absl::Duration timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout == absl::InfiniteDuration()) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                           [&] { return done_; })) {
    return absl::DeadlineExceededError(
        "Work::Wait timed out after " + absl::FormatDuration(timeout) +
        "; the collective is still pending");
  }
  return status_;
}

absl::Status WorkState::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return absl::UnknownError("pending");
  return status_;
}

std::vector<int64_t> WorkState::splits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return splits_;
}

}  // namespace internal
}  // namespace kolo
