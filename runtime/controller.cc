#include "runtime/controller.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kolo/tensor.h"
#include "kolo/types.h"

namespace kolo {
namespace {

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ", "));
}

// If the values differ between ranks, returns "what mismatch: rank 0 has X,
// ranks 1, 2 have Y" (ranks grouped by value, in order of first rank).
std::optional<std::string> Mismatch(const std::string& what,
                                    const std::vector<std::string>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    bool found = false;
    for (auto& g : groups) {
      if (g.first == values[r]) {
        g.second.push_back(r);
        found = true;
        break;
      }
    }
    if (!found) groups.push_back({values[r], {r}});
  }
  if (groups.size() == 1) return std::nullopt;
  std::vector<std::string> parts;
  for (const auto& g : groups) {
    parts.push_back(absl::StrCat(RankList(g.second),
                                 g.second.size() == 1 ? " has " : " have ",
                                 g.first));
  }
  return absl::StrCat(what, " mismatch: ", absl::StrJoin(parts, "; "));
}

template <typename F>
std::vector<std::string> Values(const std::vector<wire::Request>& by_rank,
                                F&& f) {
  std::vector<std::string> out;
  out.reserve(by_rank.size());
  for (const auto& r : by_rank) out.push_back(f(r));
  return out;
}

std::string Shape(const wire::Request& r) {
  return ShapeToString({r.shape().begin(), r.shape().end()});
}

std::string TrailingShape(const wire::Request& r) {
  if (r.shape_size() == 0) return "a scalar";
  std::vector<int64_t> dims(r.shape().begin() + 1, r.shape().end());
  return absl::StrCat("rank-", r.shape_size(), " shape [*",
                      dims.empty() ? "" : ",",
                      absl::StrJoin(dims, ","), "]");
}

std::string Scale(double v) { return absl::StrCat(v); }

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
    default: return "collective";
  }
}

