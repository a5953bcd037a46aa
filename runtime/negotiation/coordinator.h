// Coordinator: the coordinator's side of negotiation, one Coordinator per
// process set, all hosted by global rank 0.
//
// Note [Negotiation protocol]
// 1. Each rank's background thread sends the coordinator, per process set, a
//    RequestList with the tensors submitted since its last message (any
//    order per rank): full requests, or cache ids for requests the response
//    cache knows (Note [Response cache] in response_cache.h), or a request
//    to shut down.
// 2. The coordinator records each request under its name. A name is ready
//    when every rank of the set has requested it (ranks that have joined
//    count as having requested sum/average allreduces). It then validates
//    the requests (type, dtype, device, shape, op, root, scale factors,
//    splits must agree): a response, or an ERROR response naming the tensor,
//    the ranks and their values. Members of a grouped allreduce wait for the
//    whole group and fail together.
// 3. Ready responses are fused (runtime/negotiation/fusion.h) into one
// ResponseList,
//    numbered per set, sent to every rank of the set; every rank executes
//    the lists in the order sent, so collectives run in one order. While
//    some names are only partly submitted, the coordinator holds ready names
//    at most KOLO_CYCLE_TIME so that more can join the same list; a lone
//    request is answered at once (background_loop.cc, Note [Background loop]).
// 4. A name not requested by every rank within the op timeout becomes a
//    DeadlineExceeded ERROR naming the ranks that did not submit it; the
//    stall inspector warns earlier (KOLO_STALL_CHECK_TIME) and, with
//    KOLO_STALL_SHUTDOWN_TIME, ends the job. A rank that asked to shut down
//    fails every name it never submitted.
// 5. Shutdown: when every rank has asked, the final list has shutdown set.
// The coordinator holds no network state: the background loop feeds it
// messages and sends what it returns, which keeps it unit-testable.
//
// Thread: owned by rank 0's background thread.
#ifndef KOLO_RUNTIME_NEGOTIATION_COORDINATOR_H_
#define KOLO_RUNTIME_NEGOTIATION_COORDINATOR_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/base/optimization.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/negotiation/cache_id_table.h"
#include "runtime/negotiation/response_cache.h"
#include "runtime/negotiation/timeline.h"
#include "runtime/negotiation/validation.h"
#include "runtime/wire.pb.h"

namespace kolo {

class Coordinator {
 public:
  struct Config {
    int process_set = 0;
    std::vector<int> global_ranks;  // index in the set -> global rank
    int64_t fusion_threshold_bytes = 64 << 20;
    int cache_capacity = 1024;
    Timeline* timeline = nullptr;  // NEGOTIATE and QUEUE phases; may be null
    // Note [Cache hits as bits]; false: every hit by the slow path (the
    // reference that negotiation_fuzzer compares the bit path with).
    bool hits_as_bits = true;
  };
  explicit Coordinator(Config config);

  // Records what set rank `rank` sent. `now` stamps new names. (By value:
  // the requests move into the coordinator.)
  void AddRequests(int rank, wire::RequestList list, absl::Time now);
  // Records that every set rank in `ranks` sent each cache id of `hits`
  // (a host's hits ANDed by its leader: Note [Host relay] in
  // runtime/control/control_plane.h); the same as each rank sending them
  // in its own list. `hits.acked_seq` is the acked seq of a list that
  // carried them (any: an id is taken by an error for all its senders or
  // for none). Only hits: the ranks' acks and requests come in their lists.
  void AddHostHits(const std::vector<int>& ranks, const wire::RequestList& hits,
                   absl::Time now);
  // Set rank `rank` executed the set's lists up to `acked_seq` (what a
  // list's acked_seq says, without the list), for each (rank, acked_seq).
  void AddAcks(const std::vector<std::pair<int, int64_t>>& acks);

  // Names pending longer than their timeout (Note [Request timeouts] in
  // collectives.h; `op_timeout` for requests without one of their own)
  // become DeadlineExceeded errors naming the ranks that did not submit.
  void ExpireOlderThan(absl::Duration op_timeout, absl::Time now);
  // When ExpireOlderThan has work next, or InfiniteFuture: exact while
  // every request takes the job's timeout (O(1)), else at most early.
  absl::Time NextTimeout(absl::Duration op_timeout) const;
  // The shortest timeout a pending or partly hit name may have:
  // `op_timeout`, or a shorter one some request of this set came with.
  absl::Duration ShortestTimeout(absl::Duration op_timeout) const;
  // Stall inspector: one line per rank that is holding back names pending
  // longer than `check_time` and not reported before, e.g.
  // "rank 1: [grad/a, grad/b]".
  std::vector<std::string> StallReport(absl::Duration check_time,
                                       absl::Time now);
  // A message if some name has been pending longer than `shutdown_time`.
  std::optional<std::string> StalledPast(absl::Duration shutdown_time,
                                         absl::Time now);

