// LogExecutor: what this rank does with each entry of its log (Note [The
// exchange] in hit_exchange.h): a response list of a process set, or one of
// the board's records of ids whose bits every rank set. For each response
// it rebuilds what came as cache ids, takes the entries it names from the
// queue (zeros for a rank that joined), applies the response to the set's
// cache, runs the collective on the set's executor (the CUDA one for CUDA
// tensors, connected on first use) and recycles the entries; at the
// negotiated responses it creates and drops process sets. It is the
// exchanges' HitExchange::Runner, and rank 0 runs the lists it makes
// through it too.
//
// Threads: whoever holds the loop's turn (Note [Caller turns] in
// caller_turn.cc); counters are read by any thread.
#ifndef KOLO_RUNTIME_LOOP_LOG_EXECUTOR_H_
#define KOLO_RUNTIME_LOOP_LOG_EXECUTOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "kolo/options.h"
#include "runtime/control/control_plane.h"
#include "runtime/control/hit_board.h"
#include "runtime/loop/hit_exchange.h"
#include "runtime/loop/job_state.h"
#include "runtime/loop/process_sets.h"
#include "runtime/loop/tensor_queue.h"
#include "runtime/wire.pb.h"

namespace kolo {

class LogExecutor final : public HitExchange::Runner {
 public:
  struct Counters {
    std::atomic<int64_t> response_lists_received{0}, collectives_executed{0},
        tensors_executed{0}, board_records_executed{0};
    // Options::phase_times (the "phase.*" counters).
    std::atomic<int64_t> prepare_ns{0}, collective_ns{0}, complete_ns{0},
        recycle_ns{0};
  };
  // `fatal` fails the job; `explain` makes a failed collective's error
  // clearer (RuntimeImpl::ExplainCollectiveFailure). Every pointer
  // outlives this.
  LogExecutor(const Options& options, ProcessSets* sets, TensorQueue* queue,
              const JobState* job,
              std::function<void(const absl::Status&)> fatal,
              std::function<absl::Status(const absl::Status&)> explain);
  // The job's control plane, told when the final list runs; once, before
  // the log runs (none in a job of one).
  void set_control(ControlPlane* control) { control_ = control; }

  // --- HitExchange::Runner.
  bool IsMember(int process_set) override;
  void ExecuteList(int process_set, const wire::ResponseList& list) override;
  bool ExecuteIds(const HitBoardShared::Record& record,
                  int64_t fusion_threshold_bytes, bool caller) override;
  bool CallerMayRun(const wire::ResponseList& list) override;
  bool failed() override { return job_->failed(); }
  void Fatal(const absl::Status& status) override { fatal_(status); }

  // Runs a response list of `set` (a member); `made_here`: rank 0 made it,
  // and its coordinator applied the cache changes already.
  void ExecuteList(ProcessSetState& set, const wire::ResponseList& list,
                   bool made_here);
  // This rank sent its join: until the join's response, it contributes
  // zeros to the allreduces it did not submit.
  void Joined() { joined_ = true; }

  const Counters& counters() const { return counters_; }

 private:
  // `cached`: compact's cached responses in the order of its ids, where
  // the caller has looked them up (the board's records), else null.
  void ExecuteResponse(ProcessSetState& set, const wire::Response& compact,
                       bool apply_cache,
                       const wire::Response* const* cached = nullptr);
  // At the negotiated removal: drops the set and fails its pending work
  // (its backend closes with its last reference).
  absl::Status RemoveSet(int id);

  const Options& options_;
  ProcessSets* const sets_;
  TensorQueue* const queue_;
  ControlPlane* control_ = nullptr;
  const JobState* const job_;
  const std::function<void(const absl::Status&)> fatal_;
  const std::function<absl::Status(const absl::Status&)> explain_;
  bool joined_ = false;
  Counters counters_;
  // Storage kept from one response (or record) to the next: a response
  // that travelled as cache ids, rebuilt; a record's cached responses and
  // one fusion bucket of them.
  wire::Response expanded_;
  std::vector<const wire::Response*> singles_, bucket_;
  wire::Response bucket_response_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_LOG_EXECUTOR_H_
