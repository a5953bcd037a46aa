// Runtime: kolo's public entry point.
//
// A Runtime joins a job of `size` ranks, then accepts asynchronous
// collectives from any thread. Each collective is identified by its name: the
// ranks may submit collectives in different orders; a background thread
// negotiates (through the coordinator, rank 0) which ones every rank has
// submitted, fuses compatible ones and runs them in one agreed order.
//
// Threads: every method may be called from any thread. Submitting never
// blocks on the network. Memory passed in a request must stay valid until
// its Work completes.
//
// Errors: InvalidArgument for bad or mismatched requests (the message names
// the tensor, the ranks and their values), DeadlineExceeded for timeouts,
// Unavailable when a peer is lost (naming the rank), Aborted for work
// pending at Shutdown/Abort, FailedPrecondition after shutdown.
//
// No process-wide state: several Runtimes can live in one process.
#ifndef KOLO_RUNTIME_H_
#define KOLO_RUNTIME_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/options.h"
#include "kolo/tensor.h"
#include "kolo/types.h"
#include "kolo/work.h"

namespace kolo {

// Every request names a process set: 0 (kGlobalProcessSet) is the whole
// job; others come from Options::process_sets or AddProcessSet(). Ranks in
// requests (broadcast root) are ranks of the job, as in Horovod; a root
// that is not a member of the set fails on every rank of the set, naming
// the set's ranks.
constexpr int kGlobalProcessSet = 0;

struct AllreduceRequest {
  std::string name;  // Unique among this rank's in-flight collectives.
  TensorView input;
  TensorView output;  // Same dtype/shape as input; may alias input.
  ReduceOp op = ReduceOp::kSum;
  // result = postscale * reduce(prescale * input_r). kAverage divides by
  // the number of ranks that contributed (a scale factor like the others).
  // Integer tensors are scaled as Horovod scales them: each scaling in
  // double, truncated toward zero to the integer type and clamped to its
  // range (an integer average of 1 and 2 is 1); on CUDA tensors integers
  // take neither kAverage nor scale factors. bool is not reduced.
  double prescale = 1.0;
  double postscale = 1.0;
  int process_set = kGlobalProcessSet;
  // How long this request waits for the other ranks of its set to submit
  // theirs before it fails with DeadlineExceeded naming the ranks that did
  // not; zero: the job's op timeout (Options::op_timeout). Where ranks give
  // different timeouts the shortest counts. It does not bound the transfer
  // itself once every rank has submitted (the op timeout does).
  absl::Duration timeout = absl::ZeroDuration();
};

struct BroadcastRequest {
  std::string name;
  TensorView tensor;  // Read on `root`, overwritten on every other rank.
  int root = 0;       // Rank of the job (a member of the process set).
  int process_set = kGlobalProcessSet;
  absl::Duration timeout = absl::ZeroDuration();  // As AllreduceRequest's.
};

// Called by the runtime (on its background thread, or on a thread in a
// blocking call) once the output shape is known; returns memory for at
// least prod(shape) elements of the request's dtype, on the request's
// device, that stays valid until the Work completes. An error it returns,
// or an exception it throws, fails that collective's Work with a message
// naming the tensor; the job goes on.
using OutputAllocator =
    std::function<absl::StatusOr<void*>(const std::vector<int64_t>& shape)>;

struct AllgatherRequest {
  std::string name;
  TensorView input;  // The first dimension may differ between ranks.
  OutputAllocator allocator;
  int process_set = kGlobalProcessSet;
  absl::Duration timeout = absl::ZeroDuration();  // As AllreduceRequest's.
};

// Rank r sends rows [sum(splits[0..k)), sum(splits[0..k])) of its input to
// rank k and receives, in rank order, what every rank sends it. The output
// (allocated once the sizes are known) has sum over r of splits_r[me] rows;
// Work::received_splits() reports the rows received from each rank.
struct AlltoallRequest {
  std::string name;
  TensorView input;
  std::vector<int64_t> splits;  // One entry per rank; empty = equal split.
  OutputAllocator allocator;
  int process_set = kGlobalProcessSet;
  absl::Duration timeout = absl::ZeroDuration();  // As AllreduceRequest's.
};

// Reduces the input (same shape on every rank) and leaves rank k with its
// share of the first dimension: rows are split as evenly as possible, the
// first (rows % size) ranks getting one extra row (ReducescatterShape).
struct ReducescatterRequest {
  std::string name;
  TensorView input;
  TensorView output;  // ReducescatterShape(input.shape, set size, set rank).
  ReduceOp op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int process_set = kGlobalProcessSet;
  absl::Duration timeout = absl::ZeroDuration();  // As AllreduceRequest's.
};

// The output shape of rank `rank` of `size` in a reducescatter of `input`.
std::vector<int64_t> ReducescatterShape(const std::vector<int64_t>& input,
                                        int size, int rank);

// What one Runtime has done, in terms of its public API. These fields keep
// their names and meanings; Runtime::Counters() has the finer counters of
// kolo's mechanisms, which may change between releases.
struct RuntimeStats {
  // Tensors whose collective ran on this rank, and the collectives they
  // ran in (fewer where tensors were fused).
  int64_t tensors_executed = 0;
  int64_t collectives_executed = 0;
  // Negotiation messages this rank sent, and those it received: in steady
  // state a step of many tensors takes one or none of each.
  int64_t negotiation_messages_sent = 0;
  int64_t negotiation_messages_received = 0;
  // Host memory of the staging buffers (fusion, allgather/alltoall
  // packing) this rank holds: allocated once, grown to the largest
  // collective that needed one, reused.
  int64_t host_buffer_bytes = 0;
};

// What a blocking collective (Runtime::AllreduceAndWait) returns.
struct BlockingResult {
  // False: the request was refused before it was queued, and `status` is
  // the error Allreduce() would have returned. True: `status` is what
  // Work::Wait() would have returned.
  bool submitted = false;
  absl::Status status;

