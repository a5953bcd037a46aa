// Building a gloo context (full mesh over TCP) through kolo's Store. Used by
// the gloo backend and by kolo_bench's plain-gloo baseline.
#ifndef KOLO_OPS_GLOO_GLOO_CONTEXT_H_
#define KOLO_OPS_GLOO_GLOO_CONTEXT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gloo/context.h"
#include "kolo/store.h"

namespace kolo {
namespace gloo_backend {

// Connects `rank` to every other rank of `size`; gloo's listener binds to
// `bind_addr`. Blocks up to `start_timeout`; collectives on the context then
// time out after `op_timeout`.
absl::StatusOr<std::shared_ptr<::gloo::Context>> ConnectGlooContext(
    int rank, int size, std::shared_ptr<Store> store,
    const std::string& bind_addr, absl::Duration start_timeout,
    absl::Duration op_timeout);

}  // namespace gloo_backend
}  // namespace kolo

#endif  // KOLO_OPS_GLOO_GLOO_CONTEXT_H_
