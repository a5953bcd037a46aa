#include "runtime/os/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

namespace kolo {
namespace os {

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout, FutexScope scope) {
  const int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(timeout));
  struct timespec ts;
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  // EAGAIN (the word changed), EINTR and ETIMEDOUT all send the caller back
  // to re-check the word: nothing to report.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word),
          scope == FutexScope::kShared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE,
          expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word, FutexScope scope) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word),
          scope == FutexScope::kShared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE,
          INT_MAX, nullptr, nullptr, 0);
}

}  // namespace os
}  // namespace kolo
