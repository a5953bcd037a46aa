// Mutex, MutexLock, CondVar: std::mutex and std::condition_variable with
// clang's thread-safety annotations, so that the compiler checks which
// lock guards which member (`bazel build --config=thread-safety`,
// docs/building.md).
//
// Note [Annotated locks]: every member that more than one thread touches
// and that a mutex protects is declared KOLO_GUARDED_BY(that mutex);
// functions that expect a lock held say KOLO_REQUIRES, functions that take
// it themselves and must not be called with it held say KOLO_EXCLUDES.
// Members touched by one thread only (the background thread's state, say)
// carry no annotation and say so in a comment. Not absl::Mutex: with
// Debian's uninstrumented abseil, ThreadSanitizer reports false races on
// it; std::mutex is intercepted by TSan.
//
// A condition wait is written as a loop over the guarded condition at the
// call site (`while (!done_) cv_.Wait(&mu_);`), so that the analysis sees
// the condition read under the lock; a predicate lambda would hide it.
//
// Thread safety: as std::mutex and std::condition_variable.
#ifndef KOLO_RUNTIME_SYNC_MUTEX_H_
#define KOLO_RUNTIME_SYNC_MUTEX_H_

#include <algorithm>
#include <condition_variable>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

#if defined(__clang__)
#define KOLO_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define KOLO_THREAD_ANNOTATION(x)
#endif

#define KOLO_CAPABILITY(x) KOLO_THREAD_ANNOTATION(capability(x))
#define KOLO_SCOPED_CAPABILITY KOLO_THREAD_ANNOTATION(scoped_lockable)
#define KOLO_GUARDED_BY(x) KOLO_THREAD_ANNOTATION(guarded_by(x))
#define KOLO_PT_GUARDED_BY(x) KOLO_THREAD_ANNOTATION(pt_guarded_by(x))
#define KOLO_REQUIRES(...) \
  KOLO_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define KOLO_EXCLUDES(...) KOLO_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define KOLO_ACQUIRE(...) \
  KOLO_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define KOLO_RELEASE(...) \
  KOLO_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define KOLO_TRY_ACQUIRE(...) \
  KOLO_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define KOLO_RETURN_CAPABILITY(x) KOLO_THREAD_ANNOTATION(lock_returned(x))
#define KOLO_NO_THREAD_SAFETY_ANALYSIS \
  KOLO_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace kolo {

class CondVar;

class KOLO_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() KOLO_ACQUIRE() { mu_.lock(); }
  void Unlock() KOLO_RELEASE() { mu_.unlock(); }
  // Takes the lock if it is free; never blocks.
  bool TryLock() KOLO_TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for its scope; Unlock()/Lock() release and take it again in
// between (the destructor releases it only if held).
class KOLO_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) KOLO_ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() KOLO_RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() KOLO_RELEASE() {
    held_ = false;
    mu_->Unlock();
  }
  void Lock() KOLO_ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

class CondVar {
 public:
  // Releases `mu` while it waits; holds it again on return. May wake
  // spuriously: wait in a loop over the condition.
  void Wait(Mutex* mu) KOLO_REQUIRES(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // The same, up to `deadline`; false once it has passed.
  bool WaitUntil(Mutex* mu, absl::Time deadline) KOLO_REQUIRES(mu) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    if (left == absl::InfiniteDuration()) {
      cv_.wait(lock);
    } else {
      // Capped: a far deadline would overflow wait_for's clock arithmetic
      // and return at once (callers loop over their condition anyway).
      cv_.wait_for(lock,
                   absl::ToChronoNanoseconds(std::min(left, absl::Hours(24))));
    }
    lock.release();
    return absl::Now() < deadline;
  }
  void NotifyOne() { cv_.notify_one(); }
  void NotifyAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_SYNC_MUTEX_H_
