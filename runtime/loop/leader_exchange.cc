// LeaderExchange (leader_exchange.h): a host leader's sending on of its
// host's request lists (Note [Host relay] in runtime/control/control_plane.h).
#include "runtime/loop/leader_exchange.h"

#include <algorithm>
#include <utility>

#include "runtime/negotiation/response_cache.h"

namespace kolo {

LeaderExchange::LeaderExchange(std::vector<int> host_ranks,
                               ControlPlane* control, Runner* runner,
                               Batching batching)
    : HitExchange(runner),
      rank_(host_ranks.at(0)),
      batch_(std::move(host_ranks)),
      control_(control),
      batching_(std::move(batching)) {}

absl::StatusOr<bool> LeaderExchange::Send(wire::RequestList list,
                                          std::vector<int64_t>* hits,
                                          Coordinator* coordinator,
                                          int set_rank, absl::Time now) {
  if (!hits->empty()) AddCacheHits(hits, &list);
  batch_.Add(rank_, std::move(list), now);  // sent by Relay
  return true;
}

void LeaderExchange::AddCounters(
    std::map<std::string, int64_t>* counters) const {
  (*counters)["relay.host_messages_sent"] = messages_sent_.load();
  (*counters)["relay.host_hits_sent"] = hits_sent_.load();
}

absl::Status LeaderExchange::Relay(std::vector<ControlEvent>* events,
                                   absl::Time now, absl::Time* next_wakeup) {
  // The host's lists go on with this rank's own.
  for (ControlEvent& event : *events) {
    if (!event.message.has_request_list()) continue;
    batch_.Add(event.from_rank,
               std::move(*event.message.mutable_request_list()), now);
    event.message.Clear();
  }
  const absl::Time due = batch_.Due(batching_.hold);
  if (now < due) {
    *next_wakeup = std::min(*next_wakeup, due);
    return absl::OkStatus();
  }
  wire::ControlMessage message;
  int64_t host_hits = 0;
  batch_.Take(message.mutable_host_requests(), &host_hits);
  hits_sent_ += host_hits;
  // A message stays well under the control channel's frame limit: a large
  // batch (a first step's full requests from many ranks) goes as several,
  // in order (the hits in the first, the acks in the last, as in one).
  constexpr size_t kMaxBytes = 16u << 20;
  std::vector<wire::ControlMessage> messages;
  if (message.ByteSizeLong() > kMaxBytes) {
    wire::HostRequests& all = *message.mutable_host_requests();
    wire::ControlMessage part;
    *part.mutable_host_requests()->mutable_ranks() = all.ranks();
    part.mutable_host_requests()->mutable_host_hits()->Swap(
        all.mutable_host_hits());
    size_t bytes = 0;
    for (wire::RelayedList& l : *all.mutable_lists()) {
      const size_t n = l.ByteSizeLong();
      if (bytes > 0 && bytes + n > kMaxBytes) {
        messages.push_back(std::move(part));
        part = wire::ControlMessage();
        *part.mutable_host_requests()->mutable_ranks() = all.ranks();
        bytes = 0;
      }
      part.mutable_host_requests()->add_lists()->Swap(&l);
      bytes += n;
    }
    part.mutable_host_requests()->mutable_acks()->Swap(all.mutable_acks());
    messages.push_back(std::move(part));
  } else {
    messages.push_back(std::move(message));
  }
  for (const wire::ControlMessage& m : messages) {
    ++messages_sent_;
    absl::Status s = control_->SendToCoordinator(m);
    if (!s.ok()) return s;
  }
  if (batch_.rounds() >
      2 * static_cast<size_t>(batching_.cache_capacity) + 64) {
    // A wrong guess costs a hold.
    batch_.ForgetRounds(batching_.gone);
  }
  return absl::OkStatus();
}

}  // namespace kolo
