#include "kolo/work.h"

#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "runtime/api/work_state.h"

namespace kolo {

bool IsWaitTimeout(const absl::Status& status) {
  return absl::IsDeadlineExceeded(status) &&
         status.GetPayload(kWaitTimeoutPayload).has_value();
}

int LostRank(const absl::Status& status) {
  auto rank = status.GetPayload(kLostRankPayload);
  int parsed;
  if (!rank || !absl::SimpleAtoi(std::string(*rank), &parsed)) return -1;
  return parsed;
}

Work::Work(std::shared_ptr<internal::WorkState> state)
    : state_(std::move(state)) {}

bool Work::IsCompleted() const { return state_ && state_->IsCompleted(); }

absl::Status Work::Wait(absl::Duration timeout) const {
  if (!state_) return absl::FailedPreconditionError("empty Work handle");
  return state_->Wait(timeout);
}

absl::Status Work::WaitQuietly(absl::Duration timeout) const {
  if (!state_) return absl::FailedPreconditionError("empty Work handle");
  return state_->WaitQuietly(timeout);
}

absl::Status Work::status() const {
  if (!state_) return absl::FailedPreconditionError("empty Work handle");
  return state_->status();
}

std::vector<int64_t> Work::received_splits() const {
  if (!state_) return {};
  return state_->splits();
}

}  // namespace kolo
