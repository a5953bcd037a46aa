// ShmBarrier: a barrier among the ranks of one shared-memory segment, in
// the segment itself (atomics + futex), so that it works between processes.
//
// Note [Waiting in shared memory]
// A waiter first spins for a short, fixed time (ShmBarrier::Config::spin):
// right after activity the peers usually arrive within microseconds, and
// waking a sleeping thread costs tens of microseconds on a VM. Then it
// sleeps in FUTEX_WAIT on the barrier's generation word (a shared futex,
// keyed by the physical page, so processes and threads alike are woken);
// the last rank to arrive wakes sleepers only if some announced themselves,
// so the fast path makes no system call. Every wait ends
//  - when the barrier completes,
//  - at the op's deadline: the rank then aborts the segment and returns
//    DeadlineExceeded naming the ranks that never arrived,
//  - when some rank aborts the segment: it timed out (the others then fail
//    at once with the same DeadlineExceeded, naming the missing ranks), or
//    its runtime called Backend::Close() (Close() here) because it lost a
//    peer. The abort bit lives in the futex word, so a sleeper cannot miss
//    it.
// An aborted segment stays aborted: every later barrier fails at once, on
// every rank. A dead peer therefore never leaves a rank spinning or sleeping
// beyond its op timeout, and usually not beyond the control plane's loss
// detection (which calls Close()).
//
// Note [Naming the lost rank]
// The rank that closes first is rarely the one that died: it is the first
// to hear from the control plane that some rank k was lost. Its peers'
// runtimes hear the same within milliseconds and fail the collective with
// "rank k lost", then call Close() on their own backend. So a rank woken by
// another rank's Close() waits up to kCloseGrace for its own Close() before
// it returns its (less useful) error: the runtime's error, which names rank
// k, then completes the collective first.
//
// Thread safety: Arrive() is called by one thread per rank (the backend's
// caller); Abort() may be called from any thread of any rank.
#ifndef KOLO_OPS_SHM_BARRIER_H_
#define KOLO_OPS_SHM_BARRIER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace shm {

using Clock = std::chrono::steady_clock;

// Lives in the segment; zero-initialised by its creator.
struct alignas(64) BarrierState {
  // Ranks that arrived at the current barrier.
  alignas(64) std::atomic<uint32_t> arrived;
  // Futex word: low 31 bits count completed barriers, bit 31 = aborted.
  alignas(64) std::atomic<uint32_t> generation;
  // Waiters inside FUTEX_WAIT (or about to enter it).
  alignas(64) std::atomic<uint32_t> sleepers;
  // Who aborted first and why: (1 + rank) | (AbortReason << 16), or 0.
  alignas(64) std::atomic<uint32_t> aborted_by;
};

// Per rank; lives in the segment, one cache line each.
struct alignas(64) RankState {
  // Barriers this rank has arrived at (for "which rank is missing").
  std::atomic<uint64_t> arrived_steps;
  // Scratch values published before a barrier, read after it; indexed by
  // the barrier's parity (Note [Double buffering] in shm_backend.cc).
  std::atomic<uint64_t> value[2];
};

static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "shared-memory atomics must be lock-free");

class ShmBarrier {
 public:
  struct Config {
    int rank = 0;
    int size = 1;
    absl::Duration spin = absl::Microseconds(50);
  };
  ShmBarrier(BarrierState* state, RankState* ranks, Config config);

  // Waits until every rank has arrived; see Note [Waiting in shared memory].
  // `what` names the collective in errors.
  absl::Status Arrive(Clock::time_point deadline, const char* what,
                      absl::Duration op_timeout);

  // Fails every present and future wait on this segment, in every process,
  // and marks this rank closed (Note [Naming the lost rank]). Thread-safe;
  // idempotent.
  void Close();
  bool aborted() const;

  // Barriers completed by this rank (= the parity source of the callers).
  uint64_t step() const { return step_; }
  // How many waits went to sleep in the kernel (diagnostics, tests).
  uint64_t futex_sleeps() const {
    return futex_sleeps_.load(std::memory_order_relaxed);
  }

 private:
  enum class AbortReason : uint32_t { kClosed = 1, kTimedOut = 2 };
  void Abort(AbortReason reason);
  // The error for a wait that found the segment aborted; may wait for this
  // rank's own Close() first (Note [Naming the lost rank]).
  absl::Status AbortedError(const char* what, Clock::time_point deadline,
                            absl::Duration op_timeout);
  // "rank 2 of the set did not arrive ..." for the current barrier.
  std::string MissingRanks() const;

  BarrierState* const state_;
  RankState* const ranks_;
  const Config config_;
  uint64_t step_ = 0;  // caller thread only
  std::atomic<uint64_t> futex_sleeps_{0};
  Mutex closed_mu_;
  CondVar closed_cv_;
  bool closed_ KOLO_GUARDED_BY(closed_mu_) = false;
};

}  // namespace shm
}  // namespace kolo

#endif  // KOLO_OPS_SHM_BARRIER_H_
