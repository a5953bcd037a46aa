// ControlPlane: kolo's own authenticated connection from every rank to the
// coordinator (rank 0). Carries request lists (rank -> coordinator), response
// lists and "rank k lost" notices (coordinator -> ranks). Never gloo.
//
// Frames are SecureChannel frames (runtime/net/secure_channel.h) holding a
// wire::ControlMessage; nothing is parsed before its MAC checks.
//
// Liveness: each connection has a reader thread. When a rank's connection
// closes before it asked to shut down, the coordinator tells every other
// rank "rank k lost" and reports the loss through `on_fatal`; when the
// coordinator's connection closes, a rank reports "lost coordinator
// (rank 0)". `on_fatal` runs on the reader thread, so pending work fails at
// once even while the background thread is inside a collective.
// A rank that hangs without closing its connection (stopped, deadlocked,
// unreachable) is found by heartbeats: every side sends one each
// `heartbeat_interval`, and a connection silent for `heartbeat_timeout` is a
// lost peer, reported like a closed one. A heartbeat thread of its own keeps
// them flowing while the background thread is inside a long collective.
//
// Threads: Send*/Broadcast may be called from any thread; TakeEvents by
// whoever holds the loop's turn; Close from any thread. The plane's own threads
// (readers, heartbeats, the coordinator's listen thread) may still run while
// a program that gave up after an error exits: they touch only the plane's
// own memory, kolo's HMAC (Note [No library state on kolo's threads] in
// runtime/net/sha256.h), absl's clock (constant-initialised, never
// destroyed) and generated protobuf messages (whose default instances are
// never destroyed), none of which exit tears down, besides what the
// callbacks touch (the runtime's to keep safe).
//
// Note [Host relay]
// A job over several hosts keeps TCP from every rank to the coordinator
// (heartbeats, response lists, "rank k lost"), but on a host that runs
// several of the job's ranks their request lists go to the host's leader,
// its lowest rank, through rings in a shared segment of the host (the
// segment of Note [Control over shared memory], made for the host's ranks,
// ring 0 being the leader's), and the leader sends the coordinator one
// message (wire::HostRequests) for all of them: each rank's lists in the
// order it sent them, and, taken out of them, the global set's cache ids
// that every rank of the host sent (HostBatch,
// runtime/negotiation/host_batch.h), which the coordinator counts for each of
// the host's ranks (Coordinator::AddHostHits). In steady state a host of k
// ranks costs the coordinator one message and one bit operation per id instead
// of k of each. On rank 0's host rank 0 is the leader and the coordinator
// itself: its host's lists arrive over shared memory, with nothing to
// send on.
// One path per rank keeps every rank's order: a rank's shutdown request
// still arrives after its other lists (the coordinator marks a relayed
// goodbye like one over the rank's own connection, so its closing is
// not a loss). The leader holds the lists at most KOLO_CYCLE_TIME, only
// while they are the global set's hits and some id waits for a rank of
// the host that has not sent it (HostBatch::Due); and only between its
// own collectives (like the coordinator, it reads its rings while
// whoever holds its loop's turn, its background thread or a caller's
// turn, is not inside one). A lost leader is a lost rank,
// found by its connection to the coordinator as any other; a rank behind
// it learns it from the coordinator. The segment is private to the job's
// user and unlinked once mapped, as the single-host one; its bytes, like
// a ring's there, are parsed without a MAC (only the job's processes can
// map it). The leader's KOLO_HIT_BOARD decides for its host (off: every
// rank sends its own lists).
#ifndef KOLO_RUNTIME_CONTROL_CONTROL_PLANE_H_
#define KOLO_RUNTIME_CONTROL_CONTROL_PLANE_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/store.h"
#include "runtime/control/shm_ring.h"
#include "runtime/net/handshake_queue.h"
#include "runtime/net/secure_channel.h"
#include "runtime/net/socket.h"
#include "runtime/os/unique_fd.h"
#include "runtime/sync/mutex.h"
#include "runtime/sync/wakeup.h"
#include "runtime/wire.pb.h"

