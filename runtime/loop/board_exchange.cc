// BoardExchange (board_exchange.h): the global set's hits over one host's
// shared memory, and the board's log (Note [Hits on the board] in
// control/hit_board.h).
#include "runtime/loop/board_exchange.h"

#include <algorithm>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/negotiation/response_cache.h"
#include "runtime/sync/wakeup.h"
#include "runtime/util/format.h"

namespace kolo {

BoardExchange::BoardExchange(HitBoard* board, ControlLink* control,
                             Runner* runner, Limits limits)
    : HitExchange(runner),
      board_(board),
      control_(control),
      limits_(limits),
      rank_(board->rank()) {
  if (rank_ == 0) received_.assign(board->size(), 0);
}

bool BoardExchange::Lock() {
  if (board_->Lock(absl::Now() + limits_.op_timeout,
                   [this] { return !runner_->failed(); })) {
    return true;
  }
  if (!runner_->failed()) {
    runner_->Fatal(absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank_, ": the hit board's lock was not free within ",
        FormatSeconds(limits_.op_timeout))));
  }
  return false;
}

void BoardExchange::RingOthers() {
  for (int r = 0; r < board_->size(); ++r) {
    if (r != rank_) control_->Ring(r);
  }
}

absl::StatusOr<bool> BoardExchange::Send(wire::RequestList list,
                                         std::vector<int64_t>* hits,
                                         Coordinator* coordinator, int set_rank,
                                         absl::Time now) {
  const bool global = list.process_set() == kGlobalProcessSet;
  if (global) {
    bool send = false;
    if (!Hand(hits, list.requests_size() > 0, list.shutdown(), &send) ||
        !send) {
      return false;
    }
  }
  if (!hits->empty()) AddCacheHits(hits, &list);
  if (coordinator && global) Close(*coordinator, now);
  absl::Status sent =
      SendToCoordinator(control_, std::move(list), coordinator, set_rank, now);
  if (!sent.ok()) return sent;
  return true;
}

bool BoardExchange::Hand(std::vector<int64_t>* ids, bool requests,
                         bool shutdown, bool* send) {
  bool published = false;
  bool full = false;  // complete ids left ready: the log is full
  {
    if (!Lock()) return false;
    HitBoardLock locked(board_);
    if (!ids->empty() && board_->Usable(cursor_)) {
      complete_.clear();
      refused_.clear();
      board_->Set(*ids, internal::MonotonicNanos(), &complete_, &refused_);
      hits_set_ += static_cast<int64_t>(ids->size() - refused_.size());
      ids->swap(refused_);
      published = board_->Publish(&complete_);
      if (!published && !complete_.empty()) full = true;
    }
    if (board_->ready_pending()) {
      published = board_->FlushReady() || published;
      full = full || board_->ready_pending();
    }
    *send = requests || !ids->empty() || shutdown;
    if (*send && rank_ != 0) board_->CountSent();
  }
  // Full: the ranks that have not executed the log must run (ranks
  // outside a set wait for nothing when only its markers are left). A
  // rank whose caller polls the log needs no ring for ids (Note [Caller
  // turns]).
  if (published || full) {
    for (int r = 0; r < board_->size(); ++r) {
      if (r != rank_ && (full || board_->NeedsRing(r))) control_->Ring(r);
    }
  }
  return true;
}

void BoardExchange::Hold(wire::ResponseList list) {
  const auto key = std::make_pair(list.process_set(), list.seq());
  lists_.emplace(key, std::move(list));
}

void BoardExchange::AddCounters(
    std::map<std::string, int64_t>* counters) const {
  (*counters)["board.hits"] = hits_set_.load();
}

void BoardExchange::Execute(bool* done, bool* handed_back) {
  if (!Behind()) return;
  for (;;) {
    const uint64_t tail = board_->tail();
    while (cursor_ < tail) {
      const HitBoardShared::Record& record = board_->record(cursor_);
      if (record.kind == HitBoardShared::kIds) {
        if (!runner_->ExecuteIds(record, board_->fusion_threshold_bytes(),
                                 /*caller=*/handed_back != nullptr)) {
          *handed_back = true;
          return;
        }
      } else if (rank_ == 0) {
        runner_->Fatal(absl::InternalError(absl::StrCat(
            "hit board: rank 0 found the marker of its own response list ",
            record.list_seq, " of process set ", record.process_set,
            " unexecuted")));
        return;
      } else if (runner_->IsMember(record.process_set)) {
        // (Others' sets: nothing comes.)
        auto it =
            lists_.find(std::make_pair(record.process_set, record.list_seq));
        if (it == lists_.end()) {
          return;  // Not here yet: its arrival rings this rank.
        }
        if (handed_back && !runner_->CallerMayRun(it->second)) {
          *handed_back = true;
          return;
        }
        runner_->ExecuteList(record.process_set, it->second);
        if (it->second.shutdown() && record.process_set == kGlobalProcessSet) {
          *done = true;
        }
        lists_.erase(it);
      }
      if (runner_->failed()) return;
      board_->Executed(++cursor_);
      if (*done) return;
    }
    // Ids complete while the log was full: this rank may have made room.
    if (!board_->ready_pending()) return;
    bool flushed = false;
    {
      if (!Lock()) return;
      HitBoardLock locked(board_);
      flushed = board_->FlushReady();
    }
    if (!flushed) return;
    RingOthers();
  }
}

