// The rules of each collective, one row per collective (collectives.cc).
//
// Note [One place per collective]
// What the runtime decides per collective, besides moving the bytes, is in
// one row of one table: what messages call it, the timeline's phases,
// whether the response cache keeps it, which of its responses may share a
// fused collective and how many bytes one takes, what the coordinator
// checks beyond what every collective checks (type, dtype, device type,
// group, and for tensors a valid element count), whether ranks that have
// joined may be missing, and what its response carries. The coordinator's
// validation (validation.cc), the response cache (ResponseCache::Cacheable),
// fusion (fusion.cc), the timeline and the executor's messages read the
// row; nothing else switches on the collective type to decide these.
// Moving the bytes is the Executor's method for the response type
// (executor.cc) over the backends' primitive. Adding a collective: its
// wire types (wire.proto), a row here, the submit call (runtime.cc), the
// Executor method, and the backends.
#ifndef KOLO_RUNTIME_NEGOTIATION_COLLECTIVES_H_
#define KOLO_RUNTIME_NEGOTIATION_COLLECTIVES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "runtime/negotiation/validation.h"
#include "runtime/wire.pb.h"

namespace kolo {

struct CollectiveRules {
  wire::CollectiveType request;
  wire::ResponseType response;
  const char* name;             // in every message: "allreduce"
  const char* negotiate_phase;  // the timeline's, while negotiated
  const char* operation_phase;  // the timeline's, while run; null: not run
                                // by an executor (process sets)
  bool cacheable;               // the response cache keeps ungrouped ones
  bool tensor;                  // the shape must hold a valid element count
  // Whether the name may run while ranks that have joined are missing
  // (they contribute zeros: sum and average allreduces only).
  bool (*runs_while_joined)(const wire::Request& first);
  // Whether two ready responses of this type (same dtype and device type)
  // may share one fused collective; null: never fused.
  bool (*fuses)(const wire::Response& a, const wire::Response& b);
  // Bytes one response moves, for the fusion threshold; null: its
  // elements times the dtype's size.
  int64_t (*bytes)(const wire::Response& r, int world_size);
  // The checks after the common ones, in order: the first mismatch.
  std::optional<wire::Response> (*check)(const Agreement& a);
  // The response's own fields (names, dtype, device are set); elements
  // holds one entry per tensor.
  void (*fill)(const Agreement& a, wire::Response* r);
};

// Note [Request timeouts]
// Every request has a timeout (Request::timeout_us; 0: the job's op
// timeout, KOLO_OP_TIMEOUT): how long it waits for the other ranks of its
// set to submit it, counted from the first submission the coordinator
// sees, whatever carries it (a request list, a bit on the hit board, a
// host leader's message), and, on a rank that waits for the coordinator's
// answer, from when its request was taken for sending plus a slack
// (RuntimeImpl::kLocalTimeoutSlack). Where the ranks' timeouts differ the
// shortest one counts. The timeout is part of the request: one that changes
// is a cache miss. It does not bound the transfer once every rank has
// submitted (the backends take the job's op timeout for that).
//
// The request's timeout, `op_timeout` where it has none of its own.
inline absl::Duration RequestTimeout(const wire::Request& r,
                                     absl::Duration op_timeout) {
  return r.timeout_us() > 0 ? absl::Microseconds(r.timeout_us()) : op_timeout;
}
// How an error names that timeout: "2s (the request's timeout)" or "600s
// (KOLO_OP_TIMEOUT)".
std::string DescribeTimeout(int64_t timeout_us, absl::Duration op_timeout);

// The row of a request type, or null for an unknown one.
const CollectiveRules* RulesFor(wire::CollectiveType type);
// The row of a response type, or null (ERROR, unknown).
const CollectiveRules* RulesFor(wire::ResponseType type);

}  // namespace kolo

#endif  // KOLO_RUNTIME_NEGOTIATION_COLLECTIVES_H_
