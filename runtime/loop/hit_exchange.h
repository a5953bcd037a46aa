// HitExchange: how a rank's cache hits are ANDed with the other ranks'
// (Note [The exchange]), and the interface through which the background
// loop sends every request list. Three transports implement it, one per
// job and rank, chosen at start:
//   CoordinatorExchange (coordinator_exchange.h)  through the coordinator
//   BoardExchange       (board_exchange.h)        one host's shared memory
//   LeaderExchange      (leader_exchange.h)       pre-ANDed by host leaders
//
// Threads: whoever holds the loop's turn (Note [Caller turns] in
// caller_turn.cc), one thread at a time; counters are read by any thread.
#ifndef KOLO_RUNTIME_LOOP_HIT_EXCHANGE_H_
#define KOLO_RUNTIME_LOOP_HIT_EXCHANGE_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/runtime.h"
#include "runtime/control/control_plane.h"
#include "runtime/control/hit_board.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/wire.pb.h"

namespace kolo {

// Note [The exchange]
// In steady state negotiation asks one question of each cached request:
// has every rank of the set submitted it? A rank answers its part with a
// cache hit (an id its response cache knows), and the exchange ANDs the
// ranks' hits:
//  - through the coordinator (any job): hits travel as cache ids in the
//    rank's request list, the coordinator ANDs them (Coordinator's hit
//    table) and its response list names the ids every rank sent;
//  - on the hit board (one host: Note [Hits on the board] in
//    control/hit_board.h): the global set's hits are bits in shared
//    memory, whoever sets an id's last bit appends it to the board's log,
//    and every rank executes that log from its own cursor, the coordinator
//    taking no part while the board is open;
//  - through host leaders (several hosts: Note [Host relay] in
//    control/control_plane.h): a host's ranks send their lists to their
//    leader, which sends once for the host the hits that every rank of the
//    host sent, so the coordinator ANDs hosts rather than ranks.
// Whatever the exchange does not AND itself (requests that are not hits,
// the board's refused or late ids, a shutdown) goes to the coordinator in a
// request list: it stays the source of truth for validation and errors.
// The loop reads the same on every transport: take the requests, hand
// each set's hits and list to the exchange, execute what came back (the
// coordinator's response lists; on the board, its log). The log is the
// job's, each set's entries in the order rank 0 made them: per-set logs
// run by one thread could deadlock two ranks that share two sets
// (docs/design/negotiation.md, "One log per job"). An exchange
// reaches the other ranks through a ControlLink (control_plane.h: a list
// to the coordinator, a rank's doorbell), which is the job's control plane
// in a job and a stand-in in tests (board_exchange_test), and runs its log
// on a Runner.
class HitExchange {
 public:
  // What the log runs on (LogExecutor: the sets' executors, the job's
  // fatal error).
  // A log has two kinds of entries: the coordinator's response lists, and
  // (on the board) records of ids every rank's hits completed.
  class Runner {
   public:
    virtual ~Runner() = default;
    // Whether this rank is a member of `process_set` (false: unknown).
    virtual bool IsMember(int process_set) = 0;
    // Executes a response list of a set this rank is a member of.
    virtual void ExecuteList(int process_set,
                             const wire::ResponseList& list) = 0;
    // One record of ids: the cached responses, fused by the board's plan
    // (PlanBuckets with the coordinator's `fusion_threshold_bytes`, so that
    // every rank fuses alike). False, executing nothing, if a `caller`
    // (Note [Caller turns]) must leave it to the thread (a CUDA tensor).
    virtual bool ExecuteIds(const HitBoardShared::Record& record,
                            int64_t fusion_threshold_bytes, bool caller) = 0;
    // Whether a caller (Note [Caller turns]) may execute `list`: false if
    // only the thread may (a CUDA response, a process set made or dropped,
    // a join, the job's final list).
    virtual bool CallerMayRun(const wire::ResponseList& list) = 0;
    virtual bool failed() = 0;
    virtual void Fatal(const absl::Status& status) = 0;
  };

