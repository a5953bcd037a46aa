// Futex wait and wake on a 32-bit word, and the CPU's spin-wait hint: the
// kernel and CPU primitives under Wakeup (runtime/sync/wakeup.h) and the
// shared-memory barrier (ops/shm/barrier.h).
//
// The protocol around them (who bumps the word, who announces a sleep,
// Note [Spin then block]) belongs to the callers; these only make the
// calls.
//
// Thread safety: any thread; the word may live in memory shared between
// processes (then with FutexScope::kShared).
#ifndef KOLO_RUNTIME_OS_FUTEX_H_
#define KOLO_RUNTIME_OS_FUTEX_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace kolo {
namespace os {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "a futex word must be a plain 32-bit word");

enum class FutexScope {
  // Waiters and wakers are threads of this process (FUTEX_PRIVATE_FLAG:
  // cheaper, keyed by the virtual address).
  kPrivate,
  // The word is in shared memory and may be mapped at different addresses
  // in different processes (keyed by the physical page).
  kShared,
};

// Sleeps while `*word == expected`, for at most `timeout` (a negative one
// counts as zero). Returns on a wake-up, at once if the word differs,
// on a signal or at the timeout, without saying which: the caller
// re-checks the word and its deadline.
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected,
               absl::Duration timeout, FutexScope scope);

// Wakes every thread sleeping in FutexWait on `word`.
void FutexWakeAll(std::atomic<uint32_t>* word, FutexScope scope);

// One spin-wait hint to the CPU (x86 PAUSE, ARM YIELD; nothing elsewhere):
// for the body of a polling loop, so that it spins cheaply and leaves the
// core's resources to its sibling hyperthread.
inline void CpuPause() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace os
}  // namespace kolo

#endif  // KOLO_RUNTIME_OS_FUTEX_H_
