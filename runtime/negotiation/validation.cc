// BuildResponse: checks that every rank asked for the same collective and
// turns the requests into a response (validation.h). What every collective
// checks is here; each collective's own checks and fields are its row in
// collectives.cc (Note [One place per collective]).
#include "runtime/negotiation/validation.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kolo/tensor.h"
#include "kolo/types.h"
#include "runtime/negotiation/collectives.h"

namespace kolo {
namespace {

// If the values differ between ranks, returns "what mismatch: rank 0 has X;
// ranks 1, 2 have Y" (ranks grouped by value, in order of first rank).
std::optional<std::string> Mismatch(
    const std::string& what,
    const std::vector<std::pair<int, std::string>>& values) {
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

}  // namespace

std::string RankList(const std::vector<int>& ranks) {
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks ",
                      absl::StrJoin(ranks, ", "));
}

std::string ShapeOf(const wire::Request& r) {
  return ShapeToString({r.shape().begin(), r.shape().end()});
}

std::string TrailingShapeOf(const wire::Request& r) {
  if (r.shape_size() == 0) return "a scalar";
  std::vector<int64_t> dims(r.shape().begin() + 1, r.shape().end());
  return absl::StrCat("rank-", r.shape_size(), " shape [*",
                      dims.empty() ? "" : ",", absl::StrJoin(dims, ","), "]");
}

const char* CollectiveName(wire::CollectiveType type) {
  const CollectiveRules* rules = RulesFor(type);
  return rules ? rules->name : "collective";
}

Agreement::Agreement(const std::vector<const wire::Request*>& by_rank,
                     const std::vector<int>& labels)
    : by_rank_(by_rank), labels_(labels) {
  for (const auto* r : by_rank_) {
    if (r) {
      if (!first_) first_ = r;
      ++submitted_;
    }
  }
}

std::optional<wire::Response> Agreement::Same(
    const std::string& what,
    const std::function<std::string(const wire::Request&)>& describe) const {
  std::vector<std::pair<int, std::string>> values;
  for (int i = 0; i < size(); ++i) {
    if (by_rank_[i]) values.emplace_back(labels_[i], describe(*by_rank_[i]));
  }
  if (auto m = Mismatch(what, values)) {
    return Error(absl::StatusCode::kInvalidArgument, *m);
  }
  return std::nullopt;
}

wire::Response Agreement::Error(absl::StatusCode code,
                                const std::string& detail) const {
  wire::Response e;
  e.set_type(wire::RESPONSE_ERROR);
  e.add_names(first_->name());
  e.set_error_code(static_cast<int>(code));
  e.set_error(absl::StrCat(CollectiveName(first_->type()), " \"",
                           first_->name(), "\": ", detail));
  return e;
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
  const Agreement a(by_rank, labels);
  const wire::Request& first = a.first();
  std::optional<wire::Response> err;
  if ((err = a.Same("collective",
                    [](const wire::Request& r) {
                      return std::string(CollectiveName(r.type()));
                    })) ||
      (err = a.Same("dtype",
                    [](const wire::Request& r) {
                      return std::string(
                          DataTypeName(static_cast<DataType>(r.dtype())));
                    })) ||
      (err = a.Same("device",
                    // Ranks use their own GPU (cuda:0 here, cuda:1 there):
                    // only the device type must match.
                    [](const wire::Request& r) {
                      return std::string(
                          static_cast<DeviceType>(r.device_type()) ==
                                  DeviceType::kCpu
                              ? "cpu"
                              : "cuda");
                    })) ||
      (err = a.Same("group", [](const wire::Request& r) {
        return r.group().empty() ? std::string("no group")
                                 : absl::StrCat("group \"", r.group(), "\"");
      }))) {
    return *err;
  }
  const CollectiveRules* rules = RulesFor(first.type());
  // Submit checks the shapes of its own rank; a request list from a peer
  // (faulty, or hostile with the secret) may still carry any numbers.
  if (!rules || rules->tensor) {
    for (int i = 0; i < a.size(); ++i) {
      const wire::Request* r = a.request(i);
      if (!r) continue;
      int64_t count = 1;
      for (int64_t d : r->shape()) {
        if (d < 0 || __builtin_mul_overflow(count, d, &count)) {
          return a.Error(
              absl::StatusCode::kInvalidArgument,
              absl::StrCat("rank ", a.label(i), " sent the shape ", ShapeOf(*r),
                           ", which holds no valid element count"));
        }
      }
    }
  }
  if (!rules) {
    return a.Error(absl::StatusCode::kInvalidArgument,
                   "unknown collective type");
  }
  if ((err = rules->check(a))) return *err;

  // Ranks that have joined only take part in sum/average allreduces.
  if (a.submitted() < a.size() && !rules->runs_while_joined(first)) {
    std::vector<int> joined;
    for (int i = 0; i < a.size(); ++i) {
      if (!a.request(i)) joined.push_back(a.label(i));
    }
    return a.Error(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat(RankList(joined), joined.size() == 1 ? " has" : " have",
                     " joined; while ranks have joined only sum "
                     "and average allreduces run"));
  }

  wire::Response resp;
  resp.set_type(rules->response);
  resp.add_names(first.name());
  resp.set_dtype(first.dtype());
  resp.set_device_type(first.device_type());
  resp.set_device_index(first.device_index());
  rules->fill(a, &resp);
  return resp;
}

}  // namespace kolo
