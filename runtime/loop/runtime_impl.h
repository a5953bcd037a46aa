// RuntimeImpl: owns everything one Runtime runs: the store, the control
// plane, the process sets (ProcessSets: each set's backends, executors,
// response cache and, on rank 0, its coordinator), the exchange
// (HitExchange), what it knows of the job (JobState), the tensor queue and
// the background thread.
//
// Threads: the public methods run on caller threads; BackgroundLoop() on the
// background thread, which negotiates and issues collectives; a caller in
// SubmitAndWait may do the same in the loop's turn (Note [Caller turns] in
// caller_turn.cc): what is marked "background thread" below belongs to
// whoever holds the turn, one thread at a time. Fatal() may run on a
// control-plane reader thread.
#ifndef KOLO_RUNTIME_LOOP_RUNTIME_IMPL_H_
#define KOLO_RUNTIME_LOOP_RUNTIME_IMPL_H_

#include <atomic>
#include <map>
#include <memory>
#include <thread>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kolo/options.h"
#include "kolo/runtime.h"
#include "kolo/store.h"
#include "runtime/control/control_plane.h"
#include "runtime/control/hit_board.h"
#include "runtime/loop/backend.h"
#include "runtime/loop/board_exchange.h"
#include "runtime/loop/executor.h"
#include "runtime/loop/hit_exchange.h"
#include "runtime/loop/job_state.h"
#include "runtime/loop/log_executor.h"
#include "runtime/loop/process_sets.h"
#include "runtime/loop/tensor_queue.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/negotiation/host_batch.h"
#include "runtime/negotiation/response_cache.h"
#include "runtime/negotiation/timeline.h"
#include "runtime/sync/mutex.h"
#include "runtime/sync/wakeup.h"
#include "runtime/util/logging.h"

namespace kolo {

namespace rendezvous {
class TcpStoreServer;
}

class RuntimeImpl : public std::enable_shared_from_this<RuntimeImpl> {
 public:
  explicit RuntimeImpl(const Options& options);
  ~RuntimeImpl();

  // Rendezvous, control plane, the global set's backend, background thread.
  absl::Status Start();

  const Options& options() const { return options_; }
  // Checks the process set, then queues the entry. `process_set` of the
  // request must be set.
  absl::StatusOr<Work> Submit(TensorEntry entry);
  absl::StatusOr<Work> Submit(std::unique_ptr<TensorEntry> entry);
  // Submits the entry and waits for it, running the loop's turn on the
  // calling thread if it can (Note [Caller turns] in caller_turn.cc).
  BlockingResult SubmitAndWait(std::unique_ptr<TensorEntry> entry,
                               absl::Duration timeout);
  // Submits every entry or none (TensorQueue::AddAll); their Works'
  // states share one allocation. `entries` is emptied on success.
  absl::StatusOr<std::vector<Work>> SubmitAll(
      std::vector<std::unique_ptr<TensorEntry>>* entries);
  // Entries to fill for Submit/SubmitAll (Note [Entries recycled]).
  std::unique_ptr<TensorEntry> NewEntry() { return queue_.NewEntry(); }
  void NewEntries(size_t n, std::vector<std::unique_ptr<TensorEntry>>* out) {
    queue_.NewEntries(n, out);
  }
  // The process sets (lookups for the API's checks).
  const ProcessSets& sets() const { return sets_; }
  absl::StatusOr<int> Join();
  absl::StatusOr<int> AddProcessSet(const std::vector<int>& ranks);
  // Submits a collective whose result is one number (Join's last rank, a
  // new process set's id), waits for it and returns the number.
  absl::StatusOr<int> SubmitForValue(TensorEntry entry);
  absl::StatusOr<int> AddMemberProcessSet(const std::vector<int>& ranks,
                                          const std::string& key);
  absl::Status RemoveProcessSet(int process_set);
  absl::Status StartTimeline(const std::string& path, bool mark_cycles);
  absl::Status StopTimeline();
  RuntimeStats stats() const;
  std::map<std::string, int64_t> Counters() const;
  // The fatal error, OK while the job runs (Runtime::status()).
  absl::Status status() { return fatal_status(); }

  absl::Status Shutdown(absl::Duration timeout);
  void Abort();
  // Abort() at process exit, quietly (Note [Runtimes at exit] in
  // exit_guard.h).
  void StopForExit();

