// RuntimeImpl: owns everything one Runtime runs and wires it at Start: the
// store, the control plane, the process sets (ProcessSets: each set's
// backends, executors, response cache and, on rank 0, its coordinator),
// what it knows of the job (JobState), the tensor queue, what each entry
// of the log does (LogExecutor), the loop (BackgroundLoop, which owns the
// exchange) and the background thread that runs it.
//
// Threads: the public methods run on caller threads; the loop on the
// background thread, which negotiates and issues collectives; a caller in
// SubmitAndWait may do the same in the loop's turn (Note [Caller turns] in
// caller_turn.cc). Fatal() may run on a control-plane reader thread.
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
#include "runtime/loop/background_loop.h"
#include "runtime/loop/job_state.h"
#include "runtime/loop/log_executor.h"
#include "runtime/loop/process_sets.h"
#include "runtime/loop/tensor_queue.h"
#include "runtime/negotiation/timeline.h"
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
  void Notify() { loop_.Notify(); }
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

  // The job's error, the loop's end, the ranks a shutdown waits for.
  JobState job_;
  std::atomic<bool> accepting_{false};
  std::atomic<bool> stopped_{false};
  std::atomic<int64_t> process_set_calls_{0};
  // What this rank does with each entry of its log, on every transport
  // (the exchange's Runner); its control plane is set by Start.
  LogExecutor log_;
  // After the parts it uses. Wired by Start; run by thread_.
  BackgroundLoop loop_;
  std::thread thread_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_RUNTIME_IMPL_H_