wire::Response BuildResponse(const std::vector<wire::Request>& by_rank) {
  const wire::Request& first = by_rank.front();
  const std::string& name = first.name();
  auto check = [&](const std::string& what, auto&& f)
      -> std::optional<wire::Response> {
    if (auto m = Mismatch(what, Values(by_rank, f))) {
      return Error(name, first.type(), absl::StatusCode::kInvalidArgument, *m);
    }
    return std::nullopt;
  };
  std::optional<wire::Response> err;
  if ((err = check("collective", [](const wire::Request& r) {
         return std::string(CollectiveName(r.type()));
       })) ||
      (err = check("dtype", [](const wire::Request& r) {
         return std::string(DataTypeName(static_cast<DataType>(r.dtype())));
       })) ||
      (err = check("device", [](const wire::Request& r) {
         return Device{static_cast<DeviceType>(r.device_type()),
                       r.device_index()}
             .ToString();
       }))) {
    return *err;
  }
  switch (first.type()) {
    case wire::ALLREDUCE:
      if ((err = check("shape", Shape)) ||
          (err = check("reduce op", [](const wire::Request& r) {
             return std::string(ReduceOpName(static_cast<ReduceOp>(r.op())));
           })) ||
          (err = check("prescale factor",
                       [](const wire::Request& r) { return Scale(r.prescale()); })) ||
          (err = check("postscale factor", [](const wire::Request& r) {
             return Scale(r.postscale());
           }))) {
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
      if ((err = check("shape", TrailingShape))) return *err;
      break;
    default:
      return Error(name, first.type(), absl::StatusCode::kInvalidArgument,
                   "unknown collective type");
  }

  wire::Response resp;
  resp.add_names(name);
  resp.set_dtype(first.dtype());
  resp.set_device_type(first.device_type());
  resp.set_device_index(first.device_index());
  int64_t elements = 1;
  switch (first.type()) {
    case wire::ALLREDUCE:
      resp.set_type(wire::RESPONSE_ALLREDUCE);
      resp.set_op(first.op());
      resp.set_prescale(first.prescale());
      resp.set_postscale(first.postscale());
      for (int64_t d : first.shape()) elements *= d;
      break;
    case wire::BROADCAST:
      resp.set_type(wire::RESPONSE_BROADCAST);
      resp.set_root(first.root());
      for (int64_t d : first.shape()) elements *= d;
      break;
    default:
      resp.set_type(wire::RESPONSE_ALLGATHER);
      for (int i = 1; i < first.shape_size(); ++i) elements *= first.shape(i);
      for (const auto& r : by_rank) resp.add_first_dims(r.shape(0));
      break;
  }
  resp.add_elements(elements);
  return resp;
}

void Coordinator::AddRequests(int rank, const wire::RequestList& list,
                              absl::Time now) {
  for (const wire::Request& request : list.requests()) {
    auto [it, inserted] = pending_.try_emplace(request.name());
    Pending& p = it->second;
    if (inserted) {
      p.by_rank.resize(size_);
      p.first_seen = now;
    }
    if (p.by_rank[rank].has_value()) continue;  // Rejected on the rank.
    p.by_rank[rank] = request;
    p.by_rank[rank]->set_rank(rank);
    ++p.count;
    // A name that a departed rank never submitted can never become ready.
    std::vector<int> gone;
    for (int r : shutdown_) {
      if (!p.by_rank[r].has_value()) gone.push_back(r);
    }
    if (!gone.empty()) {
      FailPending(request.name(), p, static_cast<int>(absl::StatusCode::kAborted),
                  absl::StrCat(RankList(gone),
                               " shut down without submitting it"),
                  now);
      pending_.erase(it);
    } else if (p.count == size_) {
      MakeReady(request.name(), p, now);
      pending_.erase(it);
    }
  }
  if (list.shutdown() && shutdown_.insert(rank).second) {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (!it->second.by_rank[rank].has_value()) {
        FailPending(it->first, it->second,
                    static_cast<int>(absl::StatusCode::kAborted),
                    absl::StrCat("rank ", rank,
                                 " shut down without submitting it"),
                    now);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

void Coordinator::MakeReady(const std::string& name, Pending& p,
                            absl::Time now) {
  std::vector<wire::Request> by_rank;
  by_rank.reserve(size_);
  for (auto& r : p.by_rank) by_rank.push_back(std::move(*r));
  ready_.push_back({BuildResponse(by_rank), now});
}

std::string Coordinator::RanksWhere(const Pending& p, bool submitted) const {
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (p.by_rank[r].has_value() == submitted) ranks.push_back(r);
  }
  return RankList(ranks);
}

void Coordinator::FailPending(const std::string& name, const Pending& p,
                              int code, const std::string& message,
                              absl::Time now) {
  wire::CollectiveType type = wire::ALLREDUCE;
  for (const auto& r : p.by_rank) {
    if (r.has_value()) {
      type = r->type();
      break;
    }
  }
  wire::Response e = Error(name, type, static_cast<absl::StatusCode>(code),
                           message);
  e.set_error(absl::StrCat(e.error(), " (submitted by ",
                           RanksWhere(p, /*submitted=*/true), ")"));
  ready_.push_back({std::move(e), now});
}

void Coordinator::ExpireOlderThan(absl::Duration op_timeout, absl::Time now) {
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (now - it->second.first_seen >= op_timeout) {
      FailPending(
          it->first, it->second,
          static_cast<int>(absl::StatusCode::kDeadlineExceeded),
          absl::StrCat("timed out after ", absl::FormatDuration(op_timeout),
                       " (KOLO_OP_TIMEOUT) waiting for ",
                       RanksWhere(it->second, /*submitted=*/false),
                       " to submit it"),
          now);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Time Coordinator::NextExpiry(absl::Duration op_timeout) const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [name, p] : pending_) {
    next = std::min(next, p.first_seen + op_timeout);
  }
  return next;
}

std::vector<wire::Response> Coordinator::TakeReady() {
  std::vector<wire::Response> out;
  out.reserve(ready_.size());
  for (auto& r : ready_) out.push_back(std::move(r.response));
  ready_.clear();
  return out;
}

std::vector<std::string> Coordinator::PendingNames() const {
  std::vector<std::string> names;
  for (const auto& [name, p] : pending_) names.push_back(name);
  return names;
}

}  // namespace kolo
