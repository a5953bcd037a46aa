// BuildResponse: checks that every rank asked for the same collective and
// turns the requests into a response (validation.h).
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kolo/tensor.h"
#include "kolo/types.h"
#include "runtime/validation.h"

namespace kolo {
namespace {

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ", "));
}

// If the values differ between ranks, returns "what mismatch: rank 0 has X;
// ranks 1, 2 have Y" (ranks grouped by value, in order of first rank).
std::optional<std::string> Mismatch(
    const std::string& what, const std::vector<std::pair<int, std::string>>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, value] : values) {
    bool found = false;
    for (auto& g : groups) {
      if (g.first == value) {
        g.second.push_back(rank);
        found = true;
        break;
      }
    }
    if (!found) groups.push_back({value, {rank}});
  }
  if (groups.size() <= 1) return std::nullopt;
  std::vector<std::string> parts;
  for (const auto& g : groups) {
    parts.push_back(absl::StrCat(RankList(g.second),
                                 g.second.size() == 1 ? " has " : " have ",
                                 g.first));
  }
  return absl::StrCat(what, " mismatch: ", absl::StrJoin(parts, "; "));
}

std::string Shape(const wire::Request& r) {
  return ShapeToString({r.shape().begin(), r.shape().end()});
}

std::string MemberRanks(const wire::Request& r) {
  return absl::StrCat("ranks [", absl::StrJoin(r.member_ranks(), ", "), "]");
}

std::string TrailingShape(const wire::Request& r) {
  if (r.shape_size() == 0) return "a scalar";
  std::vector<int64_t> dims(r.shape().begin() + 1, r.shape().end());
  return absl::StrCat("rank-", r.shape_size(), " shape [*",
                      dims.empty() ? "" : ",", absl::StrJoin(dims, ","), "]");
}

wire::Response Error(const std::string& name, wire::CollectiveType type,
                     absl::StatusCode code, const std::string& detail) {
  wire::Response e;
  e.set_type(wire::RESPONSE_ERROR);
  e.add_names(name);
  e.set_error_code(static_cast<int>(code));
  e.set_error(absl::StrCat(CollectiveName(type), " \"", name, "\": ", detail));
  return e;
}

}  // namespace

const char* CollectiveName(wire::CollectiveType type) {
  switch (type) {
    case wire::ALLREDUCE: return "allreduce";
    case wire::BROADCAST: return "broadcast";
    case wire::ALLGATHER: return "allgather";
    case wire::ALLTOALL: return "alltoall";
    case wire::REDUCESCATTER: return "reducescatter";
    case wire::BARRIER: return "barrier";
    case wire::JOIN: return "join";
    case wire::ADD_PROCESS_SET:
    case wire::ADD_MEMBER_PROCESS_SET: return "add_process_set";
    case wire::REMOVE_PROCESS_SET: return "remove_process_set";
    default: return "collective";
  }
}

wire::Response BuildResponse(const std::vector<wire::Request>& by_rank) {
  std::vector<const wire::Request*> ptrs;
  std::vector<int> labels;
  for (size_t i = 0; i < by_rank.size(); ++i) {
    ptrs.push_back(&by_rank[i]);
    labels.push_back(static_cast<int>(i));
  }
  return BuildResponse(ptrs, labels);
}