  explicit HitExchange(Runner* runner) : runner_(runner) {}
  virtual ~HitExchange() = default;

  // --- Every rank.
  // Sends this rank's `list` of its set: `*hits`, the cache ids of its
  // cached requests (the exchange ANDs them or adds them to the list; it
  // leaves *hits as storage), and the list's requests. `coordinator`: the
  // set's on rank 0, else null. False if nothing needed sending (the board
  // took every hit); an error fails the job.
  virtual absl::StatusOr<bool> Send(wire::RequestList list,
                                    std::vector<int64_t>* hits,
                                    Coordinator* coordinator, int set_rank,
                                    absl::Time now) = 0;
  // A pass's control messages that are the exchange's (a leader takes its
  // host's request lists out of `events`); sends what is due. *next_wakeup:
  // when to come back.
  virtual absl::Status Relay(std::vector<ControlEvent>* events, absl::Time now,
                             absl::Time* next_wakeup) {
    return absl::OkStatus();
  }
  // A response list from the coordinator (not on rank 0, which runs its
  // lists where it makes them), kept to run where the log says: in the
  // order lists came (one ordered connection from the coordinator), or on
  // the board at its marker.
  virtual void Hold(wire::ResponseList list) {
    arrived_.push_back(std::move(list));
  }
  // Executes the log from this rank's cursor as far as it can; *done at
  // the job's final list. With `handed_back` (a caller's turn: Note
  // [Caller turns]): stops, setting it, at what only the thread runs
  // (Runner::CallerMayRun).
  virtual void Execute(bool* done, bool* handed_back = nullptr);
  // The lists sent wait to go on with other ranks' (a host leader's: its
  // host's), in Relay: a caller's turn relays too (Note [Caller turns]).
  virtual bool Relays() const { return false; }
  // While true, a rank that completes ids need not ring this one.
  virtual void SetPolling(bool polling) {}
  // There is more to execute than this rank has (a caller's turn leaves it
  // to the thread).
  virtual bool Behind() const { return !arrived_.empty(); }
  // The loop ended (`done`: at the job's final list); the exchange tells
  // whoever waits on this rank otherwise.
  virtual void LoopEnded(bool done) {}
  // Adds the exchange's counters (docs/tuning.md) to `counters`.
  virtual void AddCounters(std::map<std::string, int64_t>* counters) const {}

  // --- Rank 0, the coordinator, with `global` the global set's.
  // A request list of rank `from` for the global set is about to be added:
  // hits the exchange holds go to the coordinator first.
  virtual void Received(Coordinator& global, int from, absl::Time now) {}
  // Each coordinator step, before the sets' lists: the exchange's own
  // checks; *next_wakeup: when to come back.
  virtual void Tend(Coordinator& global, absl::Time now,
                    absl::Time* next_wakeup) {}
  // Before a response list of `process_set` is made: false if it must wait
  // (the board's log has no room for its marker; the other ranks make room
  // as they execute: RingOthers). *done: the job ended meanwhile.
  virtual bool ReadyForList(Coordinator& global, int process_set,
                            absl::Time now, bool* done) {
    return true;
  }
  // Wakes every other rank (to execute, and so make room).
  virtual void RingOthers() {}
  // Before the list is sent and run here (false after Fatal), and after it
  // ran here.
  virtual bool ListMade(const wire::ResponseList& list, int process_set,
                        const Coordinator& global) {
    return true;
  }
  virtual void ListExecuted() {}
  // After the step's lists: when the coordinator must look again.
  virtual absl::Time NextCheck(const Coordinator& global, absl::Time now) {
    return absl::InfiniteFuture();
  }

 protected:
  Runner* const runner_;

 private:
  // The response lists held, in the order they came (Hold's default).
  std::deque<wire::ResponseList> arrived_;
};

// Rank 0 adds the list to the set's coordinator; any other rank sends it
// to rank 0. The transports' common last step.
absl::Status SendToCoordinator(ControlLink* control, wire::RequestList list,
                               Coordinator* coordinator, int set_rank,
                               absl::Time now);

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_HIT_EXCHANGE_H_
