#include "runtime/sync/wakeup.h"

#include <sched.h>
#include <time.h>

#include <algorithm>

#include "runtime/os/futex.h"

namespace kolo {
namespace {

// Note [Spin then block]: a sleeper re-checks its deadline at least this
// often.
constexpr absl::Duration kMaxSleep = absl::Milliseconds(500);

os::FutexScope ScopeOf(bool shared) {
  return shared ? os::FutexScope::kShared : os::FutexScope::kPrivate;
}

}  // namespace

namespace internal {

int64_t MonotonicNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// The first polls only pause (about 1 us in all): the answer a spinner
// waits for usually comes that soon, and a sched_yield is a system call
// (0.3-1 us on a VM) that delays noticing it (kolo_bench, 4 KB at 2 ranks:
// a lone async allreduce 8.1-8.2 us against 9.1-9.8 us with a yield every
// 8th poll from the start; the blocking one and the fused step unchanged).
constexpr uint32_t kSpinPauseFirst = 32;

void SpinPause(uint32_t iteration) {
  // Pauses, then give the core away every 8th poll if anything else wants
  // it: on a machine with fewer cores than spinning and working threads,
  // the thread we wait for may be waiting for our core.
  if (iteration < kSpinPauseFirst || (iteration & 7) != 7) {
    os::CpuPause();
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
  if (word_->sleepers.load(std::memory_order_seq_cst) == 0) return;
  // Note [Polling for a sleeper]: a poller wakes it when it ends.
  uint32_t polling = word_->polling.load(std::memory_order_seq_cst);
  while (polling & kPolled) {
    if (polling & kSkipped) return;
    if (word_->polling.compare_exchange_weak(polling, polling | kSkipped,
                                             std::memory_order_seq_cst)) {
      return;
    }
  }
  os::FutexWakeAll(&word_->epoch, ScopeOf(shared_));
}

void Wakeup::EndPolling(uint32_t seen) {
  if ((word_->polling.exchange(0, std::memory_order_seq_cst) & kSkipped) &&
      word_->epoch.load(std::memory_order_seq_cst) != seen) {
    os::FutexWakeAll(&word_->epoch, ScopeOf(shared_));
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
      os::FutexWait(&word_->epoch, seen, std::min(deadline - now, kMaxSleep),
                    ScopeOf(shared_));
    }
    word_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (changed()) return true;
  }
}

}  // namespace kolo
