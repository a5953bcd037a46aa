// BoardExchange: the exchange of the global set's cache hits over one
// host's shared memory (Note [Hits on the board] in control/hit_board.h),
// and the board's log, which every rank executes from its own cursor:
// records of ids whose bits every rank set, and the markers at which the
// response lists run. It owns this rank's side of the board: the cursor,
// the response lists that came before their marker, the board's lock and,
// on rank 0, what the coordinator does with the board (closing it, taking
// its bits as the ranks' hits, opening it when negotiation is quiet).
//
// Threads: whoever holds the loop's turn (Note [Caller turns] in
// runtime/loop/caller_turn.cc), one thread at a time.
#ifndef KOLO_RUNTIME_LOOP_BOARD_EXCHANGE_H_
#define KOLO_RUNTIME_LOOP_BOARD_EXCHANGE_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kolo/runtime.h"
#include "runtime/control/control_plane.h"
#include "runtime/control/hit_board.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/wire.pb.h"

namespace kolo {

class BoardExchange {
 public:
  // What the log runs on (RuntimeImpl: its executor and its fatal error).
  class Runner {
   public:
    virtual ~Runner() = default;
    // One record of ids: the cached responses, fused by the board's plan.
    // False, executing nothing, if a `caller` (Note [Caller turns]) must
    // leave it to the thread (a CUDA tensor).
    virtual bool ExecuteIds(const HitBoardShared::Record& record,
                            bool caller) = 0;
    // Whether this rank is a member of `process_set` (false: unknown).
    virtual bool IsMember(int process_set) = 0;
    // Executes a response list of a set this rank is a member of.
    virtual void ExecuteList(int process_set,
                             const wire::ResponseList& list) = 0;
    virtual bool failed() = 0;
    virtual void Fatal(const absl::Status& status) = 0;
  };
  struct Limits {
    absl::Duration op_timeout;
    absl::Duration stall_check_time;     // zero: off
    absl::Duration stall_shutdown_time;  // zero: off
  };

  BoardExchange(HitBoard* board, ControlPlane* control, Runner* runner,
                Limits limits);

  // --- Every rank.
  // Sets this rank's bits for the global set's hits `*ids` while the board
  // is open and this rank has executed the log as far as the coordinator
  // had written it when it opened; leaves in *ids the ones for the
  // coordinator (all of them when closed, and any whose slot another id
  // holds). Appends the ids it completed to the log, ringing the ranks
  // that must execute them. `*send`: whether a request list of the set
  // must go to the coordinator all the same (`requests`: it has new
  // requests; `shutdown`: this rank leaves). Returns the ids set, or -1
  // (after Fatal) if the board's lock could not be had.
  int64_t Hand(std::vector<int64_t>* ids, bool requests, bool shutdown,
               bool* send);
  // A response list of the global set's or another's, which runs at its
  // marker in the log (not rank 0, whose own lists run where it sends them).
  void Hold(wire::ResponseList list);
  // Executes the log from this rank's cursor as far as the lists it names
  // have arrived (those of sets this rank is not in are skipped); *done at
  // the final list. With `handed_back` (a caller's turn): stops, setting
  // it, at a record the caller leaves to the thread (a list's marker, a
  // CUDA tensor).
  void Execute(bool* done, bool* handed_back = nullptr);
  // Note [Caller turns]: a rank whose caller polls the log needs no ring
  // for ids.
  void SetPolling(bool polling) { board_->SetPolling(polling); }
  // The log holds records this rank has not executed, or ids wait for
  // room in it.
  bool Behind() const {
    return cursor_ != board_->tail() || board_->ready_pending();
  }

  // The coordinator's fusion threshold, by which every rank fuses the
  // records' responses alike.
  int64_t fusion_threshold_bytes() const {
    return board_->fusion_threshold_bytes();
  }

  // --- Rank 0 (the coordinator).
  bool open() const { return board_->open(); }
  // Closes the board: its bits become the ranks' hits in `global`, as if
  // each had come in a request list when its id's first bit was set.
  void Close(Coordinator& global, absl::Time now);
  // A request list of the global set from rank `from`: the board is closed
  // first (nothing is half there, half here).
  void Received(Coordinator& global, int from, absl::Time now);
  // Opens the board again once negotiation of the set is quiet, and moves
  // old partly set ids to the coordinator for its time-outs and stall
  // reports; *next_wakeup: when to look again.
  void Tend(Coordinator& global, absl::Time now, absl::Time* next_wakeup);
  // How often rank 0 looks at an open board: its earliest check.
  absl::Duration CheckLimit(const Coordinator& global) const;
  // The log has room for a list's marker (once seen, it stays: only rank
  // 0 appends markers, and ids leave one record free).
  bool HasRoomForList() const { return board_->HasRoom(1); }
  // Wakes every other rank (to execute the log and so free room in it).
  void RingOthers();
  // Appends the marker of response list `list` of `process_set` once this
  // rank has executed the log to its end (it runs the list right after, at
  // its marker, and calls ListExecuted); the global set's list opens the
  // board again if it leaves `global` quiet. False after Fatal.
  bool AppendList(const wire::ResponseList& list, int process_set,
                  const Coordinator& global);
  void ListExecuted() { board_->Executed(++cursor_); }

 private:
  // Takes the board's lock, for a HitBoardLock to hold; false (after
  // Fatal) if the job ended first or the op timeout passed.
  bool Lock() KOLO_TRY_ACQUIRE(true, board_);
  // Opens the board if `global` is quiet and every request list sent has
  // arrived.
  void OpenIfQuietLocked(const Coordinator& global) KOLO_REQUIRES(board_);

  HitBoard* const board_;
  ControlPlane* const control_;
  Runner* const runner_;
  const Limits limits_;
  const int rank_;
  // Records this rank has executed.
  uint64_t cursor_ = 0;
  // Response lists (by set and seq) received before their marker.
  std::map<std::pair<int, int64_t>, wire::ResponseList> lists_;
  // Rank 0: request lists received per rank.
  std::vector<uint64_t> received_;
  // Storage kept from one call to the next.
  std::vector<int64_t> complete_, refused_;
  std::vector<HitBoard::Pulled> pulled_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_BOARD_EXCHANGE_H_
