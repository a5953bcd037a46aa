#include "runtime/os/poll_timeout.h"

#include <algorithm>
#include <climits>
#include <cstdint>

namespace kolo {
namespace os {

int PollTimeoutMs(absl::Time deadline, absl::Time now) {
  if (deadline == absl::InfiniteFuture()) return -1;
  if (deadline <= now) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(
      absl::Ceil(deadline - now, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

}  // namespace os
}  // namespace kolo
