// kolo::torch: collectives on at::Tensor, on top of kolo's C++ API.
//
// A Context is one rank's membership in a kolo job (it owns or shares a
// kolo::Runtime). Programs normally use the default context through the free
// functions at the bottom (kolo::torch::init(), allreduce(), ...); tests and
// programs that run several ranks in one process create Contexts explicitly.
//
// Collectives: allreduce, grouped_allreduce, allgather, broadcast, alltoall,
// reducescatter (as in kolo/runtime.h), plus barrier and join. Each comes in
// up to three forms:
//   allreduce(t)         blocks and returns a new tensor with the result;
//   allreduce_(t)        blocks and writes the result into `t` (in place);
//   allreduce_async(t)   returns a Handle at once; Handle::wait() returns
//                        the result (allreduce_async_ writes into `t`).
// Every options struct has a process_set (0, the default, is the whole job;
// see add_process_set); ranks in options (a broadcast root) are ranks of the
// job, as in Horovod, and must be members of that set.
// Every collective is matched across ranks by its name. Give names
// (AllreduceOptions().name("loss")) when ranks may submit in different
// orders; otherwise a name is generated from a per-Context, per-collective
// counter ("allreduce.noname.7"; "allreduce.noname.set2.7" in process set
// 2), which matches across ranks only if every rank of the set submits that
// collective the same number of times in the same order.
//
// Tensors: dense CPU tensors of dtype uint8, int8, int16, int32, int64,
// float16, bfloat16, float32 or float64 (and bool, which broadcast, allgather
// and alltoall move but nothing reduces), any shape (0-dim and empty included),
// any strides (non-contiguous tensors are sent through a contiguous copy;
// in-place results are copied back). CUDA tensors are passed to the runtime on
// their device with an event recorded on the current stream: the collective
// runs on the runtime's own stream once the work queued before the call is done
// (the caller never blocks), and a Handle completes once the result is
// written. They need a runtime built with the NCCL backend (docs/gpu.md).
// Until its Handle completes, an async collective owns the tensor's memory:
// do not read or write it.
//
// Errors: every failure (a bad argument here, or an error of the runtime such
// as a shape mismatch across ranks, a timeout or a lost rank) is thrown as
// kolo::torch::Error, whose what() is the runtime's message unchanged and
// whose code() is the runtime's absl::StatusCode.
//
// Threads: all methods may be called from any thread.
#ifndef KOLO_TORCH_CONTEXT_H_
#define KOLO_TORCH_CONTEXT_H_

#include <ATen/ATen.h>
#include <torch/arg.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "kolo/options.h"
#include "kolo/runtime.h"
#include "kolo/types.h"

namespace kolo {
namespace torch {

// What every function of kolo::torch throws.
class Error : public std::runtime_error {
 public:
  // what() is status.message(), unchanged.
  explicit Error(const absl::Status& status);
  Error(absl::StatusCode code, const std::string& message);
  // A collective's outcome (Handle::wait, synchronize, a blocking call's
  // collective), as opposed to a request refused before it ran.
  struct Outcome {};
  Error(const absl::Status& status, Outcome);
  absl::StatusCode code() const { return code_; }
  // Whether this is a collective's outcome (else: a refused request).
  bool outcome() const { return outcome_; }

