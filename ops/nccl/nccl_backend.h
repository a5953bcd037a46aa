// The NCCL backend: collectives on CUDA tensors (registered as "nccl" for
// DeviceType::kCuda, with ProbeCudaDevice as the device probe).
//
// See Note [NCCL backend] in nccl_backend.cc for streams, completion,
// the watchdog and errors; Note [Hierarchical allreduce] in hierarchical.cc.
#ifndef KOLO_OPS_NCCL_NCCL_BACKEND_H_
#define KOLO_OPS_NCCL_NCCL_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/loop/backend.h"

namespace kolo {
namespace nccl {

// Checks the device (ProbeCudaDevice), then builds the communicator(s)
// through context.store; blocks up to context.start_timeout. Runs on the
// runtime's background thread, at the same point on every rank of the set.
absl::StatusOr<std::unique_ptr<Backend>> CreateNcclBackend(
    const BackendContext& context);

}  // namespace nccl
}  // namespace kolo

#endif  // KOLO_OPS_NCCL_NCCL_BACKEND_H_
