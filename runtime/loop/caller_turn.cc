// A caller's turn of the loop (Note [Caller turns]): a blocking call that
// submits and runs the loop's pass itself. Methods of BackgroundLoop
// (background_loop.h).
#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "runtime/loop/background_loop.h"
#include "runtime/sync/mutex.h"

namespace kolo {

// Note [Caller turns]
// A caller that submits one collective and waits for it at once (a
// blocking allreduce: Runtime::AllreduceAndWait) would hand it to the
// background thread and back: on a rank bound to one core the two threads
// take turns on it, and each turn is a context switch (1-2 us on a VM),
// several per collective. So such a caller runs the loop's turn itself
// when the background thread is not in one (the turn is `turn_->mu`,
// which the thread holds for each pass; a caller only tries it): it sends
// the rank's new requests as the thread would (SendRequests), then
// executes the rank's log itself while it waits (HitExchange::Execute), on
// every transport: it takes what the control plane received (the
// coordinator's response lists, ReceiveEvents) when the loop's word is
// rung, and on one host, where a cached request of the global set becomes
// a bit on the board (Note [Hits on the board] in control/hit_board.h), it
// polls the board's log, marked as polling so that the rank that sets the
// last bit does not ring this rank's thread. On a host leader (it relays
// its host's lists: LeaderExchange) the caller's list joins its host's
// batch, and the caller relays as the thread would: the batch goes to the
// coordinator once every rank of the host sent its hits (their lists come
// with rings, which it takes), or when its hold ends. On rank 0, once its list
// went to its own coordinators, the caller takes the others' lists that came
// already and runs the coordinators' step (CoordinatorStep), which makes,
// sends and executes the lists that are ready; in a job of one, or when
// rank 0 is the last to submit, that completes the call on the caller's
// thread. Every pass's state (the log's cursor, the caches, the
// executors, the control plane's messages, the coordinators) is touched
// only by whoever holds the turn. The caller hands back to the thread,
// ringing it, what only the thread does: on rank 0 the wait for the
// others' lists (their rings) and the deadlines its step set that come
// before the thread's own wake-up (thread_wakes_at_); an entry of the log
// that is CUDA work, a process set made or dropped, a join or the job's
// final list (Runner::CallerMayRun; on rank 0 such a list, once made and
// sent, waits in made_for_thread_ with every list made after it, and no
// caller takes a turn until the thread has run them); and a spin time
// without an answer. Then it waits as any caller does;
// and it ends its turn (or takes none) when the thread waits for the turn,
// so that callers making blocking calls back to back never starve the
// thread. So the thread still does everything it did; the caller only does
// early what the thread would have done next. The call's timeout bounds its
// wait for the other ranks; a collective that started runs to its end (or
// its error) on whichever thread runs it.
bool BackgroundLoop::CallerTurn(const internal::WorkState& work) {
  if (options_.spin_time <= absl::ZeroDuration() || failed() ||
      shutdown_requested_ || !made_for_thread_.empty() ||
      turn_->thread_waits.load(std::memory_order_relaxed)) {
    return false;
  }
  const bool coordinator = options_.rank == 0;
  Wakeup& wakeup = *wakeup_.load();
  // The last epoch whose rings this caller dealt with.
  uint32_t epoch = wakeup.Epoch();
  // A sleeping thread is left asleep while this caller polls (Note
  // [Polling for a sleeper] in runtime/sync/wakeup.h): the rank that
  // answers makes no system call for it. It is woken at the end if it was
  // rung for what the caller did not deal with.
  wakeup.BeginPolling();
  const int64_t lists = counters_.request_lists_sent.load();
  SendRequests(absl::Now());
  bool handed_back = false;
  bool done = false;
  // A host leader: its host's lists that came already join its own, and
  // the batch goes on if it is due; else `relay_due` says when it is (only
  // a leader's ReceiveEvents sets it).
  absl::Time relay_due = absl::InfiniteFuture();
  if (exchange_->Relays() && !failed()) ReceiveEvents(absl::Now(), &relay_due);
  // Rank 0, after a list went to its coordinators: it takes the others'
  // lists that came already and runs the coordinators' step, which makes
  // and executes the response lists that are ready. If its collective is
  // not among them, the others' lists are still to come, and waiting for
  // them (their rings) is the thread's. `next_wakeup`: the deadlines that
  // step left (batching, time-outs, stall checks), which the thread keeps.
  absl::Time next_wakeup = absl::InfiniteFuture();
  if (coordinator && !failed() &&
      counters_.request_lists_sent.load() != lists) {
    ReceiveEvents(absl::Now(), &relay_due);
    if (!failed()) {
      CoordinatorStep(Turn::kCaller, absl::Now(), &next_wakeup, &done);
    }
    handed_back = !work.IsCompleted() || !made_for_thread_.empty();
  }
  if (!work.IsCompleted() && !handed_back && !done && !failed()) {
    PollLog(work, &epoch, &relay_due, &done, &handed_back);
  }
  next_wakeup = std::min(next_wakeup, relay_due);
  // The thread takes over whatever is left: records appended or lists held
  // while this rank polled came without the thread's pass, the entry this
  // caller queued quietly has its time-out (and, on rank 0, the board's
  // checks) only in the thread's passes, and other threads' submissions,
  // lists still waiting for room in the ring to a host's leader, a
  // shutdown or the job's error are its too. Rings since the caller last
  // looked (rank 0's, or any that came at the end) wake it in EndPolling.
  const bool left =
      !work.IsCompleted() || handed_back || done || exchange_->Behind() ||
      queue_.has_new_requests() || (control_ && control_->host_out_pending()) ||
      next_wakeup < thread_wakes_at_ || failed() || shutdown_requested_;
  wakeup.EndPolling(epoch);
  if (left) Notify();
  return true;
}

void BackgroundLoop::PollLog(const internal::WorkState& work, uint32_t* epoch,
                             absl::Time* relay_due, bool* done,
                             bool* handed_back) {
  const bool coordinator = options_.rank == 0;
  Wakeup& wakeup = *wakeup_.load();
  exchange_->SetPolling(true);
  SpinUntil(
      [&] {
        if (work.IsCompleted()) return true;
        // Rung: rank 0's is for its coordinators (the thread's); elsewhere
        // it is the control plane's messages, which the caller takes (a
        // leader relays its host's lists with them, and also when its held
        // batch is due).
        const uint32_t now_epoch = wakeup.Epoch();
        const bool rung = now_epoch != *epoch;
        if (rung && coordinator) return true;
        if (rung || (*relay_due != absl::InfiniteFuture() &&
                     absl::Now() >= *relay_due)) {
          *epoch = now_epoch;
          *relay_due = absl::InfiniteFuture();
          ReceiveEvents(absl::Now(), relay_due);
        }
        exchange_->Execute(done, handed_back);
        return work.IsCompleted() || *handed_back || *done || failed() ||
               shutdown_requested_ ||
               turn_->thread_waits.load(std::memory_order_relaxed);
      },
      options_.spin_time);
  exchange_->SetPolling(false);
}

void BackgroundLoop::TryTurn(const internal::WorkState& work) {
  // Nothing of this runtime is touched once the turn is given back: from
  // there on the caller waits on its Work alone.
  if (!turn_->mu.TryLock()) {
    Notify();
    return;
  }
  // (Nothing a turn runs throws: a program's output allocator is called
  // through the executor, which turns what it throws into a status.)
  const bool turned = turn_->loop_running && CallerTurn(work);
  if (turned) {
    ++counters_.caller_turns;
    if (work.IsCompleted()) ++counters_.caller_turns_completed;
  } else {
    Notify();
  }
  turn_->mu.Unlock();
}

}  // namespace kolo
