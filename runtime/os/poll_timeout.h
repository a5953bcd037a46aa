// PollTimeoutMs: the timeout argument of poll(2) and epoll_wait(2) for a
// deadline.
//
// Thread safety: pure functions (the one-argument form reads the clock).
#ifndef KOLO_RUNTIME_OS_POLL_TIMEOUT_H_
#define KOLO_RUNTIME_OS_POLL_TIMEOUT_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kolo {
namespace os {

// Milliseconds from `now` until `deadline`: -1 (wait forever) for
// InfiniteFuture, 0 once the deadline has passed, otherwise rounded up, so
// that a poll loop never wakes just before its deadline and spins; at most
// INT_MAX.
int PollTimeoutMs(absl::Time deadline, absl::Time now);
// The same from absl::Now().
inline int PollTimeoutMs(absl::Time deadline) {
  return PollTimeoutMs(deadline, absl::Now());
}

}  // namespace os
}  // namespace kolo

#endif  // KOLO_RUNTIME_OS_POLL_TIMEOUT_H_
