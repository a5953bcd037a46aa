#include "ops/shm/barrier.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/os/futex.h"
#include "runtime/sync/mutex.h"
#include "runtime/sync/wakeup.h"
#include "runtime/util/format.h"

namespace kolo {
namespace shm {
namespace {

constexpr uint32_t kAbortBit = 1u << 31;
constexpr uint32_t kCounterMask = ~kAbortBit;
// A sleeper re-checks its deadline at least this often, so that even a
// missed wake-up (which the protocol rules out) cannot outlive it by much.
constexpr auto kMaxSleep = std::chrono::milliseconds(500);
// Note [Naming the lost rank]: the runtime waits 1 s for the control plane
// to name a lost rank; this is the same wait, on the backend's side.
constexpr auto kCloseGrace = std::chrono::seconds(1);

// Shared (not private) futexes: the key is the physical page, so the word
// may be mapped at different addresses in different processes.
constexpr os::FutexScope kScope = os::FutexScope::kShared;

}  // namespace

ShmBarrier::ShmBarrier(BarrierState* state, RankState* ranks, Config config)
    : state_(state), ranks_(ranks), config_(config) {}

bool ShmBarrier::aborted() const {
  return state_->generation.load(std::memory_order_acquire) & kAbortBit;
}

void ShmBarrier::Abort(AbortReason reason) {
  uint32_t expected = 0;
  state_->aborted_by.compare_exchange_strong(
      expected,
      (static_cast<uint32_t>(config_.rank) + 1) |
          (static_cast<uint32_t>(reason) << 16),
      std::memory_order_seq_cst);
  state_->generation.fetch_or(kAbortBit, std::memory_order_seq_cst);
  // Unconditionally: a sleeper that announced itself after our check would
  // still see the changed word and not sleep, but one already asleep needs
  // the wake-up.
  os::FutexWakeAll(&state_->generation, kScope);
}

void ShmBarrier::Close() {
  {
    MutexLock lock(&closed_mu_);
    closed_ = true;
  }
  closed_cv_.NotifyAll();
  Abort(AbortReason::kClosed);
}

std::string ShmBarrier::MissingRanks() const {
  std::vector<int> missing;
  for (int r = 0; r < config_.size; ++r) {
    if (ranks_[r].arrived_steps.load(std::memory_order_acquire) <= step_) {
      missing.push_back(r);
    }
  }
  return absl::StrCat("rank", missing.size() == 1 ? " " : "s ",
                      absl::StrJoin(missing, ", "), " of the set");
}

absl::Status ShmBarrier::AbortedError(const char* what,
                                      Clock::time_point deadline,
                                      absl::Duration op_timeout) {
  const uint32_t word = state_->aborted_by.load(std::memory_order_acquire);
  const int by = static_cast<int>(word & 0xffff) - 1;
  const auto reason = static_cast<AbortReason>(word >> 16);
  if (reason == AbortReason::kTimedOut) {
    // Every rank waiting at this barrier waited for the same missing ranks.
    return absl::DeadlineExceededError(absl::StrCat(
        "shm ", what, ": ", MissingRanks(),
        " did not arrive within the op "
        "timeout (",
        FormatSeconds(op_timeout), ")",
        by == config_.rank ? "" : absl::StrCat(" (seen by rank ", by, ")")));
  }
  if (by != config_.rank) {
    const absl::Time until =
        absl::Now() + std::min(absl::FromChrono(deadline - Clock::now()),
                               absl::FromChrono(kCloseGrace));
    MutexLock lock(&closed_mu_);
    while (!closed_ && closed_cv_.WaitUntil(&closed_mu_, until)) {
    }
  }
  {
    MutexLock lock(&closed_mu_);
    if (closed_) {
      return absl::UnavailableError(absl::StrCat(
          "shm ", what, ": the shared-memory backend was closed on this rank"));
    }
  }
  return absl::UnavailableError(absl::StrCat(
      "shm ", what, ": rank ", by,
      " of the set closed the shared-memory backend (its runtime failed or "
      "lost a peer; see its error)"));
}

absl::Status ShmBarrier::Arrive(Clock::time_point deadline, const char* what,
                                absl::Duration op_timeout) {
  // Read before arriving: once we have arrived, the last rank may complete
  // the barrier at any moment.
  const uint32_t seen = state_->generation.load(std::memory_order_acquire);
  if (seen & kAbortBit) return AbortedError(what, deadline, op_timeout);
  const uint32_t counter = seen & kCounterMask;
  ranks_[config_.rank].arrived_steps.store(step_ + 1,
                                           std::memory_order_release);

  if (state_->arrived.fetch_add(1, std::memory_order_acq_rel) ==
      static_cast<uint32_t>(config_.size) - 1) {
    // Last to arrive. Reset the count before publishing the new generation:
    // no rank can arrive at the next barrier before it sees that.
    state_->arrived.store(0, std::memory_order_relaxed);
    uint32_t old = seen;
    while (!state_->generation.compare_exchange_weak(
        old, (old & kAbortBit) | ((old + 1) & kCounterMask),
        std::memory_order_seq_cst)) {
    }
    ++step_;
    // Pairs with the sleepers' increment-then-check (both seq_cst): either
    // we see the sleeper, or it sees the new generation and does not sleep.
    if (state_->sleepers.load(std::memory_order_seq_cst) != 0) {
      os::FutexWakeAll(&state_->generation, kScope);
    }
    return absl::OkStatus();
  }

  auto completed = [counter](uint32_t g) {
    return (g & kCounterMask) != counter;
  };
  // Spin phase, yielding the core now and then: with more busy threads than
  // cores the rank we wait for may be waiting for ours (Note [Spin then
  // block] in runtime/sync/wakeup.h). The blocking phase below sees what
  // ended the spin (completion and the abort bit both stay).
  SpinUntil(
      [&] {
        const uint32_t g = state_->generation.load(std::memory_order_acquire);
        return completed(g) || (g & kAbortBit) != 0;
      },
      config_.spin);
  // Blocking phase.
  while (true) {
    uint32_t g = state_->generation.load(std::memory_order_acquire);
    if (completed(g)) {
      ++step_;
      return absl::OkStatus();
    }
    if (g & kAbortBit) return AbortedError(what, deadline, op_timeout);
    const auto now = Clock::now();
    if (now >= deadline) {
      // The others would otherwise wait for us until their own deadline.
      Abort(AbortReason::kTimedOut);
      return AbortedError(what, deadline, op_timeout);
    }
    state_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    g = state_->generation.load(std::memory_order_seq_cst);
    if (!completed(g) && !(g & kAbortBit)) {
      futex_sleeps_.fetch_add(1, std::memory_order_relaxed);
      os::FutexWait(&state_->generation, g,
                    absl::FromChrono(
                        std::min<Clock::duration>(deadline - now, kMaxSleep)),
                    kScope);
    }
    state_->sleepers.fetch_sub(1, std::memory_order_relaxed);
  }
}

}  // namespace shm
}  // namespace kolo