  bool ok() const { return status.ok(); }
};

class RuntimeImpl;

class Runtime {
 public:
  // Joins the job: rendezvous, control channel, data-plane contexts. Blocks
  // up to options.start_timeout. If SIGPIPE has its default disposition it
  // is set to ignored, so that a write to a dead peer fails with an error
  // instead of killing the process.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(
      const Options& options);

  // Options from the process environment (KOLO_* variables); InvalidArgument
  // naming the variable for a bad value.
  static absl::StatusOr<Options> OptionsFromEnvironment();

  ~Runtime();  // Abort() unless Shutdown() was called.
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const;
  int size() const;
  int local_rank() const;
  int local_size() const;
  int cross_rank() const;
  int cross_size() const;
  // The options the runtime runs with (bind address, timeouts, ...).
  const Options& options() const;

  absl::StatusOr<Work> Allreduce(const AllreduceRequest& request);
  absl::StatusOr<Work> Broadcast(const BroadcastRequest& request);
  absl::StatusOr<Work> Allgather(const AllgatherRequest& request);
  absl::StatusOr<Work> Alltoall(const AlltoallRequest& request);
  absl::StatusOr<Work> Reducescatter(const ReducescatterRequest& request);

  // Allreduce(request), then Wait(timeout) on its Work: a blocking
  // allreduce, with the lowest latency for a small tensor. While no other
  // collective is in flight on this rank, on one host, a cached request
  // (any name submitted before) runs on the calling thread instead of
  // being handed to the background thread and back. The result says
  // whether the request was queued, and what Allreduce (not queued) or
  // Wait (queued) returned. A finite `timeout` that passes leaves the
  // collective in flight, using the request's buffers until it completes,
  // with no Work to tell when: where a wait may time out and the program
  // goes on, use Allreduce and Work::Wait.
  BlockingResult AllreduceAndWait(
      const AllreduceRequest& request,
      absl::Duration timeout = absl::InfiniteDuration());

  // Submits each request as its own allreduce, exactly as calling
  // Allreduce() for each in turn would (each is negotiated, fused and
  // completed on its own: unlike GroupedAllreduce there is no all-or-none
  // negotiation), with less work per tensor: one call, one look-up of the
  // process set, one lock of the queue and at most one wake-up of the
  // background thread for all of them (CUDA tensors: a set look-up each),
  // and the completion state of all in one allocation. For a burst of tensors
  // ready at once, e.g. a step's gradients. All or none are submitted: a
  // bad request, a name already in flight or a name given twice fails the
  // call with the error Allreduce() would give (naming the tensor) and
  // submits nothing. Returns requests[i]'s Work at [i]; an empty batch
  // submits nothing and returns no Works.
  absl::StatusOr<std::vector<Work>> AllreduceBatch(
      const std::vector<AllreduceRequest>& requests);

