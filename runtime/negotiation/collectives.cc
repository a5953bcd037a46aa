// One row per collective (Note [One place per collective] in collectives.h).
#include "runtime/negotiation/collectives.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kolo/types.h"
#include "runtime/util/format.h"

namespace kolo {
namespace {

using Check = std::optional<wire::Response>;

// --- Checks, each one agreement that every rank's request must share. ---

// Whether the (agreed) dtype and device can take the reduction. Checked
// here rather than at submit: a rank whose tensor differs from the others'
// (an int on one, a float on another) then fails together with them.
Check Reducible(const Agreement& a) {
  const wire::Request& r = a.first();
  const DataType dtype = static_cast<DataType>(r.dtype());
  if (dtype == DataType::kBool) {
    return a.Error(absl::StatusCode::kInvalidArgument,
                   "bool tensors are not reduced (broadcast, allgather and "
                   "alltoall move them); convert to an integer dtype first");
  }
  const bool scaled = r.op() == static_cast<int>(ReduceOp::kAverage) ||
                      r.prescale() != 1.0 || r.postscale() != 1.0;
  if (scaled && !IsFloatingPoint(dtype) &&
      static_cast<DeviceType>(r.device_type()) == DeviceType::kCuda) {
    // Note [Integer scaling] in ops/cpu/reduce.cc: on the CPU only.
    return a.Error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("an average or scale factor of integer ",
                                DataTypeName(dtype),
                                " tensors runs on CPU tensors only; on CUDA "
                                "use op sum, or a floating-point tensor"));
  }
  return std::nullopt;
}

Check SameReduction(const Agreement& a) {
  Check e;
  if ((e = Reducible(a)) || (e = a.Same("shape", ShapeOf)) ||
      (e = a.Same("reduce op",
                  [](const wire::Request& r) {
                    return std::string(
                        ReduceOpName(static_cast<ReduceOp>(r.op())));
                  })) ||
      (e = a.Same("prescale factor",
                  [](const wire::Request& r) {
                    return absl::StrCat(r.prescale());
                  })) ||
      (e = a.Same("postscale factor", [](const wire::Request& r) {
        return absl::StrCat(r.postscale());
      }))) {
    return e;
  }
  return std::nullopt;
}

// A broadcast request names its root by the root's rank in the set, or by
// -1 - r for rank r of the job outside the set (Runtime::Broadcast takes
// the root as a rank of the job, as Horovod does). Messages name ranks of
// the job.
int RootInJob(const Agreement& a, const wire::Request& r) {
  if (r.root() < 0) return -1 - r.root();
  return r.root() < a.size() ? a.label(r.root()) : r.root();
}

Check SameRootAndShape(const Agreement& a) {
  Check e;
  if ((e = a.Same("root",
                  [&a](const wire::Request& r) {
                    return absl::StrCat("root ", RootInJob(a, r));
                  })) ||
      (e = a.Same("shape", ShapeOf))) {
    return e;
  }
  if (a.first().root() < 0) {
    std::vector<int> members;
    for (int i = 0; i < a.size(); ++i) members.push_back(a.label(i));
    return a.Error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("root rank ", RootInJob(a, a.first()),
                                " is not a member of the process set (ranks ",
                                absl::StrJoin(members, ", "), ")"));
  }
  return std::nullopt;
}

// Allgather and alltoall: rows are counted along the first dimension, so
// a scalar has none (Submit rejects it; a request list from a peer may
// still carry it), and the rest of the shape must agree.
Check SameRows(const Agreement& a) {
  for (int i = 0; i < a.size(); ++i) {
    if (a.request(i) && a.request(i)->shape_size() == 0) {
      return a.Error(absl::StatusCode::kInvalidArgument,
                     absl::StrCat("rank ", a.label(i),
                                  " sent a scalar, which has no first "
                                  "dimension to gather or split"));
    }
  }
  return a.Same("shape", TrailingShapeOf);
}

Check Nothing(const Agreement&) { return std::nullopt; }

