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

#include <functional>
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

struct AllreduceRequest {
  std::string name;     // Unique among this rank's in-flight collectives.
  TensorView input;
  TensorView output;    // Same dtype/shape as input; may alias input.
  ReduceOp op = ReduceOp::kSum;
  // result = postscale * reduce(prescale * input_r). Floating point only
  // unless both are 1.
  double prescale = 1.0;
  double postscale = 1.0;
};

struct BroadcastRequest {
  std::string name;
  TensorView tensor;  // Read on `root`, overwritten on every other rank.
  int root = 0;
};

// Called on the background thread once the output shape is known; returns
// memory for at least prod(shape) elements of the request's dtype, on the
// request's device, that stays valid until the Work completes.
using OutputAllocator =
    std::function<absl::StatusOr<void*>(const std::vector<int64_t>& shape)>;

struct AllgatherRequest {
  std::string name;
  TensorView input;  // The first dimension may differ between ranks.
  OutputAllocator allocator;
};

class RuntimeImpl;

class Runtime {
 public:
  // Joins the job: rendezvous, control channel, data-plane contexts. Blocks
  // up to options.start_timeout.
  static absl::StatusOr<std::unique_ptr<Runtime>> Create(const Options& options);

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

  absl::StatusOr<Work> Allreduce(const AllreduceRequest& request);
  absl::StatusOr<Work> Broadcast(const BroadcastRequest& request);
  absl::StatusOr<Work> Allgather(const AllgatherRequest& request);

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