namespace kolo {

struct ControlEvent {
  int from_rank = 0;
  wire::ControlMessage message;
};

struct ControlCallbacks {
  std::function<void()> notify;                       // an event is queued
  std::function<void(const absl::Status&)> on_fatal;  // a peer is lost
};

struct Liveness {
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_timeout = absl::Seconds(300);
};

// What the loop's exchanges (runtime/loop/hit_exchange.h) ask of the
// control plane: a request list to the coordinator, a rank's doorbell.
// ControlPlane is the job's; tests and fuzzers give their own, so that
// they drive the exchanges themselves.
class ControlLink {
 public:
  virtual ~ControlLink() = default;
  // Non-coordinator ranks: to the coordinator.
  virtual absl::Status SendToCoordinator(
      const wire::ControlMessage& message) = 0;
  // Rings rank r's doorbell (shared memory only).
  virtual void Ring(int r) = 0;
};

class ControlPlane final : public ControlLink {
 public:
  // Rank 0 listens on bind_addr, publishes its address in `store` and waits
  // until every other rank has connected; other ranks connect. Blocks until
  // `deadline`; the error names the ranks that did not connect.
  static absl::StatusOr<std::unique_ptr<ControlPlane>> Create(
      int rank, int size, std::shared_ptr<Store> store,
      const std::string& secret, const std::string& bind_addr,
      absl::Time deadline, ControlCallbacks callbacks,
      Liveness liveness = Liveness());
  ~ControlPlane();

  // Non-coordinator ranks: to the coordinator.
  absl::Status SendToCoordinator(const wire::ControlMessage& message) override;
  // Coordinator: to every other rank (serialized once).
  absl::Status Broadcast(const wire::ControlMessage& message);
  // Coordinator: to the given ranks (rank 0 itself is skipped).
  absl::Status SendTo(const std::vector<int>& ranks,
                      const wire::ControlMessage& message);
  // Coordinator: ends the job on every rank with `status` (JobFailed). From
  // now on a peer that closes its connection is not reported as lost: a
  // rank that exits on this message must not become every other rank's
  // cause instead of `status`.
  absl::Status FailJob(const absl::Status& status);

  // Every rank on one host: moves request and response lists to a shared
  // segment (Note [Control over shared memory] in shm_ring.h). Every rank
  // must call it, after Create(); if some rank cannot map the segment,
  // every rank keeps TCP. Errors only when the store fails. Rank 0's
  // `hit_board` and `fusion_threshold_bytes` decide for every rank whether
  // the global set's hits go on the board (Note [Hits on the board] in
  // hit_board.h) and how its records are fused.
  absl::Status EnableSharedMemory(Store& store, absl::Time deadline,
                                  bool hit_board = false,
                                  int64_t fusion_threshold_bytes = 0);
  // A job that spans hosts, on every rank of a host that runs several of
  // its ranks: request lists go to the host's leader (its lowest rank)
  // through a shared segment of the host, and the leader sends them on
  // with the host's common hits ANDed (Note [Host relay]). `host_ranks`:
  // the job's ranks on this host, ascending, this one among them. Every
  // rank of the host must call it, after Create(); the leader's `enable`
  // decides for the host, and if some rank cannot map the segment the
  // host keeps TCP. Errors only when the store fails.
  absl::Status EnableHostRelay(Store& store, absl::Time deadline,
                               const std::vector<int>& host_ranks, bool enable);
  // Whether this host relays; its leader, its ranks.
  bool host_relay() const { return host_.load() != nullptr; }
  // A rank behind a leader: request lists that did not fit into its ring
  // yet wait here, in order (SendToCoordinator never blocks on a full
  // ring: the leader may be in a collective that needs this rank); the
  // background thread retries them each pass (the leader rings it when it
  // has read). Whoever holds the loop's turn (Note [Caller turns] in
  // runtime/loop/caller_turn.cc).
  bool host_out_pending() const { return !host_out_.empty(); }
  void PushHostOut();
  // A rank behind a leader: the leader stopped relaying (its loop ended on
  // an error). Leader: says so to its host's ranks and rings them.
  absl::Status HostLeaderStatus() const;  // Unavailable once it stopped
  void StopHostRelay();
  int host_leader() const { return host_ranks_.empty() ? -1 : host_ranks_[0]; }
  const std::vector<int>& host_ranks() const { return host_ranks_; }

  // The doorbell that peers ring when they send this rank a list over
  // shared memory (the job's segment or the host's); null without. The
  // background thread should wait on it (and local events should ring it).
  Wakeup* doorbell();
  bool shared_memory() const { return shm_.load() != nullptr; }
  // The segment's hit board; null without shared memory or if rank 0 did
  // not enable it. Background thread.
  HitBoard* hit_board() {
    ShmControlSegment* shm = shm_.load();
    return shm ? shm->hit_board() : nullptr;
  }
  // Rings rank r's doorbell (shared memory only).
  void Ring(int r) override {
    if (ShmControlSegment* shm = shm_.load()) shm->Notify(r);
  }

  // Messages received since the last call, in arrival order. Whoever holds
  // the loop's turn (the background thread, or a caller in its turn: Note
  // [Caller turns] in runtime/loop/caller_turn.cc), one at a time.
  std::vector<ControlEvent> TakeEvents();

