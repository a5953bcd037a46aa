// The default context behind kolo::torch's free functions (init(),
// allreduce(), ...; kolo/torch/context.h).
#include <memory>
#include <utility>
#include <vector>

#include "kolo/torch/context.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace torch {

namespace {

// The frontend's one default instance, for programs launched by kolorun.
struct DefaultInstance {
  Mutex mu;
  std::shared_ptr<Context> context KOLO_GUARDED_BY(mu);
  // init()s so far: the next one joins the job as that incarnation
  // (kolo::Options::incarnation), every rank counting alike, since they all
  // shut down and init again together.
  int64_t inits KOLO_GUARDED_BY(mu) = 0;
};

DefaultInstance& Default() {
  static auto* instance = new DefaultInstance;
  return *instance;
}

}  // namespace

void init() {
  absl::StatusOr<kolo::Options> options =
      kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) throw Error(options.status());
  init(*options);
}

void init(const kolo::Options& options) {
  DefaultInstance& d = Default();
  MutexLock lock(&d.mu);
  if (d.context) return;
  kolo::Options joining = options;
  // init() after shutdown() joins again, as the next incarnation; an
  // elastic job's generations keep its joins apart already.
  if (joining.incarnation == 0 && joining.elastic_id < 0) {
    joining.incarnation = d.inits;
  }
  ++d.inits;
  d.context = Context::Create(joining);
}

bool is_initialized() {
  DefaultInstance& d = Default();
  MutexLock lock(&d.mu);
  return d.context != nullptr;
}

void shutdown() {
  std::shared_ptr<Context> context;
  {
    DefaultInstance& d = Default();
    MutexLock lock(&d.mu);
    context = std::move(d.context);
    d.context = nullptr;
  }
  if (context) context->shutdown();
}

std::shared_ptr<Context> default_context() {
  DefaultInstance& d = Default();
  MutexLock lock(&d.mu);
  if (!d.context) {
    throw Error(absl::StatusCode::kFailedPrecondition,
                "kolo::torch::init() has not been called (or shutdown() was)");
  }
  return d.context;
}

int rank() { return default_context()->rank(); }
int size() { return default_context()->size(); }
int local_rank() { return default_context()->local_rank(); }
int local_size() { return default_context()->local_size(); }
int cross_rank() { return default_context()->cross_rank(); }
int cross_size() { return default_context()->cross_size(); }

Handle allreduce_async(const at::Tensor& t, const AllreduceOptions& o) {
  return default_context()->allreduce_async(t, o);
}
Handle allreduce_async_(const at::Tensor& t, const AllreduceOptions& o) {
  return default_context()->allreduce_async_(t, o);
}
at::Tensor allreduce(const at::Tensor& t, const AllreduceOptions& o) {
  return default_context()->allreduce(t, o);
}
at::Tensor allreduce_(const at::Tensor& t, const AllreduceOptions& o) {
  return default_context()->allreduce_(t, o);
}
Handle grouped_allreduce_async(const std::vector<at::Tensor>& t,
                               const GroupedAllreduceOptions& o) {
  return default_context()->grouped_allreduce_async(t, o);
}
Handle grouped_allreduce_async_(const std::vector<at::Tensor>& t,
                                const GroupedAllreduceOptions& o) {
  return default_context()->grouped_allreduce_async_(t, o);
}
std::vector<at::Tensor> grouped_allreduce(const std::vector<at::Tensor>& t,
                                          const GroupedAllreduceOptions& o) {
  return default_context()->grouped_allreduce(t, o);
}
std::vector<at::Tensor> grouped_allreduce_(const std::vector<at::Tensor>& t,
                                           const GroupedAllreduceOptions& o) {
  return default_context()->grouped_allreduce_(t, o);
}
Handle allgather_async(const at::Tensor& t, const AllgatherOptions& o) {
  return default_context()->allgather_async(t, o);
}
at::Tensor allgather(const at::Tensor& t, const AllgatherOptions& o) {
  return default_context()->allgather(t, o);
}
Handle broadcast_async(const at::Tensor& t, const BroadcastOptions& o) {
  return default_context()->broadcast_async(t, o);
}
Handle broadcast_async_(const at::Tensor& t, const BroadcastOptions& o) {
  return default_context()->broadcast_async_(t, o);
}
at::Tensor broadcast(const at::Tensor& t, const BroadcastOptions& o) {
  return default_context()->broadcast(t, o);
}
at::Tensor broadcast_(const at::Tensor& t, const BroadcastOptions& o) {
  return default_context()->broadcast_(t, o);
}
Handle alltoall_async(const at::Tensor& t, const AlltoallOptions& o) {
  return default_context()->alltoall_async(t, o);
}
at::Tensor alltoall(const at::Tensor& t, const AlltoallOptions& o) {
  return default_context()->alltoall(t, o);
}
Handle reducescatter_async(const at::Tensor& t, const ReducescatterOptions& o) {
  return default_context()->reducescatter_async(t, o);
}
at::Tensor reducescatter(const at::Tensor& t, const ReducescatterOptions& o) {
  return default_context()->reducescatter(t, o);
}
void barrier(int process_set, std::chrono::milliseconds timeout) {
  default_context()->barrier(process_set, timeout);
}
int join() { return default_context()->join(); }
int add_process_set(const std::vector<int>& ranks) {
  return default_context()->add_process_set(ranks);
}
std::vector<int> process_set_ranks(int process_set) {
  return default_context()->process_set_ranks(process_set);
}

}  // namespace torch
}  // namespace kolo
