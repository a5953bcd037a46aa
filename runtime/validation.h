// Validation: whether every rank asked for the same collective, and the
// response it becomes (defined in validation.cc). Pure functions, used by
// the coordinator (controller.h) and the response cache.
#ifndef KOLO_RUNTIME_VALIDATION_H_
#define KOLO_RUNTIME_VALIDATION_H_

#include <vector>

#include "runtime/wire.pb.h"

namespace kolo {

// Validates the requests of every rank for one name (index = rank in the
// set; null = a rank that has joined) and returns the single-tensor
// response, or an ERROR response whose message names the tensor, the ranks
// (as `rank_labels[index]`, the global ranks) and their values.
wire::Response BuildResponse(const std::vector<const wire::Request*>& by_rank,
                             const std::vector<int>& rank_labels);
// All ranks submitted; ranks labelled by their index.
wire::Response BuildResponse(const std::vector<wire::Request>& by_rank);

// "allreduce", "broadcast", ...
const char* CollectiveName(wire::CollectiveType type);

}  // namespace kolo

#endif  // KOLO_RUNTIME_VALIDATION_H_