  // The job is ending normally: connections that close from now on are not
  // losses.
  void MarkShuttingDown() { shutting_down_ = true; }
  // Closes every connection and joins the reader threads.
  void Close();

  // Peers whose connection end (closed, broken, silent past the heartbeat
  // timeout) this plane has handled, whether it counted as a loss or not,
  // each counted once; for tests and diagnostics. WaitConnectionsEnded blocks
  // until at least `n` or `deadline`; true if reached.
  int connections_ended() const;
  bool WaitConnectionsEnded(int n, absl::Time deadline) const;

 private:
  ControlPlane(int rank, int size, ControlCallbacks callbacks,
               Liveness liveness);
  void HeartbeatLoop();
  absl::Status StartCoordinator(std::shared_ptr<Store> store,
                                const std::string& secret,
                                const std::string& bind_addr,
                                absl::Time deadline);
  absl::Status StartRank(std::shared_ptr<Store> store,
                         const std::string& secret, absl::Time deadline);
  // Note [Unauthenticated connections cost no thread]
  // (runtime/net/handshake_queue.h): the listen thread accepts, keeps every
  // pending handshake in a bounded HandshakeQueue on one poll(), and gives
  // a reader thread only to connections that completed the handshake. A
  // thread that cannot be created is an error (start_error_ during
  // Create(), the connection closed afterwards), never an exception.
  void ListenLoop();
  void ServeConnection(std::shared_ptr<net::SecureChannel> channel);
  // Starts `body` on a thread of threads_; false (and the reason in
  // *error) when the system has no thread to give.
  bool StartThreadLocked(std::function<void()> body, absl::Status* error)
      KOLO_REQUIRES(mu_);
  void ReadLoop(int peer_rank, net::SecureChannel* channel);
  void PeerLost(int peer_rank, const std::string& reason);
  void Push(int from_rank, wire::ControlMessage message);
  // Background thread: moves complete messages from the incoming rings to
  // shm_events_. False if a peer sent garbage (reported as lost).
  bool DrainShm();
  absl::Status WriteShm(ShmControlSegment& segment, ShmRing& ring, int to,
                        const std::string& bytes);
  // DrainShm for the host segment's incoming rings (the leader).
  bool DrainHost(ShmControlSegment& host);

  const int rank_;
  const int size_;
  const ControlCallbacks callbacks_;
  const Liveness liveness_;
  std::thread heartbeat_thread_;
  CondVar closed_cv_;  // wakes the heartbeat thread
  std::atomic<bool> shutting_down_{false};
  std::atomic<bool> closed_{false};
  std::atomic<bool> lost_reported_{false};

  // Coordinator only: the listener and its pending handshakes belong to
  // the listen thread once it runs.
  std::unique_ptr<net::Listener> listener_;
  std::unique_ptr<net::HandshakeQueue> handshakes_;
  std::thread listen_thread_;
  os::Pipe wake_pipe_;  // wakes the listen thread

  mutable Mutex mu_;
  CondVar joined_cv_;
  // Coordinator: index = peer rank; others: [0] = the coordinator.
  std::vector<std::shared_ptr<net::SecureChannel>> channels_
      KOLO_GUARDED_BY(mu_);
  std::vector<bool> leaving_ KOLO_GUARDED_BY(mu_);  // (rank asked to shut down)
  int joined_ KOLO_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_ KOLO_GUARDED_BY(mu_);
  std::vector<ControlEvent> events_ KOLO_GUARDED_BY(mu_);
  // Peers whose connection end was handled (connections_ended()).
  std::vector<bool> ended_ KOLO_GUARDED_BY(mu_);
  int connections_ended_ KOLO_GUARDED_BY(mu_) = 0;
  mutable CondVar ended_cv_;
  // A failure of the coordinator's listen thread while ranks are joining
  // (no thread for a rank's connection); StartCoordinator returns it.
  absl::Status start_error_ KOLO_GUARDED_BY(mu_);

  // Set once before the background thread starts; read by reader threads.
  std::unique_ptr<ShmControlSegment> shm_owner_;
  std::atomic<ShmControlSegment*> shm_{nullptr};
  std::vector<ControlEvent> shm_events_;  // the loop's turn only
  // The host relay (EnableHostRelay), set like shm_.
  std::unique_ptr<ShmControlSegment> host_owner_;
  std::atomic<ShmControlSegment*> host_{nullptr};
  std::vector<int> host_ranks_;
  int host_index_ = -1;               // this rank's place in host_ranks_
  std::deque<std::string> host_out_;  // PushHostOut's (the loop's turn)
  size_t host_out_offset_ = 0;        // bytes of host_out_.front() written
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_CONTROL_CONTROL_PLANE_H_
