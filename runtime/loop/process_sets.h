// ProcessSets: the process sets as this process sees them: which exist, who
// is in each, and each set's backends, executors, response cache and (on
// rank 0) coordinator. It owns them and the lock over them.
//
// Sets are created and dropped by the loop at negotiated points of the
// response order (every rank at the same point); the global set is
// created by Start() and never dropped. Caller threads look sets up for
// every submission; Close() may run on any thread (RuntimeImpl::Fatal).
#ifndef KOLO_RUNTIME_LOOP_PROCESS_SETS_H_
#define KOLO_RUNTIME_LOOP_PROCESS_SETS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kolo/options.h"
#include "kolo/store.h"
#include "runtime/loop/backend.h"
#include "runtime/loop/executor.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/negotiation/response_cache.h"
#include "runtime/negotiation/timeline.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/logging.h"

namespace kolo {

// One process set as seen by this process.
struct ProcessSetState {
  int id = 0;
  std::vector<int> ranks;  // global ranks, sorted
  int rank = -1;           // this process's rank in the set; -1: not a member
  // Members only (background thread). The CPU path is connected when the
  // set is; the CUDA path when the set's first CUDA response runs (on every
  // rank at the same point of the response order). Each executor is
  // declared after its backend, so that it goes first.
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Executor> executor;
  std::unique_ptr<Backend> cuda_backend;
  std::unique_ptr<Executor> cuda_executor;
  // The GPU this rank's CUDA tensors of the set are on: fixed by the first
  // one submitted (-1: none yet). Caller threads.
  std::atomic<int> cuda_device{-1};
  std::unique_ptr<ResponseCache> own_cache;
  ResponseCache* cache = nullptr;  // own_cache, or the coordinator's on rank 0
  int64_t executed_seq = 0;
  // Global rank 0 only: negotiation for the set.
  std::unique_ptr<Coordinator> coordinator;
  // Caller threads: numbers barriers so that every rank names them alike.
  std::atomic<int64_t> barriers{0};

  bool member() const { return rank >= 0; }
  int size() const { return static_cast<int>(ranks.size()); }
};

class ProcessSets {
 public:
  // What the sets' backends, executors and coordinators are made with.
  // Every pointer outlives the ProcessSets.
  struct Context {
    const Options* options = nullptr;
    const Logger* logger = nullptr;
    Timeline* timeline = nullptr;  // rank 0 marks it
    // A CPU collective's failure, made clearer before its Works see it
    // (RuntimeImpl::ExplainCollectiveFailure). Background thread.
    std::function<absl::Status(const absl::Status&)> explain_failure;
    // A device path's failure, which ends the job (RuntimeImpl::Fatal).
    std::function<void(const absl::Status&)> fatal;
  };
  explicit ProcessSets(Context context) : context_(std::move(context)) {}
  ProcessSets(const ProcessSets&) = delete;
  ProcessSets& operator=(const ProcessSets&) = delete;

  // Creates and connects the global set (every rank of the job), whose
  // backends rendezvous in `store`. Once, before any other call.
  absl::Status Start(std::shared_ptr<Store> store);
  // Creates set `id` of `ranks` (global ranks, sorted) and, on a member,
  // connects its CPU path: shared memory, shared memory within hosts and
  // gloo between them, or gloo (Note in process_sets.cc). The set exists
  // even if connecting failed. Background thread.
  absl::StatusOr<std::shared_ptr<ProcessSetState>> Create(
      int id, std::vector<int> ranks);
  // Drops set `id` and hands it back (its backends close with its last
  // reference); InvalidArgument for the global set or an unknown one.
  // Background thread.
  absl::StatusOr<std::shared_ptr<ProcessSetState>> Remove(int id);
  // The set's CUDA backend and executor on `device`, created on first use.
  // Background thread.
  absl::Status ConnectDevicePath(ProcessSetState& set, const Device& device);

  // The global set; after Start(), without the lock (it is never dropped).
  ProcessSetState& global() const { return *global_; }
  // The set, or null if unknown.
  std::shared_ptr<ProcessSetState> Find(int id) const;
  // Every set, by id (the global set first).
  std::map<int, std::shared_ptr<ProcessSetState>> All() const;
  // The set if this rank is a member; InvalidArgument naming `what` if the
  // set is unknown or this rank is not a member.
  absl::StatusOr<std::shared_ptr<ProcessSetState>> Member(
      int id, const std::string& what) const;
  // The same; errors name `op` "`name`" (built only on error: this runs for
  // every submission).
  absl::StatusOr<std::shared_ptr<ProcessSetState>> Member(
      int id, const char* op, const std::string& name) const;
  // Whether this rank is a member, with Member's errors. The global set is
  // answered without the lock: a step's every submission asks.
  absl::Status CheckMember(int id, const char* op,
                           const std::string& name) const {
    if (id == kGlobalProcessSet) return absl::OkStatus();
    return Member(id, op, name).status();
  }
  // The set's global ranks; NotFound if unknown.
  absl::StatusOr<std::vector<int>> Ranks(int id) const;

  // Makes every set's collectives return: closes the CPU backends, fails
  // what is queued on a device with `status` and closes the device
  // backends. Any thread.
  void Close(const absl::Status& status);
  // Destroys every set's device path, each executor before its backend
  // (whose destructor fails what is still queued on the device), while
  // what their reports reach still exists. At the runtime's end.
  void DestroyDevicePaths();

  // The executors' host buffers, in all.
  int64_t buffer_bytes() const;
  // The coordinators' counters ("coordinator.*"; zero off rank 0).
  void AddCounters(std::map<std::string, int64_t>* counters) const;

 private:
  // Each set rank's host identity, as published in RuntimeImpl::Start().
  absl::StatusOr<std::vector<std::string>> Hosts(
      const ProcessSetState& set) const;
  // What a backend of the set gets to connect with.
  BackendContext BackendContextOf(const ProcessSetState& set,
                                  const std::string& prefix) const;
  absl::Status Connect(ProcessSetState& set);

  const Context context_;
  std::shared_ptr<Store> store_;  // set by Start
  ProcessSetState* global_ = nullptr;
  mutable Mutex mu_;
  std::map<int, std::shared_ptr<ProcessSetState>> sets_ KOLO_GUARDED_BY(mu_);
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_PROCESS_SETS_H_
