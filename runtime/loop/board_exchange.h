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

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kolo/runtime.h"
#include "runtime/control/control_plane.h"
#include "runtime/control/hit_board.h"
#include "runtime/loop/hit_exchange.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/wire.pb.h"

namespace kolo {

class BoardExchange final : public HitExchange {
 public:
  struct Limits {
    absl::Duration op_timeout;
    absl::Duration stall_check_time;     // zero: off
    absl::Duration stall_shutdown_time;  // zero: off
  };

  BoardExchange(HitBoard* board, ControlLink* control, Runner* runner,
                Limits limits);

  // --- HitExchange, every rank.
  // The global set's hits go on the board while it is open and this rank
  // has executed the log as far as the coordinator had written it when it
  // opened; the rest (all of them while it is closed, and any whose slot
  // another id holds) go to the coordinator with the list, which is not
  // sent if it would carry nothing. Ids this rank completed are appended
  // to the log, ringing the ranks that must execute them. Other sets'
  // lists go to the coordinator as they are.
  absl::StatusOr<bool> Send(wire::RequestList list, std::vector<int64_t>* hits,
                            Coordinator* coordinator, int set_rank,
                            absl::Time now) override;
  // Every response list runs at its marker in the log.
  void Hold(wire::ResponseList list) override;
  // Executes the log from this rank's cursor as far as the lists it names
  // have arrived (those of sets this rank is not in are skipped).
  void Execute(bool* done, bool* handed_back = nullptr) override;
  void SetPolling(bool polling) override { board_->SetPolling(polling); }
  // The log holds records this rank has not executed, or ids wait for
  // room in it.
  bool Behind() const override {
    return cursor_ != board_->tail() || board_->ready_pending();
  }
  void AddCounters(std::map<std::string, int64_t>* counters) const override;

  // --- HitExchange, rank 0 (the coordinator).
  // The board is closed first: nothing is half there, half here.
  void Received(Coordinator& global, int from, absl::Time now) override;
  // Opens the board again once negotiation of the set is quiet, and moves
  // old partly set ids to the coordinator for its time-outs and stall
  // reports.
  void Tend(Coordinator& global, absl::Time now,
            absl::Time* next_wakeup) override;
  // A list is made once this rank has executed the log to its end (this
  // rank's caches are the coordinators', which the list changes) and when
  // the log has room for its marker; the global set's while the board is
  // closed.
  bool ReadyForList(Coordinator& global, int process_set, absl::Time now,
                    bool* done) override;
  void RingOthers() override;
  // Appends the list's marker (it runs here right after, at its marker);
  // the global set's list opens the board again if it leaves `global`
  // quiet.
  bool ListMade(const wire::ResponseList& list, int process_set,
                const Coordinator& global) override;
  void ListExecuted() override { board_->Executed(++cursor_); }
  // While the board is open, rank 0 looks at it at least every CheckLimit.
  absl::Time NextCheck(const Coordinator& global, absl::Time now) override;

 private:
  // Sets this rank's bits for the global set's hits `*ids`, leaving in
  // *ids the ones for the coordinator, and appends completed ids to the
  // log. `*send`: whether a request list must go to the coordinator all
  // the same (`requests`: it has new requests; `shutdown`: this rank
  // leaves). False (after Fatal) if the board's lock could not be had.
  bool Hand(std::vector<int64_t>* ids, bool requests, bool shutdown,
            bool* send);
  // Closes the board: its bits become the ranks' hits in `global`, as if
  // each had come in a request list when its id's first bit was set.
  void Close(Coordinator& global, absl::Time now);
  // How often rank 0 looks at an open board: its earliest check.
  absl::Duration CheckLimit(const Coordinator& global) const;
  // Takes the board's lock, for a HitBoardLock to hold; false (after
  // Fatal) if the job ended first or the op timeout passed.
  bool Lock() KOLO_TRY_ACQUIRE(true, board_);
  // Opens the board if `global` is quiet and every request list sent has
  // arrived.
  void OpenIfQuietLocked(const Coordinator& global) KOLO_REQUIRES(board_);

  HitBoard* const board_;
  ControlLink* const control_;
  const Limits limits_;
  const int rank_;
  // Records this rank has executed.
  uint64_t cursor_ = 0;
  // Response lists (by set and seq) received before their marker.
  std::map<std::pair<int, int64_t>, wire::ResponseList> lists_;
  // Rank 0: request lists received per rank.
  std::vector<uint64_t> received_;
  std::atomic<int64_t> hits_set_{0};  // "board.hits"
  // Storage kept from one call to the next.
  std::vector<int64_t> complete_, refused_;
  std::vector<HitBoard::Pulled> pulled_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_BOARD_EXCHANGE_H_
