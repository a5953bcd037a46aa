// Options::phase_times (KOLO_PHASE_TIMES): the clock of the loop's phases
// (RuntimeStats::send_ns ...). Off, it reads no clock.
#ifndef KOLO_RUNTIME_LOOP_PHASE_CLOCK_H_
#define KOLO_RUNTIME_LOOP_PHASE_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "runtime/sync/wakeup.h"

namespace kolo {

class PhaseClock {
 public:
  explicit PhaseClock(bool on) : start_(on ? internal::MonotonicNanos() : -1) {}

  bool on() const { return start_ >= 0; }
  // Nanoseconds since construction or the last Lap, and starts again from
  // now; 0 when off.
  int64_t Lap() {
    if (start_ < 0) return 0;
    const int64_t now = internal::MonotonicNanos();
    const int64_t elapsed = now - start_;
    start_ = now;
    return elapsed;
  }

 private:
  int64_t start_;
};

// Adds the time from construction to destruction to *sum, when on.
class ScopedPhase {
 public:
  ScopedPhase(bool on, std::atomic<int64_t>* sum) : clock_(on), sum_(sum) {}
  ~ScopedPhase() {
    if (clock_.on()) sum_->fetch_add(clock_.Lap(), std::memory_order_relaxed);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  PhaseClock clock_;
  std::atomic<int64_t>* const sum_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_PHASE_CLOCK_H_