 private:
  absl::StatusCode code_;
  bool outcome_ = false;
};

struct AllreduceOptions {
  // "" = generated (see the file comment).
  TORCH_ARG(std::string, name);
  // Average (Horovod's default) is for floating-point tensors; integer
  // tensors need Sum, Min, Max or Product.
  TORCH_ARG(ReduceOp, op) = ReduceOp::kAverage;
  // result = postscale * op(prescale * input_r). Floating point only.
  TORCH_ARG(double, prescale) = 1.0;
  TORCH_ARG(double, postscale) = 1.0;
  TORCH_ARG(int, process_set) = kGlobalProcessSet;
  // How long the collective waits for the other ranks of the set to submit
  // it before it fails naming them; 0: the job's op timeout
  // (KOLO_OP_TIMEOUT). As kolo::AllreduceRequest::timeout.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

// The tensors of a grouped allreduce are negotiated as one unit (all or
// none: one bad member fails the whole group on every rank) and fused.
struct GroupedAllreduceOptions {
  // The group's name; members are named "<name>.<index>" unless `names`
  // gives one name per tensor.
  TORCH_ARG(std::string, name);
  TORCH_ARG(std::vector<std::string>, names);
  TORCH_ARG(ReduceOp, op) = ReduceOp::kAverage;
  TORCH_ARG(double, prescale) = 1.0;
  TORCH_ARG(double, postscale) = 1.0;
  TORCH_ARG(int, process_set) = kGlobalProcessSet;
  // As AllreduceOptions::timeout.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

struct AllgatherOptions {
  TORCH_ARG(std::string, name);
  TORCH_ARG(int, process_set) = kGlobalProcessSet;
  // As AllreduceOptions::timeout.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

struct BroadcastOptions {
  TORCH_ARG(std::string, name);
  TORCH_ARG(int, root) = 0;
  TORCH_ARG(int, process_set) = kGlobalProcessSet;
  // As AllreduceOptions::timeout.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

struct AlltoallOptions {
  TORCH_ARG(std::string, name);
  // splits[k] rows of the input go to rank k of the set; empty = the first
  // dimension split equally (it must then be divisible by the set size).
  TORCH_ARG(std::vector<int64_t>, splits);
  TORCH_ARG(int, process_set) = kGlobalProcessSet;
  // As AllreduceOptions::timeout.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

struct ReducescatterOptions {
  TORCH_ARG(std::string, name);
  TORCH_ARG(ReduceOp, op) = ReduceOp::kAverage;
  TORCH_ARG(double, prescale) = 1.0;
  TORCH_ARG(double, postscale) = 1.0;
  TORCH_ARG(int, process_set) = kGlobalProcessSet;
  // As AllreduceOptions::timeout.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

namespace detail {
struct PendingOp;
}  // namespace detail

// The completion handle of an asynchronous collective. Cheap to copy; all
// copies refer to the same collective.
class Handle {
 public:
  Handle() = default;  // Refers to nothing: wait() throws.

  // Non-blocking: true once the collective has finished, successfully or
  // not (wait() then returns or throws at once).
  bool poll() const;

  // Blocks until the collective finishes (the runtime's op timeout bounds
  // it) and returns its result: the new tensor, or for an in-place
  // collective the caller's tensor. Throws Error if it failed. May be called
  // again (returns the same tensor or throws the same error). For a grouped
  // allreduce: the first tensor's result (see wait_all).
  at::Tensor wait() const;

  // Like wait(), returning every result: one per tensor of a grouped
  // allreduce, one for the other collectives.
  std::vector<at::Tensor> wait_all() const;

  // Blocks until the collective has finished, without spinning
  // (kolo::Work::WaitQuietly), and neither throws nor finishes it: wait()
  // then returns (or throws) at once. For helper threads.
  void block() const;

  // Allgather and alltoall, once completed: the rows received from each
  // rank of the set, in rank order. Empty otherwise.
  std::vector<int64_t> received_splits() const;

  // The name the collective was negotiated under.
  const std::string& name() const;

  explicit Handle(std::shared_ptr<detail::PendingOp> op) : op_(std::move(op)) {}

 private:
  std::shared_ptr<detail::PendingOp> op_;
};

class Context {
 public:
  // Joins a job (blocks up to options.start_timeout). Throws Error.
  static std::shared_ptr<Context> Create(const kolo::Options& options);
  // Joins the job described by the KOLO_* environment kolorun sets.
  static std::shared_ptr<Context> FromEnvironment();

  // Uses a Runtime that has joined a job already (e.g. one of several
  // Runtimes of a test running ranks as threads). A Runtime whose last
  // reference goes away without shutdown() aborts (see kolo::Runtime).
  explicit Context(std::shared_ptr<kolo::Runtime> runtime);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  int cross_rank() const;
  int cross_size() const;
  kolo::Runtime& runtime() { return *runtime_; }

  Handle allreduce_async(const at::Tensor& tensor,
                         const AllreduceOptions& options = {});
  Handle allreduce_async_(const at::Tensor& tensor,
                          const AllreduceOptions& options = {});
  at::Tensor allreduce(const at::Tensor& tensor,
                       const AllreduceOptions& options = {});
  at::Tensor allreduce_(const at::Tensor& tensor,
                        const AllreduceOptions& options = {});

