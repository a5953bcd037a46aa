// Controller: the coordinator's side of negotiation (runs on rank 0).
//
// Note [Negotiation protocol]
// 1. Each rank's background thread sends the coordinator a RequestList with
//    the tensors submitted since its last message (any order per rank), or
//    asks to shut down.
// 2. The coordinator records each request under its name. When every rank
//    has requested a name, it validates the requests (type, dtype, device,
//    shape, op, root, scale factors must agree) and the name becomes ready:
//    a response, or an ERROR response naming the ranks and their values.
// 3. Ready responses are fused (runtime/fusion.h) and broadcast to every rank
//    as one ResponseList; every rank, the coordinator included, executes the
//    lists in the order they were sent, so collectives run in one order.
// 4. A name not requested by every rank within the op timeout becomes an
//    ERROR (DeadlineExceeded) naming the ranks that did not submit it. A rank
//    that asked to shut down fails every name it never submitted.
// 5. Shutdown: when every rank has asked, the coordinator sends a final list
//    with shutdown set and every rank leaves.
// The coordinator holds no network state: the background loop feeds it
// messages and sends what it returns, which keeps it unit-testable.
//
// Thread: owned by rank 0's background thread.
#ifndef KOLO_RUNTIME_CONTROLLER_H_
#define KOLO_RUNTIME_CONTROLLER_H_

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "runtime/wire.pb.h"

namespace kolo {

// Validates the requests of every rank for one name (index = rank) and
// returns the single-tensor response, or an ERROR response whose message
// names the tensor, the ranks and their values.
wire::Response BuildResponse(const std::vector<wire::Request>& by_rank);

// "allreduce", "broadcast", "allgather".
const char* CollectiveName(wire::CollectiveType type);

class Coordinator {
 public:
  explicit Coordinator(int world_size) : size_(world_size) {}

  // Records what `rank` sent. `now` stamps new names (timeouts, batching).
  void AddRequests(int rank, const wire::RequestList& list, absl::Time now);

  // Names pending longer than `op_timeout` become DeadlineExceeded errors.
  void ExpireOlderThan(absl::Duration op_timeout, absl::Time now);

  // Ready responses (one tensor each) in the order they became ready.
  bool HasReady() const { return !ready_.empty(); }
  absl::Time OldestReadyTime() const { return ready_.front().ready_at; }
  std::vector<wire::Response> TakeReady();

  // Whether some name has been requested by some but not all ranks.
  bool HasPartial() const { return !pending_.empty(); }
  // When the oldest partial name would time out, or InfiniteFuture.
  absl::Time NextExpiry(absl::Duration op_timeout) const;

  bool AllShutdown() const { return static_cast<int>(shutdown_.size()) == size_; }

  // For diagnostics and tests: names requested by some ranks only.
  std::vector<std::string> PendingNames() const;

 private:
  struct Pending {
    std::vector<std::optional<wire::Request>> by_rank;
    int count = 0;
    absl::Time first_seen;
  };
  struct Ready {
    wire::Response response;
    absl::Time ready_at;
  };
  void MakeReady(const std::string& name, Pending& pending, absl::Time now);
  void FailPending(const std::string& name, const Pending& pending,
                   int code, const std::string& message, absl::Time now);
  // "ranks [1, 3]" of `pending` that have (or have not) submitted.
  std::string RanksWhere(const Pending& pending, bool submitted) const;

  const int size_;
  std::map<std::string, Pending> pending_;
  std::deque<Ready> ready_;
  std::set<int> shutdown_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_CONTROLLER_H_
