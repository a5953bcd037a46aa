// CoordinatorExchange (coordinator_exchange.h), and the transports' common
// last step (hit_exchange.h).
#include "runtime/loop/coordinator_exchange.h"

#include <utility>

#include "runtime/negotiation/response_cache.h"

namespace kolo {

absl::Status SendToCoordinator(ControlPlane* control, wire::RequestList list,
                               Coordinator* coordinator, int set_rank,
                               absl::Time now) {
  if (coordinator) {
    coordinator->AddRequests(set_rank, std::move(list), now);
    return absl::OkStatus();
  }
  wire::ControlMessage message;
  *message.mutable_request_list() = std::move(list);
  return control->SendToCoordinator(message);
}

absl::StatusOr<bool> CoordinatorExchange::Send(wire::RequestList list,
                                               std::vector<int64_t>* hits,
                                               Coordinator* coordinator,
                                               int set_rank, absl::Time now) {
  if (!hits->empty()) AddCacheHits(hits, &list);
  absl::Status sent =
      SendToCoordinator(control_, std::move(list), coordinator, set_rank, now);
  if (!sent.ok()) return sent;
  return true;
}

}  // namespace kolo
