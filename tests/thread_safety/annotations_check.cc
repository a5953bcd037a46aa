// Compiled by tools/thread_safety.sh with clang -fsyntax-only
// -Wthread-safety -Werror: as it is, it must compile; with each
// -DKOLO_BREAK_<n> it must fail, which shows that the annotations of
// runtime/sync/mutex.h reach the analysis (an empty macro would let every
// violation through silently), on a Mutex and on the hit board's lock in
// shared memory.
#include "runtime/control/hit_board.h"
#include "runtime/sync/mutex.h"

namespace kolo {

class Counter {
 public:
  void Add() KOLO_EXCLUDES(mu_) {
    MutexLock lock(&mu_);
    ++value_;
    AddLocked();
    lock.Unlock();
#ifdef KOLO_BREAK_1
    ++value_;  // written after Unlock()
#endif
    lock.Lock();
    while (value_ < 0) cv_.Wait(&mu_);
  }
  int Get() KOLO_EXCLUDES(mu_) {
#ifdef KOLO_BREAK_2
    return value_;  // read without the lock
#else
    MutexLock lock(&mu_);
    return value_;
#endif
  }
  void Reset() {
#ifdef KOLO_BREAK_3
    AddLocked();  // called without the lock it requires
#endif
  }

 private:
  void AddLocked() KOLO_REQUIRES(mu_) { ++value_; }
  Mutex mu_;
  CondVar cv_;
  int value_ KOLO_GUARDED_BY(mu_) = 0;
};

// The board's lock: taken by Lock(), held by a HitBoardLock.
bool OpenBoard(HitBoard* board) {
#ifdef KOLO_BREAK_4
  board->Open();  // a locked method without the lock
#endif
  if (!board->Lock(absl::InfiniteFuture(), [] { return true; })) return false;
  HitBoardLock locked(board);
  board->Open();
  return board->Usable(0);
}

int Use() {
  Counter c;
  c.Add();
  c.Reset();
  return c.Get();
}

}  // namespace kolo