  bool HasReady() const { return !ready_.empty(); }
  absl::Time OldestReadyTime() const { return ready_.front().ready_at; }
  // Whether some name has been requested by some but not all ranks.
  bool HasPartial() const { return !pending_.empty() || partial_hits_ > 0; }
  // Earliest first-seen + `delay` over pending names, or InfiniteFuture.
  absl::Time NextPendingDeadline(absl::Duration delay) const;
  // The same over names the stall inspector has not reported yet.
  absl::Time NextStallCheck(absl::Duration check_time) const;

  // Takes the ready responses, fuses them, applies the list's changes to the
  // coordinator's response cache and numbers the list.
  wire::ResponseList TakeResponseList();

  bool AllShutdown() const {
    return static_cast<int>(shutdown_.size()) == size_;
  }
  // Set ranks that asked to shut down, ascending.
  const std::set<int>& ShutdownRanks() const { return shutdown_; }
  int size() const { return size_; }
  // Nothing pending, partly hit, ready, joined, shutting down or recently
  // failed: what the hit board needs to open (Note [Hits on the board]).
  bool Quiet() const {
    return pending_.empty() && partial_hits_ == 0 && ready_.empty() &&
           groups_.empty() && joined_.empty() && shutdown_.empty() &&
           recent_errors_.empty() && !ready_while_joined_;
  }
  // The last list seq set rank `rank` said it executed.
  int64_t acked(int rank) const { return acked_[rank]; }
  // The coordinator's copy of the set's response cache.
  ResponseCache& cache() { return cache_; }

  // For diagnostics and tests: every pending name, the partly sent cache
  // hits' included, sorted.
  std::vector<std::string> PendingNames() const;
  // Names waiting on the slow path (a slot per rank and name): not the
  // cache hits counted by bits (Note [Cache hits as bits]).
  size_t SlowPathNames() const { return pending_.size(); }
  int64_t requests_received() const { return requests_received_; }
  int64_t cache_hits_received() const { return cache_hits_received_; }

