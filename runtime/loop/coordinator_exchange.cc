// CoordinatorExchange (coordinator_exchange.h), and what the transports
// share (hit_exchange.h): their last step, the log of lists in arrival
// order.
#include "runtime/loop/coordinator_exchange.h"

#include <utility>

#include "runtime/negotiation/response_cache.h"

namespace kolo {

absl::Status SendToCoordinator(ControlLink* control, wire::RequestList list,
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

void HitExchange::Execute(bool* done, bool* handed_back) {
  while (!arrived_.empty()) {
    const wire::ResponseList& list = arrived_.front();
    if (handed_back && !runner_->CallerMayRun(list)) {
      *handed_back = true;
      return;
    }
    runner_->ExecuteList(list.process_set(), list);
    if (list.shutdown() && list.process_set() == kGlobalProcessSet) {
      *done = true;
    }
    arrived_.pop_front();
    if (*done || runner_->failed()) return;
  }
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