Check SameMembers(const Agreement& a) {
  return a.Same("process set ranks", [](const wire::Request& r) {
    return absl::StrCat("ranks [", absl::StrJoin(r.member_ranks(), ", "), "]");
  });
}

Check SameTarget(const Agreement& a) {
  return a.Same("process set", [](const wire::Request& r) {
    return absl::StrCat("process set ", r.target_process_set());
  });
}

Check NotByName(const Agreement& a) {
  // Joins are counted by the coordinator (Coordinator::AddJoin), never
  // validated by name; a list that says otherwise is refused.
  return a.Error(absl::StatusCode::kInvalidArgument, "unknown collective type");
}

// --- Fields of the response. ---

int64_t Elements(const wire::Request& r) {
  int64_t n = 1;
  for (int64_t d : r.shape()) n *= d;
  return n;
}

int64_t TrailingElements(const wire::Request& r) {
  int64_t n = 1;
  for (int i = 1; i < r.shape_size(); ++i) n *= r.shape(i);
  return n;
}

void Scales(const wire::Request& first, wire::Response* r) {
  r->set_op(first.op());
  r->set_prescale(first.prescale());
  r->set_postscale(first.postscale());
}

void FillAllreduce(const Agreement& a, wire::Response* r) {
  Scales(a.first(), r);
  r->add_elements(Elements(a.first()));
  if (a.submitted() < a.size()) r->set_contributors(a.submitted());
}

void FillBroadcast(const Agreement& a, wire::Response* r) {
  r->set_root(a.first().root());  // a rank of the set
  r->add_elements(Elements(a.first()));
}

void FillAllgather(const Agreement& a, wire::Response* r) {
  r->add_elements(TrailingElements(a.first()));
  for (int i = 0; i < a.size(); ++i) r->add_first_dims(a.request(i)->shape(0));
}

void FillAlltoall(const Agreement& a, wire::Response* r) {
  r->add_elements(TrailingElements(a.first()));
  for (int i = 0; i < a.size(); ++i) {
    for (int64_t s : a.request(i)->splits()) r->add_first_dims(s);
  }
}

void FillReducescatter(const Agreement& a, wire::Response* r) {
  Scales(a.first(), r);
  r->add_elements(TrailingElements(a.first()));
  r->add_first_dims(a.first().shape_size() ? a.first().shape(0) : 1);
}

void FillNone(const Agreement&, wire::Response* r) { r->add_elements(0); }

void FillAddProcessSet(const Agreement& a, wire::Response* r) {
  *r->mutable_member_ranks() = a.first().member_ranks();
  r->add_elements(0);
}

void FillRemoveProcessSet(const Agreement& a, wire::Response* r) {
  r->set_target_process_set(a.first().target_process_set());
  r->add_elements(0);
}

// --- Fusion. ---

bool SameReductionFused(const wire::Response& a, const wire::Response& b) {
  return a.op() == b.op() && a.prescale() == b.prescale() &&
         a.postscale() == b.postscale() && a.contributors() == b.contributors();
}

bool SameRootFused(const wire::Response& a, const wire::Response& b) {
  return a.root() == b.root();
}

bool AlwaysFused(const wire::Response&, const wire::Response&) { return true; }

int64_t AllgatherBytes(const wire::Response& r, int world_size) {
  const int64_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  int64_t bytes = 0;
  for (int i = 0; i < r.elements_size(); ++i) {
    for (int k = 0; k < world_size; ++k) {
      bytes += r.first_dims(i * world_size + k) * r.elements(i) * elem;
    }
  }
  return bytes;
}

// --- Joined ranks. ---

bool SumsOnly(const wire::Request& first) {
  return first.op() == static_cast<int>(ReduceOp::kSum) ||
         first.op() == static_cast<int>(ReduceOp::kAverage);
}

bool Never(const wire::Request&) { return false; }

