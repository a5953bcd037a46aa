// FusionPlanner: pure planning of which ready responses run as one
// collective. Runs on the coordinator only; the plan travels to every rank in
// the ResponseList, so all ranks fuse identically.
//
// Note [Fusion]
// Responses are compatible when they have the same type, dtype, device and
// (allreduce) op and scale factors, or (broadcast) root. The planner walks
// the ready responses in order and appends each to the first open bucket of
// its kind in which it fits (bytes within the threshold); otherwise it opens
// a new bucket. Buckets are emitted in the order of their first
// member. A tensor larger than the threshold runs alone. Error responses are
// never fused. Threshold 0 disables fusion.
#ifndef KOLO_RUNTIME_NEGOTIATION_FUSION_H_
#define KOLO_RUNTIME_NEGOTIATION_FUSION_H_

#include <cstdint>
#include <vector>

#include "runtime/wire.pb.h"

namespace kolo {

// Bytes a (possibly fused) response moves per rank: the sum of its tensors'
// sizes (allgather: of every rank's contribution).
int64_t ResponseBytes(const wire::Response& response, int world_size);

// The plan alone: bucket b lists the indices in `ready` (one response per
// tensor, in ready order) of its tensors, in the bucket's order.
std::vector<std::vector<size_t>> PlanBuckets(
    const std::vector<const wire::Response*>& ready, int64_t threshold_bytes,
    int world_size);

// One bucket's response: its first member's fields, and every member's
// names, elements and first dims in order.
wire::Response FuseBucket(const std::vector<const wire::Response*>& ready,
                          const std::vector<size_t>& members);

}  // namespace kolo

#endif  // KOLO_RUNTIME_NEGOTIATION_FUSION_H_