 private:
  struct Pending {
    // Per rank: its request, null until submitted. A request that came as a
    // cache id shares the cache's copy.
    // (Inline for small sets: no allocation per name.)
    absl::InlinedVector<std::shared_ptr<const wire::Request>, 4> by_rank;
    absl::InlinedVector<int64_t, 4> cache_id;  // per rank: the id sent, or -1
    int count = 0;
    absl::Time first_seen;
    // The shortest of the submitted requests' own timeouts (Note [Request
    // timeouts]); 0: none has one (the job's op timeout: TimeoutOf).
    int64_t timeout_us = 0;
    bool stall_reported = false;
    // ADD_MEMBER_PROCESS_SET: the ranks (of this set) that submit it, the
    // only ones waited for (Note [Sets created by their members]). Empty:
    // every rank.
    absl::InlinedVector<int, 4> members;
    // The name's current cache id when it became pending, or -1: that id's
    // hits come here while the name is pending (Hits::slow).
    int64_t hit_id = -1;
  };
  // Note [Cache hits as bits] (coordinator.cc): one cache id's hits.
  struct Hits {
    absl::InlinedVector<uint64_t, 1> ranks;  // bit r: set rank r sent the id
    int count = 0;                           // bits set
    absl::Time first_seen;                   // the first bit of this round
    // The id's name is pending on the slow path: its hits go there too.
    bool slow = false;
    bool present = false;  // (CacheIdTable's window: the entry exists)
  };
  static absl::Duration TimeoutOf(const Pending& p, absl::Duration op_timeout) {
    return p.timeout_us > 0 ? absl::Microseconds(p.timeout_us) : op_timeout;
  }
  // Cache id -> Hits (cache_id_table.h: a window by subtraction, a map
  // after much churn; a Hits& stays valid until its entry is erased).
  using HitTable = CacheIdTable<Hits>;
  struct Ready {
    // The response: the cache's own when every rank sent the same current
    // cache id (no copy, and no message made per ready id), else built
    // here.
    std::shared_ptr<const wire::Response> response;
    absl::Time ready_at;
    // A request of the name (rank ignored), for the response cache; null
    // when served from the cache.
    std::shared_ptr<const wire::Request> canonical;
    int64_t cache_id = -1;  // every rank sent this id
    const wire::Response& get() const { return *response; }
  };
  // `now` stamps a new name; `begun`: its timeline event is open already.
  void Add(int rank, std::shared_ptr<const wire::Request> request,
           int64_t cache_id, absl::Time now, bool begun = false);
  // The bit path: rank `rank` sent current id `id`, which is not pending
  // on the slow path and nobody has joined or shut down.
  void AddHit(int rank, int64_t id, Hits& hits, absl::Time now);
  // AddHit for several ranks at once: (word, bits) of Hits::ranks.
  using RankWords = absl::InlinedVector<std::pair<int, uint64_t>, 2>;
  void AddHits(const RankWords& words, int64_t id, Hits& hits, absl::Time now);
  // Whether an error made after `acked_seq` takes `name`'s request (Note
  // [Requests an error will take]).
  bool TakenByError(const std::string& name, int64_t acked_seq) const;
  // Whether hits may be counted by bits now (Note [Cache hits as bits]).
  bool BitsAllowed() const {
    return config_.hits_as_bits && joined_.empty() && shutdown_.empty() &&
           recent_errors_.empty();
  }
  // The id's Hits if its hit is counted by bits, else null (slow path).
  Hits* FastHits(int64_t id);
  // Drops graveyard entries and recent errors every rank has acknowledged.
  void ForgetAcknowledged();
  void FirstHit(int64_t id, Hits& hits, absl::Time now);
  void HitEverywhere(int64_t id, Hits& hits, absl::Time now);
  // Moves a partly sent id to the slow path (a Pending entry with a slot
  // per rank), for what only the slow path handles: a full request of
  // the name, eviction, a join, a shutdown, a time-out or stall report.
  void MaterializeHit(int64_t id, Hits& hits);
  void MaterializeHits();
  void ClearHit(Hits& hits);
  // After the cache evicted entries: their partial hits take the slow
  // path, their idle ones are forgotten.
  void ForgetEvictedHits();
  // The earliest first bit over partly sent ids (InfiniteFuture if none).
  absl::Time OldestHit() const;
  void AddJoin(int rank, absl::Time now);
  // Makes `name` ready if every rank has submitted it or joined.
  using PendingMap = absl::flat_hash_map<absl::string_view, Pending>;
  void MaybeReady(PendingMap::iterator it, absl::Time now);
  void PushReady(Ready ready);
  void FailPending(absl::string_view name, const Pending& pending,
                   absl::StatusCode code, const std::string& message,
                   absl::Time now);
  // "ranks 1, 3" (global ranks) of `pending` that have (or have not)
  // submitted.
  std::string RanksWhere(const Pending& pending, bool submitted) const;
  // Whether `pending` waits for `rank` (every rank, or its members).
  static bool Awaits(const Pending& pending, int rank);
  // ADD_MEMBER_PROCESS_SET: ready once every member submitted.
  void MaybeReadyMembers(PendingMap::iterator it, absl::Time now);
  std::string RankLabel(int rank) const;
  // Erases a pending name, keeping the bookkeeping below.
  void ErasePending(PendingMap::iterator it);
  // The pending names in order (for the rare passes over all of them, so
  // that their results do not depend on hashing).
  std::vector<absl::string_view> SortedPendingNames() const;
  // The earliest first_seen over pending names (InfiniteFuture if none).
  // The background loop asks on every turn: O(1) unless the name that was
  // the oldest has left since, then one scan.
  absl::Time OldestPending() const;

  const Config config_;
  const int size_;
  // Name -> pending state; the key views a request the entry holds.
  PendingMap pending_;
  mutable absl::Time oldest_ = absl::InfiniteFuture();  // see OldestPending
  // The shortest timeout_us any request of this set came with (a cache
  // hit's is its cached request's); 0: none came with one.
  int64_t shortest_timeout_us_ = 0;
  mutable bool oldest_stale_ = false;
  int stall_reported_ = 0;  // pending names with stall_reported
  std::deque<Ready> ready_;
  // Grouped allreduce: members that are ready, by group key.
  std::map<std::string, std::vector<Ready>> groups_;
  std::set<int> shutdown_;
  std::set<int> joined_;
  // Some response in ready_ was made ready while a rank had joined.
  bool ready_while_joined_ = false;
  int last_joined_ = -1;
  int next_process_set_id_ = 1;  // global set only
  ResponseCache cache_;
  // Cache id -> its hits. An entry that is not slow is a current id.
  HitTable hits_;
  int partial_hits_ = 0;
  mutable absl::Time hits_oldest_ = absl::InfiniteFuture();  // see OldestHit
  mutable bool hits_oldest_stale_ = false;
  int64_t evictions_seen_ = 0;
  int64_t seq_ = 0;
  std::vector<int64_t> acked_;  // per rank
  // Names of error responses sent -> the list's seq, until every rank has
  // executed it (Note [Requests an error will take]).
  std::map<std::string, int64_t> recent_errors_;
  int64_t requests_received_ = 0;
  int64_t cache_hits_received_ = 0;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_NEGOTIATION_COORDINATOR_H_
