// The hit board's part of the background loop (Note [Hits on the board] in
// control/hit_board.h): executing the board's log, the coordinator's
// closing, tending and opening of the board; and a caller's turn of the
// loop (Note [Caller turns]), which runs on the board. Methods of
// RuntimeImpl (runtime_impl.h).
#include <algorithm>
#include <limits>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/loop/phase_clock.h"
#include "runtime/loop/runtime_impl.h"
#include "runtime/negotiation/fusion.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/format.h"

namespace kolo {

// Note [Caller turns]
// A caller that submits one collective and waits for it at once (a
// blocking allreduce: Runtime::AllreduceAndWait) would hand it to the
// background thread and back: on a rank bound to one core the two threads
// take turns on it, and each turn is a context switch (1-2 us on a VM),
// several per collective. So such a caller runs the loop's turn itself
// when the background thread is not in one (the turn is `turn_->mu`,
// which the thread holds for each pass; a caller only tries it): it sends
// the rank's new requests as the thread would (SendRequests), and on one
// host, where a cached request of the global set becomes a bit on the
// board (Note [Hits on the board] in control/hit_board.h), it executes
// the board's log itself while it waits for the other ranks' bits,
// marked as polling so that the rank that sets the last bit does not
// ring this rank's thread. Every pass's state (the board's cursor, the
// caches, the executors) is touched only by whoever holds the turn. The
// caller hands back to the thread, ringing it, whatever is not a lone
// hit on an open board: a request list for the coordinator (rank 0's
// coordinator steps, the others' answers), a record with a CUDA response
// or a response list's marker, or a spin time without an answer; then it
// waits as any caller does; and it ends its turn (or takes none) when the
// thread waits for the turn, so that callers making blocking calls back to
// back never starve the thread. So the thread still does everything it
// did; the caller only does early what the thread would have done next.
// The call's timeout bounds its wait for the other ranks; a collective
// that started runs to its end (or its error) on whichever thread runs it.
bool RuntimeImpl::CallerTurn(const internal::WorkState& work) {
  if (!board_ || relay_ || options_.spin_time <= absl::ZeroDuration() ||
      !accepting_ || shutdown_requested_ ||
      turn_->thread_waits.load(std::memory_order_relaxed)) {
    return false;
  }
  Wakeup& wakeup = *wakeup_.load();
  const uint32_t epoch = wakeup.Epoch();
  const int64_t lists = counters_.request_lists_sent.load();
  SendRequests(absl::Now());
  if (!fatal_status().ok()) return true;
  if (counters_.request_lists_sent.load() != lists) {
    Notify();  // The coordinator's part is the thread's.
    return true;
  }
  board_->SetPolling(true);
  bool handed_back = false;
  bool done = false;
  try {
    SpinUntil(
        [&] {
          if (work.IsCompleted()) return true;
          ExecuteBoard(&done, &handed_back);
          return work.IsCompleted() || handed_back || done || !accepting_ ||
                 wakeup.Epoch() != epoch ||
                 turn_->thread_waits.load(std::memory_order_relaxed);
        },
        options_.spin_time);
  } catch (...) {
    // (An output allocator of another thread's collective in the record.)
    board_->SetPolling(false);
    throw;
  }
  board_->SetPolling(false);
  // The thread takes over whatever is left: records appended while this
  // rank polled came without a ring, and the entry this caller queued
  // quietly has its time-out (and, on rank 0, the board's checks) only in
  // the thread's passes.
  if (!work.IsCompleted() || handed_back || done ||
      board_cursor_ != board_->tail() || board_->ready_pending()) {
    Notify();
  }
  return true;
}

bool RuntimeImpl::LockBoard() {
  if (board_->Lock(absl::Now() + options_.op_timeout,
                   [this] { return fatal_status().ok(); })) {
    return true;
  }
  if (fatal_status().ok()) {
    Fatal(absl::DeadlineExceededError(absl::StrCat(
        "rank ", options_.rank, ": the hit board's lock was not free within ",
        FormatSeconds(options_.op_timeout))));
  }
  return false;
}

void RuntimeImpl::ExecuteBoard(bool* done, bool* handed_back) {
  if (board_cursor_ == board_->tail() && !board_->ready_pending()) return;
  std::shared_ptr<ProcessSetState> global;
  {
    MutexLock lock(&sets_mu_);
    global = sets_.at(kGlobalProcessSet);
  }
  for (;;) {
    const uint64_t tail = board_->tail();
    while (board_cursor_ < tail) {
      const HitBoardShared::Record& record = board_->record(board_cursor_);
      if (record.kind == HitBoardShared::kIds) {
        if (!ExecuteBoardIds(*global, record,
                             /*caller=*/handed_back != nullptr)) {
          *handed_back = true;
          return;
        }
      } else if (handed_back) {
        *handed_back = true;  // A list's marker: the thread's.
        return;
      } else {
        std::shared_ptr<ProcessSetState> set;
        {
          MutexLock lock(&sets_mu_);
          auto found = sets_.find(record.process_set);
          if (found != sets_.end()) set = found->second;
        }
        if (options_.rank == 0) {
          Fatal(absl::InternalError(absl::StrCat(
              "hit board: rank 0 found the marker of its own response list ",
              record.list_seq, " of process set ", record.process_set,
              " unexecuted")));
          return;
        }
        if (set && set->member()) {  // Others' sets: nothing comes.
          auto it = board_lists_.find(std::make_pair(set->id, record.list_seq));
          if (it == board_lists_.end()) {
            return;  // Not here yet: its arrival rings this rank.
          }
          ExecuteList(*set, it->second, /*sent_here=*/false);
          if (it->second.shutdown() && set->id == kGlobalProcessSet) {
            *done = true;
          }
          board_lists_.erase(it);
        }
      }
      if (!fatal_status().ok()) return;
      board_->Executed(++board_cursor_);
      if (*done) return;
    }
    // Ids complete while the log was full: this rank may have made room.
    if (!board_->ready_pending()) return;
    bool flushed = false;
    {
      if (!LockBoard()) return;
      HitBoardLock locked(board_);
      flushed = board_->FlushReady();
    }
    if (!flushed) return;
    for (int r = 0; r < options_.size; ++r) {
      if (r != options_.rank) control_->Ring(r);
    }
  }
}

bool RuntimeImpl::ExecuteBoardIds(ProcessSetState& global,
                                  const HitBoardShared::Record& record,
                                  bool caller) {
  // Every rank plans the same fusion: the same ids, the same cache (Note
  // [Hits on the board]), the coordinator's threshold.
  PhaseClock clock(options_.phase_times);
  board_singles_.clear();
  for (uint32_t i = 0; i < record.count; ++i) {
    const wire::Response* cached = global.cache->CachedResponse(record.ids[i]);
    if (!cached) {
      Fatal(absl::InternalError(absl::StrCat(
          "rank ", options_.rank, ": hit board names cache id ", record.ids[i],
          ", which this rank's response cache does not hold")));
      return true;
    }
    // Note [Caller turns]: CUDA tensors are the thread's.
    if (caller &&
        cached->device_type() == static_cast<int>(DeviceType::kCuda)) {
      return false;
    }
    board_singles_.push_back(cached);
  }
  ++counters_.board_records_executed;
  const std::vector<std::vector<size_t>> buckets = PlanBuckets(
      board_singles_, board_->fusion_threshold_bytes(), global.size());
  if (clock.on()) counters_.prepare_ns += clock.Lap();
  for (const std::vector<size_t>& bucket : buckets) {
    board_response_.Clear();
    board_bucket_.clear();
    for (size_t i : bucket) {
      board_response_.add_cache_ids(record.ids[i]);
      board_bucket_.push_back(board_singles_[i]);
    }
    // Touched in every rank's cache here, rank 0's (the coordinator's)
    // included (Note [Hits on the board]); the responses looked up above
    // stay (touching an id keeps its entry).
    ExecuteResponse(global, board_response_, /*apply_cache=*/true,
                    board_bucket_.data());
    if (!fatal_status().ok()) return true;
  }
  return true;
}

void RuntimeImpl::CloseBoard(ProcessSetState& global, absl::Time now) {
  {
    if (!LockBoard()) return;
    HitBoardLock locked(board_);
    board_pulled_.clear();
    board_->Close(&board_pulled_);
  }
  if (board_pulled_.empty()) return;
  // Each bit becomes its rank's hit, as if it had come in a request list
  // when its id's first bit was set: one list per rank and first time.
  std::sort(board_pulled_.begin(), board_pulled_.end(),
            [](const HitBoard::Pulled& a, const HitBoard::Pulled& b) {
              return std::tie(a.rank, a.first_ns, a.id) <
                     std::tie(b.rank, b.first_ns, b.id);
            });
  Coordinator& c = *global.coordinator;
  const int64_t now_ns = internal::MonotonicNanos();
  for (size_t i = 0; i < board_pulled_.size();) {
    const HitBoard::Pulled& first = board_pulled_[i];
    wire::RequestList list;
    list.set_process_set(kGlobalProcessSet);
    list.set_acked_seq(c.acked(first.rank));
    for (; i < board_pulled_.size() && board_pulled_[i].rank == first.rank &&
           board_pulled_[i].first_ns == first.first_ns;
         ++i) {
      list.add_cached_ids(board_pulled_[i].id);
    }
    c.AddRequests(
        first.rank, std::move(list),
        now - absl::Nanoseconds(std::max<int64_t>(0, now_ns - first.first_ns)));
  }
}

absl::Duration RuntimeImpl::BoardCheckLimit(const Coordinator& global) const {
  // A partly set id is the coordinator's once it is as old as its
  // earliest check (time-out, the shortest a request of the set came with
  // included: Note [Request timeouts]; stall report, stall shutdown).
  // Setting a bit rings nobody, so while the board is open rank 0 looks at
  // least that often (a rank 0 that stops submitting must be reported too).
  absl::Duration limit = global.ShortestTimeout(options_.op_timeout);
  for (absl::Duration d :
       {options_.stall_check_time, options_.stall_shutdown_time}) {
    if (d > absl::ZeroDuration()) limit = std::min(limit, d);
  }
  return limit;
}

void RuntimeImpl::TendBoard(ProcessSetState& global, absl::Time now,
                            absl::Time* next_wakeup) {
  Coordinator& c = *global.coordinator;
  const absl::Duration limit = BoardCheckLimit(c);
  if (board_->open()) *next_wakeup = std::min(*next_wakeup, now + limit);
  if (board_->open() && board_->partial() > 0) {
    const int64_t limit_ns = absl::ToInt64Nanoseconds(limit);
    const int64_t now_ns = internal::MonotonicNanos();
    int64_t oldest = board_->oldest_ns();
    if (now_ns - oldest >= limit_ns) {
      {
        if (!LockBoard()) return;
        HitBoardLock locked(board_);
        oldest = board_->RescanOldest();
      }
      if (now_ns - oldest >= limit_ns) CloseBoard(global, now);
    }
    if (board_->open() && board_->partial() > 0 &&
        oldest != std::numeric_limits<int64_t>::max()) {
      *next_wakeup = std::min(
          *next_wakeup, now + absl::Nanoseconds(oldest + limit_ns - now_ns));
    }
  }
  if (board_->open() || !c.Quiet()) return;
  if (!LockBoard()) return;
  HitBoardLock locked(board_);
  OpenBoardIfQuietLocked(c);
}

void RuntimeImpl::OpenBoardIfQuietLocked(const Coordinator& global) {
  if (board_->open() || !global.Quiet()) return;
  // Every request list a rank sent has arrived (none is on its way with
  // hits the board would not see).
  for (int r = 1; r < options_.size; ++r) {
    if (board_->sent(r) != board_received_[r]) return;
  }
  board_->Open();
}

}  // namespace kolo
