// LeaderExchange: a host leader's side of the host relay (Note [Host relay]
// in runtime/control/control_plane.h): the request lists of its host's
// ranks, its own included, held and sent on to the coordinator as one
// message, the global set's hits that every rank of the host sent going
// once for the host (pre-ANDed: HostBatch). Not rank 0, which takes its
// host's lists as the coordinator (and the leaders' messages through
// HostMessages).
//
// Thread: whoever holds the leader's loop turn (its background thread, or
// a caller: Note [Caller turns] in runtime/loop/caller_turn.cc).
#ifndef KOLO_RUNTIME_LOOP_LEADER_EXCHANGE_H_
#define KOLO_RUNTIME_LOOP_LEADER_EXCHANGE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/control/control_plane.h"
#include "runtime/loop/hit_exchange.h"
#include "runtime/negotiation/host_batch.h"
#include "runtime/wire.pb.h"

namespace kolo {

class LeaderExchange final : public HitExchange {
 public:
  struct Batching {
    absl::Duration hold;  // the longest a list is held (KOLO_CYCLE_TIME)
    int cache_capacity;   // KOLO_CACHE_CAPACITY
    // This rank's cache no longer has the id: the host's ranks, which run
    // the same lists, will not send it again (HostBatch::ForgetRounds).
    std::function<bool(int64_t)> gone;
  };
  // `host_ranks`: the host's ranks, ascending, this rank first.
  LeaderExchange(std::vector<int> host_ranks, ControlPlane* control,
                 Runner* runner, Batching batching);

  // This rank's list joins its host's, its hits added to it (the batch
  // takes out the ones every rank of the host sent).
  absl::StatusOr<bool> Send(wire::RequestList list, std::vector<int64_t>* hits,
                            Coordinator* coordinator, int set_rank,
                            absl::Time now) override;
  // Takes the host's request lists out of `events` and sends the held
  // lists on when they are due (at most `hold` after the first arrived:
  // HostBatch::Due).
  absl::Status Relay(std::vector<ControlEvent>* events, absl::Time now,
                     absl::Time* next_wakeup) override;
  bool Relays() const override { return true; }
  // A leader whose loop ends before the job's end (an error): its host's
  // ranks must not wait for it.
  void LoopEnded(bool done) override {
    if (!done) control_->StopHostRelay();
  }
  void AddCounters(std::map<std::string, int64_t>* counters) const override;

 private:
  const int rank_;
  HostBatch batch_;
  ControlPlane* const control_;
  const Batching batching_;
  // Read by Counters() on caller threads.
  std::atomic<int64_t> messages_sent_{0}, hits_sent_{0};
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_LEADER_EXCHANGE_H_