void BoardExchange::Close(Coordinator& global, absl::Time now) {
  {
    if (!Lock()) return;
    HitBoardLock locked(board_);
    pulled_.clear();
    board_->Close(&pulled_);
  }
  if (pulled_.empty()) return;
  // Each bit becomes its rank's hit, as if it had come in a request list
  // when its id's first bit was set: one list per rank and first time.
  std::sort(pulled_.begin(), pulled_.end(),
            [](const HitBoard::Pulled& a, const HitBoard::Pulled& b) {
              return std::tie(a.rank, a.first_ns, a.id) <
                     std::tie(b.rank, b.first_ns, b.id);
            });
  const int64_t now_ns = internal::MonotonicNanos();
  for (size_t i = 0; i < pulled_.size();) {
    const HitBoard::Pulled& first = pulled_[i];
    wire::RequestList list;
    list.set_process_set(kGlobalProcessSet);
    list.set_acked_seq(global.acked(first.rank));
    for (; i < pulled_.size() && pulled_[i].rank == first.rank &&
           pulled_[i].first_ns == first.first_ns;
         ++i) {
      list.add_cached_ids(pulled_[i].id);
    }
    global.AddRequests(
        first.rank, std::move(list),
        now - absl::Nanoseconds(std::max<int64_t>(0, now_ns - first.first_ns)));
  }
}

void BoardExchange::Received(Coordinator& global, int from, absl::Time now) {
  Close(global, now);
  ++received_[from];
}

absl::Duration BoardExchange::CheckLimit(const Coordinator& global) const {
  // A partly set id is the coordinator's once it is as old as its
  // earliest check (time-out, the shortest a request of the set came with
  // included: Note [Request timeouts]; stall report, stall shutdown).
  // Setting a bit rings nobody, so while the board is open rank 0 looks at
  // least that often (a rank 0 that stops submitting must be reported too).
  absl::Duration limit = global.ShortestTimeout(limits_.op_timeout);
  for (absl::Duration d :
       {limits_.stall_check_time, limits_.stall_shutdown_time}) {
    if (d > absl::ZeroDuration()) limit = std::min(limit, d);
  }
  return limit;
}

void BoardExchange::Tend(Coordinator& global, absl::Time now,
                         absl::Time* next_wakeup) {
  const absl::Duration limit = CheckLimit(global);
  if (board_->open()) *next_wakeup = std::min(*next_wakeup, now + limit);
  if (board_->open() && board_->partial() > 0) {
    const int64_t limit_ns = absl::ToInt64Nanoseconds(limit);
    const int64_t now_ns = internal::MonotonicNanos();
    int64_t oldest = board_->oldest_ns();
    if (now_ns - oldest >= limit_ns) {
      {
        if (!Lock()) return;
        HitBoardLock locked(board_);
        oldest = board_->RescanOldest();
      }
      if (now_ns - oldest >= limit_ns) Close(global, now);
    }
    if (board_->open() && board_->partial() > 0 &&
        oldest != std::numeric_limits<int64_t>::max()) {
      *next_wakeup = std::min(
          *next_wakeup, now + absl::Nanoseconds(oldest + limit_ns - now_ns));
    }
  }
  if (board_->open() || !global.Quiet()) return;
  if (!Lock()) return;
  HitBoardLock locked(board_);
  OpenIfQuietLocked(global);
}

void BoardExchange::OpenIfQuietLocked(const Coordinator& global) {
  if (board_->open() || !global.Quiet()) return;
  // Every request list a rank sent has arrived (none is on its way with
  // hits the board would not see).
  for (int r = 1; r < board_->size(); ++r) {
    if (board_->sent(r) != received_[r]) return;
  }
  board_->Open();
}

bool BoardExchange::ReadyForList(Coordinator& global, int process_set,
                                 absl::Time now, bool* done) {
  if (process_set == kGlobalProcessSet) Close(global, now);
  Execute(done);
  return board_->HasRoom(1);
}

absl::Time BoardExchange::NextCheck(const Coordinator& global, absl::Time now) {
  // The board may have opened after Tend (at a list's marker).
  if (!board_->open()) return absl::InfiniteFuture();
  return now + CheckLimit(global);
}

bool BoardExchange::ListMade(const wire::ResponseList& list, int process_set,
                             const Coordinator& global) {
  // While the board is closed (always for the global set's lists) nobody
  // else appends; while it is open others may append ids, which need this
  // rank's bits too: executing what they appended ends.
  bool appended = false;
  for (;;) {
    bool at_end = false;
    {
      if (!Lock()) return false;
      HitBoardLock locked(board_);
      at_end = board_->tail() == cursor_;
      if (at_end) appended = board_->AppendList(list.seq(), process_set);
      // Open again right after the marker if this list leaves the
      // coordinator quiet: the ranks that execute it are then past the
      // opening position before their next submissions.
      if (appended && process_set == kGlobalProcessSet) {
        OpenIfQuietLocked(global);
      }
    }
    if (at_end) break;
    bool unused_done = false;  // (only the global set's lists end a job)
    Execute(&unused_done);
    if (runner_->failed()) return false;
  }
  if (!appended) {
    runner_->Fatal(absl::InternalError(
        absl::StrCat("hit board: no room in the log for response list ",
                     list.seq(), " of process set ", process_set)));
    return false;
  }
  return true;
}

}  // namespace kolo