 private:
  // Checks that the runtime accepts work and the entry's device; gives the
  // entry its Work state (unless it has one).
  absl::Status Prepare(TensorEntry* entry);
  // A rank that cannot reach the coordinator gives up this long after the
  // coordinator itself would have reported the request's timeout (each
  // entry's deadline counts from when its request is taken for sending: by
  // the background thread, or by a caller in its turn).
  static constexpr absl::Duration kLocalTimeoutSlack = absl::Seconds(2);
  // Note [Background loop] in background_loop.cc.
  void BackgroundLoop();
  // Note [Coalescing submissions]: waits for a burst to end.
  void CoalesceSubmissions();
  void SendRequests(absl::Time now);
  void CoordinatorStep(absl::Time now, absl::Time* next_wakeup, bool* done);
  void SendList(ProcessSetState& set, const wire::ResponseList& list);
  // Coordinator: tells every rank which ranks it still waits for at
  // shutdown, when that changed.
  void ReportShutdownWaiting(const Coordinator& global);
  // Note [Caller turns], holding turn_->mu: sends this rank's new requests
  // and, on the board, executes its log until `work` completes, the spin
  // time passes or the thread must take over (rung). False if it took no
  // turn (then the caller rings the thread).
  bool CallerTurn(const internal::WorkState& work);
  // Coordinator: one request list of rank `from` for its set; false after
  // Fatal (the rank is not in the set).
  bool AcceptRequestList(int from, wire::RequestList list, absl::Time now);
  // Coordinator: a host leader's message.
  bool AcceptHostRequests(int from, wire::HostRequests& message,
                          absl::Time now);
  void Notify();
  // Fails all pending and future work with `status`, logged as an error
  // unless `quiet` (the program itself ended the runtime). Any thread.
  void Fatal(const absl::Status& status, bool quiet = false);
  absl::Status fatal_status() const { return job_.status(); }
  // After a failed collective: give the control plane a moment to say which
  // rank was lost, since that message is the useful one.
  absl::Status ExplainCollectiveFailure(const absl::Status& backend_error);
  bool StopLoop(absl::Time deadline);

  const Options options_;
  Logger logger_;
  std::shared_ptr<Store> store_;  // prefixed "kolo"
  std::unique_ptr<rendezvous::TcpStoreServer> store_server_;
  std::unique_ptr<ControlPlane> control_;
  TensorQueue queue_;
  Timeline timeline_;

  // After options_, logger_ and timeline_, which it uses.
  ProcessSets sets_;

  // Wakes the background thread: own_wakeup_, or (set before the thread
  // starts) the control plane's doorbell in shared memory, which peers ring
  // too (Note [Control over shared memory] in control/shm_ring.h).
  Wakeup own_wakeup_;
  std::atomic<Wakeup*> wakeup_{&own_wakeup_};
  // Callers blocked in Work::Wait on this runtime's collectives: the
  // background thread spins only while this is non-zero.
  std::shared_ptr<std::atomic<int>> waiters_ =
      std::make_shared<std::atomic<int>>(0);

  // The job's error, the loop's end, the ranks a shutdown waits for.
  JobState job_;
  std::atomic<bool> accepting_{false};
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> process_set_calls_{0};
  bool shutdown_sent_ = false;  // background thread only
  // SendRequests: per process set, the cache ids of one pass (storage kept
  // from pass to pass). Background thread only.
  std::map<int, std::vector<int64_t>> hits_to_send_;
  // What this rank does with each entry of its log, on every transport
  // (the exchange's Runner); its control plane is set by Start.
  LogExecutor log_;
  // Note [The exchange] (hit_exchange.h): how this rank's hits are ANDed
  // with the others' and its request lists sent, on this job's transport.
  // Set by Start; background thread (the loop's turn), counters any.
  std::unique_ptr<HitExchange> exchange_;
  // Note [Host relay], rank 0: what the leaders' messages do (null unless
  // hosts relay). Background thread only.
  std::unique_ptr<HostMessages> host_messages_;

  struct Counters {
    std::atomic<int64_t> requests_sent{0}, cache_hits_sent{0},
        request_lists_sent{0}, host_messages_received{0}, caller_turns{0},
        caller_turns_completed{0};
    std::atomic<int64_t> send_ns{0};  // Options::phase_times
  } counters_;
  // Note [Caller turns] (caller_turn.cc): the loop's turn, and
  // whether the loop runs (callers take turns only while it does).
  struct LoopTurn {
    Mutex mu;
    bool loop_running KOLO_GUARDED_BY(mu) = false;
    // The thread waits for the turn: a caller that has it hands it back.
    std::atomic<bool> thread_waits{false};
  };
  const std::unique_ptr<LoopTurn> turn_ = std::make_unique<LoopTurn>();
  std::thread thread_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_RUNTIME_IMPL_H_
