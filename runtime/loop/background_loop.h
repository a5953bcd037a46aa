// BackgroundLoop: the loop of one Runtime (Note [Background loop] in
// background_loop.cc). It takes this rank's submissions from the queue,
// hands them to the exchange (hits) or the coordinator (the rest), feeds
// rank 0's coordinators, executes the log through the LogExecutor, and
// decides when it sleeps. It owns what only the loop touches: the turn
// (Note [Caller turns] in caller_turn.cc), the wake-up word, the exchange
// and, on rank 0, what the host leaders' messages do; the send storage; and
// its counters. RuntimeImpl owns the parts it uses (the queue, the process
// sets, the job's state, the log executor, the control plane) and runs
// Run() on its background thread.
//
// Threads: Run() on the background thread; TryTurn() on a caller thread,
// which then holds the loop's turn; what is marked "the turn" below belongs
// to whoever holds it, one thread at a time. Notify(), RequestShutdown(),
// waiters() and the counters: any thread.
#ifndef KOLO_RUNTIME_LOOP_BACKGROUND_LOOP_H_
#define KOLO_RUNTIME_LOOP_BACKGROUND_LOOP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kolo/options.h"
#include "runtime/api/work_state.h"
#include "runtime/control/control_plane.h"
#include "runtime/loop/hit_exchange.h"
#include "runtime/loop/job_state.h"
#include "runtime/loop/log_executor.h"
#include "runtime/loop/process_sets.h"
#include "runtime/loop/tensor_queue.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/negotiation/host_batch.h"
#include "runtime/negotiation/timeline.h"
#include "runtime/sync/mutex.h"
#include "runtime/sync/wakeup.h"
#include "runtime/util/logging.h"
#include "runtime/wire.pb.h"

namespace kolo {

class BackgroundLoop {
 public:
  // The parts the loop uses; each outlives it.
  struct Context {
    const Options* options = nullptr;
    Logger* logger = nullptr;
    Timeline* timeline = nullptr;
    TensorQueue* queue = nullptr;
    ProcessSets* sets = nullptr;
    JobState* job = nullptr;
    LogExecutor* log = nullptr;
    // Fails the job (RuntimeImpl::Fatal); any thread.
    std::function<void(const absl::Status&)> fatal;
  };
  explicit BackgroundLoop(Context context);

  // What Start chose for this job, once, before Run: the control plane
  // (null in a job of one), the exchange, on rank 0 what the host leaders'
  // messages do (null unless hosts relay), and the word the loop waits on
  // if the control plane has one in shared memory (null: its own).
  void Wire(ControlPlane* control, std::unique_ptr<HitExchange> exchange,
            std::unique_ptr<HostMessages> host_messages, Wakeup* doorbell);
  // Callers may take turns from now until Run ends.
  void Open();
  // The background thread's body: passes until the job's final list runs
  // or the job fails.
  void Run();

  // Wakes the loop. Any thread.
  void Notify() { wakeup_.load()->Notify(); }
  // Makes this rank ask to leave the job in the next pass. Any thread.
  void RequestShutdown();
  // Note [Caller turns]: after the caller queued `work` quietly, runs the
  // loop's turn on the calling thread if it can, else wakes the thread.
  void TryTurn(const internal::WorkState& work);
  // Callers blocked in Work::Wait on this runtime's collectives: the loop
  // spins only while this is non-zero (WorkState::SetWaitPolicy).
  const std::shared_ptr<std::atomic<int>>& waiters() const { return waiters_; }

  // The request lists this rank sent, its own or in a host's messages
  // (RuntimeStats::negotiation_messages_sent).
  int64_t messages_sent() const;
  // Adds the loop's counters and its exchange's (docs/tuning.md).
  void AddCounters(std::map<std::string, int64_t>* counters) const;

 private:
  // A rank that cannot reach the coordinator gives up this long after the
  // coordinator itself would have reported the request's timeout (each
  // entry's deadline counts from when its request is taken for sending: by
  // the background thread, or by a caller in its turn).
  static constexpr absl::Duration kLocalTimeoutSlack = absl::Seconds(2);