wire::Response BuildResponse(const std::vector<const wire::Request*>& by_rank,
                             const std::vector<int>& labels) {
  const wire::Request* first = nullptr;
  int submitted = 0;
  for (const auto* r : by_rank) {
    if (r) {
      if (!first) first = r;
      ++submitted;
    }
  }
  const std::string& name = first->name();
  const int size = static_cast<int>(by_rank.size());
  auto check = [&](const std::string& what,
                   auto&& f) -> std::optional<wire::Response> {
    std::vector<std::pair<int, std::string>> values;
    for (int i = 0; i < size; ++i) {
      if (by_rank[i]) values.emplace_back(labels[i], f(*by_rank[i]));
    }
    if (auto m = Mismatch(what, values)) {
      return Error(name, first->type(), absl::StatusCode::kInvalidArgument, *m);
    }
    return std::nullopt;
  };
  auto op_name = [](const wire::Request& r) {
    return std::string(ReduceOpName(static_cast<ReduceOp>(r.op())));
  };
  auto scales = [&]() -> std::optional<wire::Response> {
    std::optional<wire::Response> e;
    if ((e = check("prescale factor",
                   [](const wire::Request& r) { return absl::StrCat(r.prescale()); })) ||
        (e = check("postscale factor", [](const wire::Request& r) {
           return absl::StrCat(r.postscale());
         }))) {
      return e;
    }
    return std::nullopt;
  };
  std::optional<wire::Response> err;
  if ((err = check("collective",
                   [](const wire::Request& r) {
                     return std::string(CollectiveName(r.type()));
                   })) ||
      (err = check("dtype",
                   [](const wire::Request& r) {
                     return std::string(
                         DataTypeName(static_cast<DataType>(r.dtype())));
                   })) ||
      (err = check("device",
                   // Ranks use their own GPU (cuda:0 here, cuda:1 there):
                   // only the device type must match.
                   [](const wire::Request& r) {
                     return std::string(
                         static_cast<DeviceType>(r.device_type()) ==
                                 DeviceType::kCpu
                             ? "cpu"
                             : "cuda");
                   })) ||
      (err = check("group", [](const wire::Request& r) {
         return r.group().empty() ? std::string("no group")
                                  : absl::StrCat("group \"", r.group(), "\"");
       }))) {
    return *err;
  }
  // Submit checks the shapes of its own rank; a request list from a peer
  // (faulty, or hostile with the secret) may still carry any numbers.
  if (first->type() != wire::ADD_PROCESS_SET &&
      first->type() != wire::ADD_MEMBER_PROCESS_SET &&
      first->type() != wire::REMOVE_PROCESS_SET) {
    for (int i = 0; i < size; ++i) {
      if (!by_rank[i]) continue;
      int64_t count = 1;
      for (int64_t d : by_rank[i]->shape()) {
        if (d < 0 || __builtin_mul_overflow(count, d, &count)) {
          return Error(name, first->type(), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("rank ", labels[i], " sent the shape ",
                                    Shape(*by_rank[i]),
                                    ", which holds no valid element count"));
        }
      }
    }
  }
  switch (first->type()) {
    case wire::ALLREDUCE:
    case wire::REDUCESCATTER:
      if ((err = check("shape", Shape)) || (err = check("reduce op", op_name)) ||
          (err = scales())) {
        return *err;
      }
      break;
    case wire::BROADCAST:
      if ((err = check("root", [](const wire::Request& r) {
             return absl::StrCat("root ", r.root());
           })) ||
          (err = check("shape", Shape))) {
        return *err;
      }
      break;
    case wire::ALLGATHER:
    case wire::ALLTOALL:
      // Rows are counted along the first dimension: a scalar has none.
      // (Submit rejects it; a request list from a peer may still carry it.)
      for (int i = 0; i < size; ++i) {
        if (by_rank[i] && by_rank[i]->shape_size() == 0) {
          return Error(name, first->type(), absl::StatusCode::kInvalidArgument,
                       absl::StrCat("rank ", labels[i],
                                    " sent a scalar, which has no first "
                                    "dimension to gather or split"));
        }
      }
      if ((err = check("shape", TrailingShape))) return *err;
      break;
    case wire::BARRIER:
      break;
    case wire::ADD_PROCESS_SET:
    case wire::ADD_MEMBER_PROCESS_SET:
      if ((err = check("process set ranks", MemberRanks))) return *err;
      break;
    case wire::REMOVE_PROCESS_SET:
      if ((err = check("process set", [](const wire::Request& r) {
             return absl::StrCat("process set ", r.target_process_set());
           }))) {
        return *err;
      }
      break;
    default:
      return Error(name, first->type(), absl::StatusCode::kInvalidArgument,
                   "unknown collective type");
  }

  // Ranks that have joined only take part in sum/average allreduces.
  if (submitted < size && !(first->type() == wire::ALLREDUCE &&
                            (first->op() == static_cast<int>(ReduceOp::kSum) ||
                             first->op() == static_cast<int>(ReduceOp::kAverage)))) {
    std::vector<int> joined;
    for (int i = 0; i < size; ++i) {
      if (!by_rank[i]) joined.push_back(labels[i]);
    }
    return Error(name, first->type(), absl::StatusCode::kFailedPrecondition,
                 absl::StrCat(RankList(joined), joined.size() == 1 ? " has" : " have",
                              " joined; while ranks have joined only sum and "
                              "average allreduces run"));
  }

  wire::Response resp;
  resp.add_names(name);
  resp.set_dtype(first->dtype());
  resp.set_device_type(first->device_type());
  resp.set_device_index(first->device_index());
  int64_t elements = 1;
  auto trailing = [&] {
    for (int i = 1; i < first->shape_size(); ++i) elements *= first->shape(i);
  };
  switch (first->type()) {
    case wire::ALLREDUCE:
      resp.set_type(wire::RESPONSE_ALLREDUCE);
      resp.set_op(first->op());
      resp.set_prescale(first->prescale());
      resp.set_postscale(first->postscale());
      for (int64_t d : first->shape()) elements *= d;
      if (submitted < size) resp.set_contributors(submitted);
      break;
    case wire::BROADCAST:
      resp.set_type(wire::RESPONSE_BROADCAST);
      resp.set_root(first->root());
      for (int64_t d : first->shape()) elements *= d;
      break;
    case wire::ALLGATHER:
      resp.set_type(wire::RESPONSE_ALLGATHER);
      trailing();
      for (const auto* r : by_rank) resp.add_first_dims(r->shape(0));
      break;
    case wire::ALLTOALL:
      resp.set_type(wire::RESPONSE_ALLTOALL);
      trailing();
      for (const auto* r : by_rank) {
        for (int64_t s : r->splits()) resp.add_first_dims(s);
      }
      break;
    case wire::REDUCESCATTER:
      resp.set_type(wire::RESPONSE_REDUCESCATTER);
      resp.set_op(first->op());
      resp.set_prescale(first->prescale());
      resp.set_postscale(first->postscale());
      trailing();
      resp.add_first_dims(first->shape_size() ? first->shape(0) : 1);
      break;
    case wire::BARRIER:
      resp.set_type(wire::RESPONSE_BARRIER);
      elements = 0;
      break;
    case wire::REMOVE_PROCESS_SET:
      resp.set_type(wire::RESPONSE_REMOVE_PROCESS_SET);
      resp.set_target_process_set(first->target_process_set());
      elements = 0;
      break;
    default:  // ADD_PROCESS_SET
      resp.set_type(wire::RESPONSE_ADD_PROCESS_SET);
      *resp.mutable_member_ranks() = first->member_ranks();
      elements = 0;
      break;
  }
  resp.add_elements(elements);
  return resp;
}

}  // namespace kolo