  // Concatenates every rank's tensor along the first dimension, in rank
  // order; the first dimension may differ between ranks, the others not.
  Handle allgather_async(const at::Tensor& tensor,
                         const AllgatherOptions& options = {});
  at::Tensor allgather(const at::Tensor& tensor,
                       const AllgatherOptions& options = {});

  // Every rank gets root's values (shapes and dtypes must agree).
  Handle broadcast_async(const at::Tensor& tensor,
                         const BroadcastOptions& options = {});
  Handle broadcast_async_(const at::Tensor& tensor,
                          const BroadcastOptions& options = {});
  at::Tensor broadcast(const at::Tensor& tensor,
                       const BroadcastOptions& options = {});
  at::Tensor broadcast_(const at::Tensor& tensor,
                        const BroadcastOptions& options = {});

  // Root's `bytes` on every rank (the length may differ between ranks: only
  // root's matters). Two broadcasts: the length, then the bytes.
  std::string broadcast_bytes(const std::string& bytes,
                              const BroadcastOptions& options = {});

  Handle grouped_allreduce_async(const std::vector<at::Tensor>& tensors,
                                 const GroupedAllreduceOptions& options = {});
  Handle grouped_allreduce_async_(const std::vector<at::Tensor>& tensors,
                                  const GroupedAllreduceOptions& options = {});
  std::vector<at::Tensor> grouped_allreduce(
      const std::vector<at::Tensor>& tensors,
      const GroupedAllreduceOptions& options = {});
  std::vector<at::Tensor> grouped_allreduce_(
      const std::vector<at::Tensor>& tensors,
      const GroupedAllreduceOptions& options = {});

  // Sends splits[k] rows to rank k and returns what every rank sent this
  // one, concatenated in rank order (Handle::received_splits() tells how
  // many rows came from each).
  Handle alltoall_async(const at::Tensor& tensor,
                        const AlltoallOptions& options = {});
  at::Tensor alltoall(const at::Tensor& tensor,
                      const AlltoallOptions& options = {});

  // Reduces the tensor (same shape on every rank) and returns this rank's
  // share of the first dimension (kolo::ReducescatterShape).
  Handle reducescatter_async(const at::Tensor& tensor,
                             const ReducescatterOptions& options = {});
  at::Tensor reducescatter(const at::Tensor& tensor,
                           const ReducescatterOptions& options = {});

