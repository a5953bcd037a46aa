// The host relay's part of the background loop (Note [Host relay] in
// control/control_plane.h): a leader's sending on of its host's lists, and
// the coordinator's taking of request lists, its own host's and the
// leaders' messages. Methods of RuntimeImpl (runtime_impl.h).
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/loop/runtime_impl.h"
#include "runtime/sync/mutex.h"

namespace kolo {

bool RuntimeImpl::AcceptRequestList(int from, wire::RequestList list,
                                    absl::Time now) {
  std::shared_ptr<ProcessSetState> set;
  {
    MutexLock lock(&sets_mu_);
    auto it = sets_.find(list.process_set());
    if (it != sets_.end()) set = it->second;
  }
  auto me = set ? std::find(set->ranks.begin(), set->ranks.end(), from)
                : std::vector<int>::iterator();
  if (!set || me == set->ranks.end()) {
    Fatal(absl::InternalError(
        absl::StrCat("rank ", from, " sent requests for process set ",
                     list.process_set(), " it is not a member of")));
    return false;
  }
  if (board_ && set->id == kGlobalProcessSet) {
    // Note [Hits on the board]: nothing is half there, half here.
    board_->Received(*set->coordinator, from, now);
  }
  set->coordinator->AddRequests(static_cast<int>(me - set->ranks.begin()),
                                std::move(list), now);
  return true;
}

bool RuntimeImpl::AcceptHostRequests(int from, wire::HostRequests& message,
                                     absl::Time now) {
  ++counters_.host_messages_received;
  if (!host_messages_) {
    Fatal(absl::InternalError(absl::StrCat(
        "rank ", from, " relayed requests, but this job has no host leaders")));
    return false;
  }
  const absl::Status accepted = host_messages_->Accept(
      from, message, *global_->coordinator,
      [&](int rank, wire::RequestList list) {
        return AcceptRequestList(rank, std::move(list), now);
      },
      now);
  // (A refused list failed the job already.)
  if (!accepted.ok() && !absl::IsAborted(accepted)) Fatal(accepted);
  return accepted.ok();
}

void RuntimeImpl::FlushRelay(absl::Time now, absl::Time* next_wakeup) {
  const absl::Time due = relay_->Due(options_.cycle_time);
  if (now < due) {
    *next_wakeup = std::min(*next_wakeup, due);
    return;
  }
  wire::ControlMessage message;
  int64_t host_hits = 0;
  relay_->Take(message.mutable_host_requests(), &host_hits);
  counters_.host_hits_sent += host_hits;
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
    ++counters_.host_messages_sent;
    absl::Status s = control_->SendToCoordinator(m);
    if (!s.ok()) {
      Fatal(s);
      return;
    }
  }
  if (relay_->rounds() >
      2 * static_cast<size_t>(options_.cache_capacity) + 64) {
    // An id this rank's cache no longer has: the host's ranks, which run
    // the same lists, will not send it again (a wrong guess costs a hold).
    relay_->ForgetRounds(
        [&](int64_t id) { return !global_->cache->IsCurrent(id); });
  }
}

}  // namespace kolo
