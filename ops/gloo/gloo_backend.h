// The gloo backend: CPU collectives over gloo's TCP transport.
//
// gloo connects every pair of ranks (full mesh) through our Store; its
// traffic is not authenticated (docs/security.md) and its listeners bind to
// BackendContext::bind_addr only. Reductions use kolo's own kernels
// (ops/cpu): float16/bfloat16 pairs are combined in float and rounded back
// to 16 bits at each step of gloo's ring.
#ifndef KOLO_OPS_GLOO_GLOO_BACKEND_H_
#define KOLO_OPS_GLOO_GLOO_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/loop/backend.h"

namespace kolo {
namespace gloo_backend {

// Connects to every other rank; blocks up to context.start_timeout.
absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(
    const BackendContext& context);

}  // namespace gloo_backend
}  // namespace kolo

#endif  // KOLO_OPS_GLOO_GLOO_BACKEND_H_
