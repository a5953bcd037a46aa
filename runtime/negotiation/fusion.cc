#include "runtime/negotiation/fusion.h"

#include "kolo/types.h"
#include "runtime/negotiation/collectives.h"

namespace kolo {
namespace {

// Note [One place per collective]: the row says which responses fuse.
bool Compatible(const wire::Response& a, const wire::Response& b) {
  if (a.type() != b.type() || a.dtype() != b.dtype() ||
      a.device_type() != b.device_type()) {
    return false;
  }
  const CollectiveRules* rules = RulesFor(a.type());
  return rules && rules->fuses && rules->fuses(a, b);
}

void Append(wire::Response* bucket, const wire::Response& r) {
  for (const auto& name : r.names()) bucket->add_names(name);
  for (int64_t e : r.elements()) bucket->add_elements(e);
  for (int64_t d : r.first_dims()) bucket->add_first_dims(d);
}

}  // namespace

int64_t ResponseBytes(const wire::Response& r, int world_size) {
  const CollectiveRules* rules = RulesFor(r.type());
  if (rules && rules->bytes) return rules->bytes(r, world_size);
  const int64_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  int64_t bytes = 0;
  for (int64_t e : r.elements()) bytes += e * elem;
  return bytes;
}

std::vector<std::vector<size_t>> PlanBuckets(
    const std::vector<const wire::Response*>& ready, int64_t threshold_bytes,
    int world_size) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<int64_t> bucket_bytes;
  std::vector<bool> open;
  for (size_t i = 0; i < ready.size(); ++i) {
    const wire::Response& r = *ready[i];
    const int64_t bytes = ResponseBytes(r, world_size);
    bool placed = false;
    if (r.type() != wire::RESPONSE_ERROR && threshold_bytes > 0) {
      for (size_t b = 0; b < buckets.size(); ++b) {
        if (!open[b] || !Compatible(*ready[buckets[b][0]], r)) continue;
        if (bucket_bytes[b] + bytes > threshold_bytes) continue;
        buckets[b].push_back(i);
        bucket_bytes[b] += bytes;
        placed = true;
        break;
      }
    }
    if (!placed) {
      buckets.push_back({i});
      bucket_bytes.push_back(bytes);
      open.push_back(r.type() != wire::RESPONSE_ERROR &&
                     bytes < threshold_bytes);
    }
  }
  return buckets;
}

wire::Response FuseBucket(const std::vector<const wire::Response*>& ready,
                          const std::vector<size_t>& members) {
  wire::Response fused = *ready[members[0]];
  if (members.size() > 1) {
    fused.mutable_names()->Reserve(static_cast<int>(members.size()));
    fused.mutable_elements()->Reserve(static_cast<int>(members.size()));
  }
  for (size_t k = 1; k < members.size(); ++k)
    Append(&fused, *ready[members[k]]);
  return fused;
}

}  // namespace kolo