  // Allreduces every tensor of `requests` as one unit: negotiated together
  // (all or none: one bad member fails the whole group on every rank) and
  // fused together where compatible. One Work for the group. All members
  // must name the same process set.
  absl::StatusOr<Work> GroupedAllreduce(
      const std::vector<AllreduceRequest>& requests);

  // Completes once every rank of the set has called Barrier. `timeout` as
  // AllreduceRequest's (zero: the job's op timeout).
  absl::StatusOr<Work> Barrier(int process_set = kGlobalProcessSet,
                               absl::Duration timeout = absl::ZeroDuration());

  // For uneven data: this rank has no more batches. Until every rank has
  // joined, it contributes zeros to the sum/average allreduces the others
  // submit (Average then divides by the number of ranks that contributed,
  // or by the world size with Options::join_average_over_set_size). Other
  // collectives fail with FailedPrecondition while a rank has joined.
  // Blocks until every rank has joined (up to the op timeout) and returns
  // the rank that joined last, the same on every rank. Global set only.
  absl::StatusOr<int> Join();

  // Creates a process set of `ranks` (sorted, distinct, global ranks).
  // Collective: every rank of the job calls it with the same ranks, also
  // ranks outside the set. Returns the set's id.
  absl::StatusOr<int> AddProcessSet(const std::vector<int>& ranks);
  // Creates a process set of `ranks` (sorted, distinct, global ranks) called
  // by its members only, e.g. for torch.distributed's new_group(), which
  // calls the backend on member ranks alone. Every member passes the same
  // ranks and the same `key`, a name for the set unique in the job (two
  // sets created at once need different keys); ranks outside the set do
  // nothing, and learn of the set from the coordinator. Returns the set's
  // id. A member that never calls it leaves the others waiting up to
  // KOLO_OP_TIMEOUT; the error names it.
  absl::StatusOr<int> AddMemberProcessSet(const std::vector<int>& ranks,
                                          const std::string& key);
  // Removes a process set created by AddProcessSet (not the global one).
  // Collective like AddProcessSet: every rank calls it. Collectives of the
  // set still pending fail with Aborted; the set's id is not reused.
  absl::Status RemoveProcessSet(int process_set);
  // Global ranks of a process set; NotFound for an unknown id.
  absl::StatusOr<std::vector<int>> ProcessSetRanks(int process_set) const;

  // Chrome-trace timeline written by rank 0 (also KOLO_TIMELINE). Only
  // rank 0 writes; on other ranks these are no-ops.
  // `mark_cycles`: a CYCLE_START marker for each pass of the background
  // loop (as Horovod's mark_cycles).
  absl::Status StartTimeline(const std::string& path, bool mark_cycles = false);
  absl::Status StopTimeline();

  RuntimeStats stats() const;
  // The counters of kolo's mechanisms (how requests were negotiated, how
  // the background loop ran, with Options::phase_times where its time
  // went), by name, for tuning and diagnostics in the way of LevelDB's
  // GetProperty: docs/tuning.md lists them. Unlike RuntimeStats their names
  // and meanings may change between releases.
  std::map<std::string, int64_t> Counters() const;
  // One of them; NotFound naming `name` for a name Counters() lacks.
  absl::StatusOr<int64_t> Counter(const std::string& name) const;

  // OK while the job runs; after a fatal error (a lost rank, an op timeout,
  // a failed collective) that error, with its payloads (LostRank() in
  // kolo/work.h), as every later request fails with it too.
  absl::Status status() const;

  // Completes all submitted work (waiting up to `timeout`), then leaves the
  // job together with the other ranks. Work still pending when the timeout
  // passes fails with Aborted. Later calls return FailedPrecondition.
  absl::Status Shutdown(absl::Duration timeout = absl::Seconds(60));

  // Fails all pending work with Aborted and closes every connection now.
  void Abort();

 private:
  explicit Runtime(std::shared_ptr<RuntimeImpl> impl);
  // Shared with the background thread, which may outlive Abort() while it
  // is stuck inside a collective.
  std::shared_ptr<RuntimeImpl> impl_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_H_
