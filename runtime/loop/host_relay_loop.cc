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
    CloseBoard(*set, now);
    ++board_received_[from];
  }
  set->coordinator->AddRequests(static_cast<int>(me - set->ranks.begin()),
                                std::move(list), now);
  return true;
}

bool RuntimeImpl::AcceptHostRequests(int from, wire::HostRequests& message,
                                     absl::Time now) {
  ++counters_.host_messages_received;
  // A leader speaks for exactly the ranks of its host.
  const int size = options_.size;
  auto on_host = [&](int r) {
    return r >= 0 && r < size && !host_leader_of_.empty() &&
           host_leader_of_[r] == from;
  };
  auto expected = host_size_of_leader_.find(from);
  bool ok = on_host(from) && expected != host_size_of_leader_.end() &&
            message.ranks_size() == expected->second &&
            message.ranks(0) == from;
  std::vector<int> ranks;
  for (int r : message.ranks()) {
    ok = ok && on_host(r) && (ranks.empty() || r > ranks.back());
    ranks.push_back(r);
  }
  for (const wire::RelayedList& l : message.lists())
    ok = ok && on_host(l.rank());
  for (const wire::RankAck& a : message.acks()) ok = ok && on_host(a.rank());
  if (!ok) {
    Fatal(absl::InternalError(
        absl::StrCat("rank ", from,
                     " relayed requests for ranks that are not on its host")));
    return false;
  }
  std::shared_ptr<ProcessSetState> global;
  {
    MutexLock lock(&sets_mu_);
    global = sets_.at(kGlobalProcessSet);
  }
  for (const wire::RequestList& hits : message.host_hits()) {
    global->coordinator->AddHostHits(ranks, hits, now);
  }
  for (wire::RelayedList& l : *message.mutable_lists()) {
    if (!AcceptRequestList(l.rank(), std::move(*l.mutable_list()), now)) {
      return false;
    }
  }
  if (message.acks_size() > 0) {
    relay_acks_.clear();
    for (const wire::RankAck& a : message.acks()) {
      relay_acks_.emplace_back(a.rank(), a.acked_seq());
    }
    global->coordinator->AddAcks(relay_acks_);
  }
  return true;
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
    std::shared_ptr<ProcessSetState> global;
    {
      MutexLock lock(&sets_mu_);
      global = sets_.at(kGlobalProcessSet);
    }
    // An id this rank's cache no longer has: the host's ranks, which run
    // the same lists, will not send it again (a wrong guess costs a hold).
    relay_->ForgetRounds(
        [&](int64_t id) { return !global->cache->IsCurrent(id); });
  }
}

}  // namespace kolo
