// Wakeup: a spin-then-block doorbell on one 32-bit word, for a single
// waiting thread and any number of notifiers, in one process or across
// processes (the word may live in shared memory).
//
// Note [Spin then block]
// Waking a thread that sleeps in the kernel costs tens of microseconds on a
// VM (an inter-processor interrupt, a context switch), which is more than a
// whole small collective over shared memory. So a waiter that expects news
// soon first polls the word for a bounded time (`spin`), yielding its core
// between polls so that a runnable thread on the same core still gets it;
// then it sleeps in FUTEX_WAIT on the word until `deadline`. A notifier
// bumps the word and makes the system call only when the waiter announced
// that it sleeps, so a notification to a spinning (or busy) waiter costs two
// atomic operations. Whoever waits decides whether to spin at all: the
// runtime's background thread spins only while a caller is blocked in
// Work::Wait, and for one spin time after the last one did or after a pass
// that followed new submissions (Note [Background loop] in
// background_loop.cc). So an idle job never loses a core to it, and a
// burst of submissions (a backward pass's gradient hooks, each a few
// microseconds after the last) is caught by polling instead of a kernel
// wake-up per submission, which on a VM costs the submitting thread an
// inter-processor interrupt each when the background thread sleeps on
// another core.
//
// Every wait is bounded by its deadline; a sleeper also wakes at least every
// kMaxSleep to re-check it, so even a lost wake-up (which the protocol rules
// out) cannot hang a rank.
//
// Note [Polling for a sleeper]
// A thread may poll for what the waiter waits for on its behalf (a caller
// in the loop's turn: Note [Caller turns] in runtime/loop/caller_turn.cc).
// Between BeginPolling and EndPolling a Notify does not wake a sleeping
// waiter (the poller sees the new epoch itself); it marks the word
// instead. EndPolling(seen) wakes the sleeper if a notification was left
// so and the epoch moved on since `seen`, the last epoch whose news the
// poller dealt with (what it did not deal with, it hands on by a Notify of
// its own after EndPolling). Marking and ending are one word's
// compare-and-swap and exchange, and the poller reads the epoch after the
// exchange: either the mark comes first and the poller sees it (with the
// epoch it bumped), or the notifier sees the polling end and wakes the
// sleeper itself, so no notification is lost.
//
// Thread safety: Notify() from any thread or process; Wait() from one
// thread at a time.
#ifndef KOLO_RUNTIME_SYNC_WAKEUP_H_
#define KOLO_RUNTIME_SYNC_WAKEUP_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kolo {

// The words of a Wakeup; may be placed in shared memory (zero-initialised).
struct alignas(64) WakeupWord {
  std::atomic<uint32_t> epoch{0};     // bumped by every Notify (futex word)
  std::atomic<uint32_t> sleepers{0};  // waiters in (or entering) FUTEX_WAIT
  // Note [Polling for a sleeper]: Wakeup::kPolled, Wakeup::kSkipped. On a
  // line of its own: the poller writes it, the waiter never reads it, and
  // notifiers read it only while the waiter sleeps.
  alignas(64) std::atomic<uint32_t> polling{0};
};

class Wakeup {
 public:
  // Uses its own word, private to this process.
  Wakeup();
  // Uses `word` (not owned), which may be mapped by other processes; then
  // `shared` must be true (a process-shared futex).
  Wakeup(WakeupWord* word, bool shared);
  Wakeup(const Wakeup&) = delete;
  Wakeup& operator=(const Wakeup&) = delete;

  // Take the epoch, then look for work, then Wait(epoch, ...): a Notify()
  // after Epoch() makes Wait return at once, so none is lost.
  uint32_t Epoch() const {
    return word_->epoch.load(std::memory_order_acquire);
  }

  // Any thread or process; never blocks.
  void Notify();

  // Note [Polling for a sleeper]: one poller at a time (in any process).
  void BeginPolling() {
    word_->polling.store(kPolled, std::memory_order_seq_cst);
  }
  void EndPolling(uint32_t seen);

  // Returns true as soon as the epoch differs from `seen`, false at
  // `deadline`. Spins (polling, yielding the core) for at most `spin` first.
  bool Wait(uint32_t seen, absl::Time deadline, absl::Duration spin);

  // Waits that went to sleep in the kernel (diagnostics, tests).
  uint64_t sleeps() const { return sleeps_.load(std::memory_order_relaxed); }
  // Whether a waiter sleeps in the kernel now (or is about to).
  bool sleeping() const {
    return word_->sleepers.load(std::memory_order_seq_cst) > 0;
  }

 private:
  // WakeupWord::polling's bits.
  static constexpr uint32_t kPolled = 1, kSkipped = 2;

  WakeupWord own_;
  // Read by every Notify; the waiter's counter below has a line of its
  // own, so that a wait does not take this one from the notifying core.
  WakeupWord* const word_;
  const bool shared_;
  alignas(64) std::atomic<uint64_t> sleeps_{0};
};

// Spins with pause instructions and sched_yield until `done()` or `spin`
// has passed; true if `done()` became true. For waits whose condition is
// not a Wakeup (Work::Wait spins on its own flag this way).
template <typename Done>
bool SpinUntil(Done&& done, absl::Duration spin);

// Implementation detail of SpinUntil.
namespace internal {
int64_t MonotonicNanos();
void SpinPause(uint32_t iteration);
}  // namespace internal

template <typename Done>
bool SpinUntil(Done&& done, absl::Duration spin) {
  if (spin <= absl::ZeroDuration()) return done();
  const int64_t end =
      internal::MonotonicNanos() + absl::ToInt64Nanoseconds(spin);
  for (uint32_t i = 0;; ++i) {
    if (done()) return true;
    if ((i & 15) == 15 && internal::MonotonicNanos() >= end) return done();
    internal::SpinPause(i);
  }
}

}  // namespace kolo

#endif  // KOLO_RUNTIME_SYNC_WAKEUP_H_