// clang-format off
const CollectiveRules kRules[] = {
  // request, response, name, negotiate phase, operation phase,
  // cacheable, tensor, runs while joined, fuses, bytes, check, fill
  {wire::ALLREDUCE, wire::RESPONSE_ALLREDUCE, "allreduce",
   "NEGOTIATE_ALLREDUCE", "ALLREDUCE",
   true, true, SumsOnly, SameReductionFused, nullptr,
   SameReduction, FillAllreduce},
  {wire::BROADCAST, wire::RESPONSE_BROADCAST, "broadcast",
   "NEGOTIATE_BROADCAST", "BROADCAST",
   true, true, Never, SameRootFused, nullptr,
   SameRootAndShape, FillBroadcast},
  {wire::ALLGATHER, wire::RESPONSE_ALLGATHER, "allgather",
   "NEGOTIATE_ALLGATHER", "ALLGATHER",
   false, true, Never, AlwaysFused, AllgatherBytes,
   SameRows, FillAllgather},
  {wire::ALLTOALL, wire::RESPONSE_ALLTOALL, "alltoall",
   "NEGOTIATE_ALLTOALL", "ALLTOALL",
   false, true, Never, nullptr, nullptr,
   SameRows, FillAlltoall},
  {wire::REDUCESCATTER, wire::RESPONSE_REDUCESCATTER, "reducescatter",
   "NEGOTIATE_REDUCESCATTER", "REDUCESCATTER",
   false, true, Never, nullptr, nullptr,
   SameReduction, FillReducescatter},
  {wire::BARRIER, wire::RESPONSE_BARRIER, "barrier",
   "NEGOTIATE_BARRIER", "BARRIER",
   false, true, Never, nullptr, nullptr,
   Nothing, FillNone},
  {wire::JOIN, wire::RESPONSE_JOIN, "join",
   "NEGOTIATE_JOIN", "JOIN",
   false, false, Never, nullptr, nullptr,
   NotByName, FillNone},
  {wire::ADD_PROCESS_SET, wire::RESPONSE_ADD_PROCESS_SET, "add_process_set",
   "NEGOTIATE", nullptr,
   false, false, Never, nullptr, nullptr,
   SameMembers, FillAddProcessSet},
  {wire::ADD_MEMBER_PROCESS_SET, wire::RESPONSE_ADD_PROCESS_SET,
   "add_process_set",
   "NEGOTIATE", nullptr,
   false, false, Never, nullptr, nullptr,
   SameMembers, FillAddProcessSet},
  {wire::REMOVE_PROCESS_SET, wire::RESPONSE_REMOVE_PROCESS_SET,
   "remove_process_set",
   "NEGOTIATE", nullptr,
   false, false, Never, nullptr, nullptr,
   SameTarget, FillRemoveProcessSet},
};
// clang-format on

// Rows by enum value: the lookup is on every submission's cache lookup.
template <typename Enum, Enum CollectiveRules::*field>
struct Index {
  static constexpr int kSize = 32;
  const CollectiveRules* rows[kSize] = {};
  Index() {
    for (const CollectiveRules& r : kRules) {
      const int v = static_cast<int>(r.*field);
      if (v >= 0 && v < kSize && !rows[v]) rows[v] = &r;
    }
  }
  const CollectiveRules* Find(Enum type) const {
    const int v = static_cast<int>(type);
    return v >= 0 && v < kSize ? rows[v] : nullptr;
  }
};

const Index<wire::CollectiveType, &CollectiveRules::request> kByRequest;
const Index<wire::ResponseType, &CollectiveRules::response> kByResponse;

}  // namespace

std::string DescribeTimeout(int64_t timeout_us, absl::Duration op_timeout) {
  if (timeout_us > 0) {
    return absl::StrCat(FormatSeconds(absl::Microseconds(timeout_us)),
                        " (the request's timeout)");
  }
  return absl::StrCat(FormatSeconds(op_timeout), " (KOLO_OP_TIMEOUT)");
}

const CollectiveRules* RulesFor(wire::CollectiveType type) {
  return kByRequest.Find(type);
}

const CollectiveRules* RulesFor(wire::ResponseType type) {
  return kByResponse.Find(type);
}

}  // namespace kolo
