// Validation: whether every rank asked for the same collective, and the
// response it becomes (defined in validation.cc; each collective's own
// checks and fields are its row in collectives.h). Pure functions, used by
// the coordinator (coordinator.h) and the response cache.
#ifndef KOLO_RUNTIME_NEGOTIATION_VALIDATION_H_
#define KOLO_RUNTIME_NEGOTIATION_VALIDATION_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
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

// "allreduce", "broadcast", ... ("collective" for an unknown type).
const char* CollectiveName(wire::CollectiveType type);

// The requests of one name as BuildResponse sees them, for a collective's
// checks and fields (CollectiveRules in collectives.h).
class Agreement {
 public:
  Agreement(const std::vector<const wire::Request*>& by_rank,
            const std::vector<int>& labels);

  const wire::Request& first() const { return *first_; }
  // Ranks of the set, and how many submitted (the others have joined).
  int size() const { return static_cast<int>(by_rank_.size()); }
  int submitted() const { return submitted_; }
  // Request of set rank i, or null; its global rank.
  const wire::Request* request(int i) const { return by_rank_[i]; }
  int label(int i) const { return labels_[i]; }

  // An InvalidArgument error if `describe` differs between the ranks that
  // submitted: "<what> mismatch: rank 0 has X; ranks 1, 2 have Y".
  std::optional<wire::Response> Same(
      const std::string& what,
      const std::function<std::string(const wire::Request&)>& describe) const;
  // An ERROR response for this name: "<collective> \"<name>\": <detail>".
  wire::Response Error(absl::StatusCode code, const std::string& detail) const;

 private:
  const std::vector<const wire::Request*>& by_rank_;
  const std::vector<int>& labels_;
  const wire::Request* first_ = nullptr;
  int submitted_ = 0;
};

// "ranks 1, 2" or "rank 1".
std::string RankList(const std::vector<int>& ranks);
// A request's shape as "[4,2]", and its trailing shape "rank-2 shape [*,2]".
std::string ShapeOf(const wire::Request& r);
std::string TrailingShapeOf(const wire::Request& r);

}  // namespace kolo

#endif  // KOLO_RUNTIME_NEGOTIATION_VALIDATION_H_