  // Note [Coalescing submissions]: waits for a burst to end.
  void CoalesceSubmissions();
  // The turn: sends this rank's new requests.
  void SendRequests(absl::Time now);
  // The turn: takes the control plane's messages (a host leader relays its
  // host's lists; rank 0's coordinators take the request lists; the others
  // hold the response lists for the exchange's log). Fails the job on an
  // error.
  void ReceiveEvents(absl::Time now, absl::Time* next_wakeup);
  // Who holds the turn: what a list made on rank 0 may run on depends on
  // it (Runner::CallerMayRun).
  enum class Turn { kThread, kCaller };
  // The turn, rank 0: each set's batching, checks and response list.
  void CoordinatorStep(Turn turn, absl::Time now, absl::Time* next_wakeup,
                       bool* done);
  void SendList(Turn turn, const std::shared_ptr<ProcessSetState>& set,
                const wire::ResponseList& list);
  // Rank 0: executes a list it made (if a member) and passes its marker.
  void RunMadeList(ProcessSetState& set, const wire::ResponseList& list);
  // The thread's turn, rank 0: executes the lists a caller made but could
  // not run (made_for_thread_), before anything else.
  void RunListsMadeForThread(bool* done);
  // Coordinator: tells every rank which ranks it still waits for at
  // shutdown, when that changed.
  void ReportShutdownWaiting(const Coordinator& global);
  // Note [Caller turns], holding turn_->mu: sends this rank's new requests
  // and executes its log (taking the control plane's messages when rung)
  // until `work` completes, the spin time passes or the thread must take
  // over. False if it took no turn (then the caller rings the thread).
  bool CallerTurn(const internal::WorkState& work);
  // CallerTurn's wait: executes the log as it comes (taking the control
  // plane's messages at each ring past `*epoch`, which it advances, and on
  // a host leader relaying its host's lists when `*relay_due` comes, which
  // it sets anew) until `work` completes, the spin time passes, the job
  // ends or fails, or the thread must take over (`*handed_back`, or a ring
  // on rank 0).
  void PollLog(const internal::WorkState& work, uint32_t* epoch,
               absl::Time* relay_due, bool* done, bool* handed_back);
  // Coordinator: one request list of rank `from` for its set; false after
  // Fatal (the rank is not in the set).
  bool AcceptRequestList(int from, wire::RequestList list, absl::Time now);
  // Coordinator: a host leader's message.
  bool AcceptHostRequests(int from, wire::HostRequests& message,
                          absl::Time now);
  void Fatal(const absl::Status& status) { fatal_(status); }
  bool failed() const { return job_.failed(); }

  const Options& options_;
  Logger& logger_;
  Timeline& timeline_;
  TensorQueue& queue_;
  ProcessSets& sets_;
  JobState& job_;
  LogExecutor& log_;
  const std::function<void(const absl::Status&)> fatal_;

  // Wakes the loop: own_wakeup_, or (set before the thread starts) the
  // control plane's doorbell in shared memory, which peers ring too (Note
  // [Control over shared memory] in control/shm_ring.h).
  Wakeup own_wakeup_;
  std::atomic<Wakeup*> wakeup_{&own_wakeup_};
  const std::shared_ptr<std::atomic<int>> waiters_ =
      std::make_shared<std::atomic<int>>(0);
  std::atomic<bool> shutdown_requested_{false};

  // Set by Wire.
  ControlPlane* control_ = nullptr;
  // Note [The exchange] (hit_exchange.h): how this rank's hits are ANDed
  // with the others' and its request lists sent, on this job's transport.
  // The turn; counters any thread.
  std::unique_ptr<HitExchange> exchange_;
  // Note [Host relay], rank 0: what the leaders' messages do. The turn.
  std::unique_ptr<HostMessages> host_messages_;

  // The turn only.
  bool shutdown_sent_ = false;
  // Rank 0: lists a caller's turn made (sent to the others, on the board
  // marked) but must leave to the thread to execute here, in the order
  // made; while any waits, no caller takes a turn.
  struct MadeList {
    std::shared_ptr<ProcessSetState> set;
    wire::ResponseList list;
  };
  std::vector<MadeList> made_for_thread_;
  // When the thread wakes unless rung (the deadline its last pass left): a
  // caller rings it for an earlier one its turn set.
  absl::Time thread_wakes_at_ = absl::InfinitePast();
  // SendRequests: per process set, the cache ids of one pass (storage kept
  // from pass to pass).
  std::map<int, std::vector<int64_t>> hits_to_send_;

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
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_BACKGROUND_LOOP_H_
