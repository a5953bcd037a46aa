#include "runtime/fusion.h"

#include "kolo/types.h"

namespace kolo {
namespace {

bool Compatible(const wire::Response& a, const wire::Response& b) {
  if (a.type() != b.type() || a.dtype() != b.dtype() ||
      a.device_type() != b.device_type()) {
    return false;
  }
  switch (a.type()) {
    case wire::RESPONSE_ALLREDUCE:
      return a.op() == b.op() && a.prescale() == b.prescale() &&
             a.postscale() == b.postscale() &&
             a.contributors() == b.contributors();
    case wire::RESPONSE_BROADCAST:
      return a.root() == b.root();
    case wire::RESPONSE_ALLGATHER:
      return true;
    default:
      return false;
  }
}

void Append(wire::Response* bucket, const wire::Response& r) {
  for (const auto& name : r.names()) bucket->add_names(name);
  for (int64_t e : r.elements()) bucket->add_elements(e);
  for (int64_t d : r.first_dims()) bucket->add_first_dims(d);
}

}  // namespace

int64_t ResponseBytes(const wire::Response& r, int world_size) {
  const int64_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  int64_t bytes = 0;
  if (r.type() == wire::RESPONSE_ALLGATHER) {
    for (int i = 0; i < r.elements_size(); ++i) {
      for (int k = 0; k < world_size; ++k) {
        bytes += r.first_dims(i * world_size + k) * r.elements(i) * elem;
      }
    }
  } else {
    for (int64_t e : r.elements()) bytes += e * elem;
  }
  return bytes;
}

std::vector<wire::Response> PlanFusion(
    std::vector<wire::Response> ready, int64_t threshold_bytes, int world_size,
    std::vector<std::vector<size_t>>* members) {
  std::vector<wire::Response> buckets;
  std::vector<int64_t> bucket_bytes;
  std::vector<bool> open;
  if (members) members->clear();
  for (size_t i = 0; i < ready.size(); ++i) {
    wire::Response& r = ready[i];
    const int64_t bytes = ResponseBytes(r, world_size);
    bool placed = false;
    if (r.type() != wire::RESPONSE_ERROR && threshold_bytes > 0) {
      for (size_t b = 0; b < buckets.size(); ++b) {
        if (!open[b] || !Compatible(buckets[b], r)) continue;
        if (bucket_bytes[b] + bytes > threshold_bytes) continue;
        Append(&buckets[b], r);
        bucket_bytes[b] += bytes;
        if (members) (*members)[b].push_back(i);
        placed = true;
        break;
      }
    }
    if (!placed) {
      const bool can_grow =
          r.type() != wire::RESPONSE_ERROR && bytes < threshold_bytes;
      buckets.push_back(std::move(r));
      bucket_bytes.push_back(bytes);
      open.push_back(can_grow);
      if (members) members->push_back({i});
    }
  }
  return buckets;
}

}  // namespace kolo