  // Blocks until every rank of the set has called barrier(); `timeout` as
  // AllreduceOptions::timeout.
  void barrier(
      int process_set = kGlobalProcessSet,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  // This rank has no more data (see kolo::Runtime::Join): until every rank
  // has joined it contributes zeros to the others' sum/average allreduces.
  // Blocks until all have joined; returns the rank that joined last.
  int join();

  // Creates a process set of these global ranks (sorted, distinct) and
  // returns its id. Collective: every rank of the job calls it with the
  // same ranks, members or not.
  int add_process_set(const std::vector<int>& ranks);
  // Creates a process set of these global ranks, called by its members
  // only, all with the same `key` (kolo::Runtime::AddMemberProcessSet).
  int add_member_process_set(const std::vector<int>& ranks,
                             const std::string& key);
  // Removes a process set (collective, as add_process_set).
  void remove_process_set(int process_set);
  // Global ranks of a process set. Throws Error for an unknown id.
  std::vector<int> process_set_ranks(int process_set) const;

  // Completes submitted collectives (up to `timeout`) and leaves the job
  // together with the other ranks. Throws Error if that failed.
  void shutdown(absl::Duration timeout = absl::Seconds(60));

 private:
  enum Collective {
    kAllreduce,
    kGroupedAllreduce,
    kAllgather,
    kBroadcast,
    kAlltoall,
    kReducescatter,
    kNumCollectives
  };
  std::string NameFor(Collective collective, const std::string& given,
                      int process_set);
  Handle Allreduce(const at::Tensor& tensor, const AllreduceOptions& options,
                   bool in_place);
  // allreduce (in_place: allreduce_) through
  // kolo::Runtime::AllreduceAndWait: a small tensor's allreduce may run on
  // the calling thread. A refused request throws the Error allreduce_async
  // would have thrown; a failed collective the one Handle::wait would have
  // thrown (Error::outcome()).
  at::Tensor AllreduceBlocking(const at::Tensor& tensor,
                               const AllreduceOptions& options, bool in_place);
  // The pending op and request of an allreduce (Allreduce,
  // AllreduceBlocking).
  std::shared_ptr<detail::PendingOp> AllreduceOp(
      const at::Tensor& tensor, const AllreduceOptions& options, bool in_place,
      kolo::AllreduceRequest* request);
  Handle Broadcast(const at::Tensor& tensor, const BroadcastOptions& options,
                   bool in_place);
  Handle GroupedAllreduce(const std::vector<at::Tensor>& tensors,
                          const GroupedAllreduceOptions& options,
                          bool in_place);
  // Submits through `submit` and keeps `op` (and so its tensors) alive until
  // the collective completes, even if the caller drops the Handle.
  template <typename Submit>
  Handle Track(std::shared_ptr<detail::PendingOp> op, Submit submit);

  std::shared_ptr<kolo::Runtime> runtime_;
  std::atomic<bool> shut_down_{false};
  // The collectives in flight and the counters of generated names, under
  // their own lock (context.cc).
  struct Tracking;
  const std::unique_ptr<Tracking> tracking_;
};

// --- The default context: one per process, for programs launched by kolorun.

// Joins the job from the KOLO_* environment (kolorun sets it). Does nothing if
// the default context exists already. Throws Error.
void init();
// Joins the job described by `options`.
void init(const kolo::Options& options);
bool is_initialized();
// Shuts the default context down (see Context::shutdown); init() may be
// called again afterwards. Does nothing if not initialised.
void shutdown();
// The default context; throws Error (FailedPrecondition) before init().
std::shared_ptr<Context> default_context();

int rank();
int size();
int local_rank();
int local_size();
int cross_rank();
int cross_size();

Handle allreduce_async(const at::Tensor& tensor,
                       const AllreduceOptions& options = {});
Handle allreduce_async_(const at::Tensor& tensor,
                        const AllreduceOptions& options = {});
at::Tensor allreduce(const at::Tensor& tensor,
                     const AllreduceOptions& options = {});
at::Tensor allreduce_(const at::Tensor& tensor,
                      const AllreduceOptions& options = {});
Handle allgather_async(const at::Tensor& tensor,
                       const AllgatherOptions& options = {});
at::Tensor allgather(const at::Tensor& tensor,
                     const AllgatherOptions& options = {});
Handle broadcast_async(const at::Tensor& tensor,
                       const BroadcastOptions& options = {});
Handle broadcast_async_(const at::Tensor& tensor,
                        const BroadcastOptions& options = {});
at::Tensor broadcast(const at::Tensor& tensor,
                     const BroadcastOptions& options = {});
at::Tensor broadcast_(const at::Tensor& tensor,
                      const BroadcastOptions& options = {});
Handle grouped_allreduce_async(const std::vector<at::Tensor>& tensors,
                               const GroupedAllreduceOptions& options = {});
Handle grouped_allreduce_async_(const std::vector<at::Tensor>& tensors,
                                const GroupedAllreduceOptions& options = {});
std::vector<at::Tensor> grouped_allreduce(
    const std::vector<at::Tensor>& tensors,
    const GroupedAllreduceOptions& options = {});
std::vector<at::Tensor> grouped_allreduce_(
    const std::vector<at::Tensor>& tensors,
    const GroupedAllreduceOptions& options = {});
Handle alltoall_async(const at::Tensor& tensor,
                      const AlltoallOptions& options = {});
at::Tensor alltoall(const at::Tensor& tensor,
                    const AlltoallOptions& options = {});
Handle reducescatter_async(const at::Tensor& tensor,
                           const ReducescatterOptions& options = {});
at::Tensor reducescatter(const at::Tensor& tensor,
                         const ReducescatterOptions& options = {});
void barrier(int process_set = kGlobalProcessSet,
             std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
int join();
int add_process_set(const std::vector<int>& ranks);
std::vector<int> process_set_ranks(int process_set);

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_TORCH_CONTEXT_H_
