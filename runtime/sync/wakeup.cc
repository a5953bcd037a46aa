#include "runtime/sync/wakeup.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

namespace kolo {
namespace {

// Note [Spin then block]: a sleeper re-checks its deadline at least this
// often.
constexpr absl::Duration kMaxSleep = absl::Milliseconds(500);

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout, bool shared) {
  const int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(timeout));
  struct timespec ts;
  ts.tv_sec = ns / 1000000000;
  ts.tv_nsec = ns % 1000000000;
  // EAGAIN (changed), EINTR and ETIMEDOUT all send the caller back to
  // re-check the word.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word),
          shared ? FUTEX_WAIT : FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void FutexWakeAll(std::atomic<uint32_t>* word, bool shared) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word),
          shared ? FUTEX_WAKE : FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr,
          0);
}

}  // namespace

namespace internal {

int64_t MonotonicNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void SpinPause(uint32_t iteration) {
  // A few pauses, then give the core away if anything else wants it: on a
  // machine with fewer cores than spinning and working threads, the thread
  // we wait for may be waiting for our core.
  if ((iteration & 7) != 7) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  } else {
    sched_yield();
  }
}

}  // namespace internal

Wakeup::Wakeup() : word_(&own_), shared_(false) {}

Wakeup::Wakeup(WakeupWord* word, bool shared) : word_(word), shared_(shared) {}

void Wakeup::Notify() {
  word_->epoch.fetch_add(1, std::memory_order_seq_cst);
  // Pairs with the waiter's increment-then-check (both seq_cst): either we
  // see the sleeper, or it sees the new epoch and does not sleep.
  if (word_->sleepers.load(std::memory_order_seq_cst) != 0) {
    FutexWakeAll(&word_->epoch, shared_);
  }
}

bool Wakeup::Wait(uint32_t seen, absl::Time deadline, absl::Duration spin) {
  auto changed = [&] {
    return word_->epoch.load(std::memory_order_acquire) != seen;
  };
  if (SpinUntil(changed, std::min(spin, deadline - absl::Now()))) return true;
  while (true) {
    const absl::Time now = absl::Now();
    if (now >= deadline) return changed();
    word_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (word_->epoch.load(std::memory_order_seq_cst) == seen) {
      sleeps_.fetch_add(1, std::memory_order_relaxed);
      FutexWait(&word_->epoch, seen, std::min(deadline - now, kMaxSleep),
                shared_);
    }
    word_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (changed()) return true;
  }
}

}  // namespace kolo
