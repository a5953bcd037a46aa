// LeaderExchange: a host leader's side of the host relay (Note [Host relay]
// in runtime/control/control_plane.h): the request lists of its host's
// ranks, its own included, held and sent on to the coordinator as one
// message, the global set's hits that every rank of the host sent going
// once for the host (pre-ANDed: HostBatch). Not rank 0, which takes its
// host's lists as the coordinator (and the leaders' messages through
// HostMessages).
//
// Thread: the leader's background thread.
#ifndef KOLO_RUNTIME_LOOP_LEADER_EXCHANGE_H_
#define KOLO_RUNTIME_LOOP_LEADER_EXCHANGE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/control/control_plane.h"
#include "runtime/negotiation/host_batch.h"
#include "runtime/wire.pb.h"

namespace kolo {

class LeaderExchange {
 public:
  // `host_ranks`: the host's ranks, ascending, this rank first.
  LeaderExchange(std::vector<int> host_ranks, ControlPlane* control);

  // A request list of rank `rank` of the host (this one's included).
  void Add(int rank, wire::RequestList list, absl::Time now) {
    batch_.Add(rank, std::move(list), now);
  }
  // Moves the host's request lists out of `events` into the batch.
  void TakeHostLists(std::vector<ControlEvent>* events, absl::Time now);
  // Sends the held lists on when they are due (at most `hold` after the
  // first arrived: HostBatch::Due); *next_wakeup: when the held ones must
  // go. `gone(id)`: this rank's cache no longer has the id (the host's
  // ranks, which run the same lists, will not send it again); the batch
  // forgets such ids' rounds from time to time, after `cache_capacity`.
  absl::Status Flush(absl::Time now, absl::Duration hold, int cache_capacity,
                     const std::function<bool(int64_t)>& gone,
                     absl::Time* next_wakeup);

  int64_t messages_sent() const { return messages_sent_.load(); }
  int64_t hits_sent() const { return hits_sent_.load(); }

 private:
  HostBatch batch_;
  ControlPlane* const control_;
  // Read by stats() on caller threads.
  std::atomic<int64_t> messages_sent_{0}, hits_sent_{0};
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_LEADER_EXCHANGE_H_
