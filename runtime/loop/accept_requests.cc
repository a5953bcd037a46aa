// The coordinator's taking of request lists: a rank's own, and those a
// host leader relays (Note [Host relay] in control/control_plane.h).
// Methods of BackgroundLoop (background_loop.h).
#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/loop/background_loop.h"

namespace kolo {

bool BackgroundLoop::AcceptRequestList(int from, wire::RequestList list,
                                       absl::Time now) {
  std::shared_ptr<ProcessSetState> set = sets_.Find(list.process_set());
  auto me = set ? std::find(set->ranks.begin(), set->ranks.end(), from)
                : std::vector<int>::iterator();
  if (!set || me == set->ranks.end()) {
    Fatal(absl::InternalError(
        absl::StrCat("rank ", from, " sent requests for process set ",
                     list.process_set(), " it is not a member of")));
    return false;
  }
  // Note [Hits on the board]: nothing is half there, half here.
  if (set->id == kGlobalProcessSet) {
    exchange_->Received(*set->coordinator, from, now);
  }
  set->coordinator->AddRequests(static_cast<int>(me - set->ranks.begin()),
                                std::move(list), now);
  return true;
}

bool BackgroundLoop::AcceptHostRequests(int from, wire::HostRequests& message,
                                        absl::Time now) {
  ++counters_.host_messages_received;
  if (!host_messages_) {
    Fatal(absl::InternalError(absl::StrCat(
        "rank ", from, " relayed requests, but this job has no host leaders")));
    return false;
  }
  const absl::Status accepted = host_messages_->Accept(
      from, message, *sets_.global().coordinator,
      [&](int rank, wire::RequestList list) {
        return AcceptRequestList(rank, std::move(list), now);
      },
      now);
  // (A refused list failed the job already.)
  if (!accepted.ok() && !absl::IsAborted(accepted)) Fatal(accepted);
  return accepted.ok();
}

}  // namespace kolo
