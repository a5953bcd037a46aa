// HostBatch: what a host leader holds of its host's request lists, and
// the one message it sends for them (Note [Host relay] in
// runtime/control/control_plane.h). No I/O: the background loop feeds it
// the lists and sends what Take() makes.
//
// The lists keep each rank's order. Take() takes out of the global set's
// lists the cache ids that every rank of the host sent in them and sends
// those once, for the host (HostRequests.host_hits); the coordinator
// counts them for each rank of the host, as if each list still carried
// them (Coordinator::AddHostHits), before it takes the lists themselves.
//
// A list left with nothing but its ack is not sent: the message carries
// the ack, which the coordinator takes after the lists. Reordering the
// hits reorders nothing that matters: an id's hit is independent of the
// same rank's other requests, a rank sends an id once per round (it cannot
// send it again before the round ran, which needs this very hit), and a
// join or a shutdown is a rank's last list of a round.
//
// An id goes once for the host only if the lists that carry it agree on
// their acked_seq, which the coordinator needs for its errors (Note
// [Requests an error will take]); the host's hits travel grouped by it.
//
// When to send: at once if some list is more than the global set's hits
// (a request, a shutdown, another set's list) or some rank of the host is
// in a join; otherwise once every id held is decided: every rank's bit is
// here (the id goes once for the host), or some rank's bit already went on
// alone this round (the others follow it at once, since the coordinator
// waits for them); or after `hold` at the latest. A fast rank's hits thus
// wait for the slow rank's, which the coordinator needs anyway, and a rank
// that never sends an id (a changed request, a stall) costs at most
// `hold`.
//
// Thread: whoever holds the leader's loop turn (its background thread or
// a caller: Note [Caller turns] in runtime/loop/caller_turn.cc).
#ifndef KOLO_RUNTIME_NEGOTIATION_HOST_BATCH_H_
#define KOLO_RUNTIME_NEGOTIATION_HOST_BATCH_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/wire.pb.h"

namespace kolo {

class HostBatch {
 public:
  // `host_ranks`: the host's ranks, ascending; [0] is the leader.
  explicit HostBatch(std::vector<int> host_ranks);

  // A list that rank `rank` (of the host) sent, received at `now`.
  void Add(int rank, wire::RequestList list, absl::Time now);
  bool empty() const { return lists_.empty(); }
  // When the held lists must go: InfinitePast for at once, never later
  // than the first one's arrival + `hold`.
  absl::Time Due(absl::Duration hold);
  // Moves the held lists into `out`, the host's common hits taken out of
  // them (their count in *host_hits).
  void Take(wire::HostRequests* out, int64_t* host_hits);
  // Drops the rounds of ids for which `gone` is true (the leader's guess
  // that no rank of the host will send them again: ids its cache no longer
  // has). A wrong guess costs a hold at most, never a wrong host hit: a
  // forgotten round's late bits are held like a new round's.
  void ForgetRounds(const std::function<bool(int64_t)>& gone);
  size_t rounds() const { return split_.size(); }
  const std::vector<int>& host_ranks() const { return host_; }

 private:
  // Per id in the held lists: the local ranks (bit i: host_[i]) that carry
  // it, and the acked_seq of the lists that do (if they all agree).
  struct Carried {
    uint64_t mask = 0;
    int64_t acked = 0;
    bool mixed = false;  // lists with different acked_seq carry it
  };
  void CountHits();
  int Index(int rank) const;
  // The split round of `id` that `mask`'s ranks belong to, or end().
  absl::flat_hash_map<int64_t, uint64_t>::iterator SplitRound(int64_t id,
                                                              uint64_t mask);

  const std::vector<int> host_;
  const bool anded_;  // at most 64 ranks: a bit each
  const uint64_t all_;
  std::vector<wire::RelayedList> lists_;
  absl::Time since_ = absl::InfiniteFuture();
  bool only_hits_ = true;  // every held list is the global set's hits only
  // Per id: the local ranks that sent it on alone in its current round.
  absl::flat_hash_map<int64_t, uint64_t> split_;
  // Local ranks whose last global-set list was a join: their partners'
  // hits will not all come, so nothing is held while one is in a join.
  std::vector<bool> in_join_;
  absl::flat_hash_map<int64_t, Carried> batch_;  // CountHits' result
  bool counted_ = false;  // batch_ counts lists_ as they are
  std::vector<std::pair<int64_t, int64_t>> host_ids_;  // Take's: (acked, id)
  std::vector<int64_t> keep_, group_;                  // Take's (storage)
};

// HostMessages: rank 0's side of the relay, what a leader's message does
// to the coordinators (BackgroundLoop::AcceptHostRequests; the tests, the
// negotiation fuzzer and benchmark drive it too). Thread: rank 0's
// background thread.
class HostMessages {
 public:
  // leader_of[r]: the leader of rank r's host, for every rank of the job.
  explicit HostMessages(std::vector<int> leader_of);

  // Leader `leader`'s message: checks that it speaks for exactly the ranks
  // of the leader's host (ranks ascending, the leader first, each list's
  // and ack's rank one of them), then adds the host's hits to `global`
  // (the global set's coordinator), hands each relayed list in order to
  // `add_list` (which finds the list's process set; false: it failed the
  // job, and nothing more is added), then adds the acks to `global`.
  // InternalError naming the leader if a rank is not on its host (nothing
  // is added); Aborted if `add_list` refused a list.
  absl::Status Accept(
      int leader, wire::HostRequests& message, Coordinator& global,
      const std::function<bool(int rank, wire::RequestList list)>& add_list,
      absl::Time now);

 private:
  bool OnHost(int leader, int rank) const {
    return rank >= 0 && rank < static_cast<int>(leader_of_.size()) &&
           leader_of_[rank] == leader;
  }

  std::vector<int> leader_of_;
  std::vector<int> host_size_;                 // by leader: its host's ranks
  std::vector<int> ranks_;                     // Accept's (storage)
  std::vector<std::pair<int, int64_t>> acks_;  // Accept's (storage)
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_NEGOTIATION_HOST_BATCH_H_
