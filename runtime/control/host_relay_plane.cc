// The control plane's side of the host relay (Note [Host relay] in
// control_plane.h): the host's segment, the leader's reading of its
// rings, a rank's writing into its ring without blocking, the leader
// saying it stopped.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/control/control_internal.h"
#include "runtime/control/control_plane.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/status_macros.h"

namespace kolo {

using control_internal::kMaxControlFrame;
using control_internal::RankLostError;

bool ControlPlane::DrainHost(ShmControlSegment& host) {
  std::vector<std::string> frames;
  for (int peer = 1; peer < host.size(); ++peer) {
    frames.clear();
    absl::Status s = host.up(peer).ReadAll(&frames);
    const int from = host_ranks_[peer];
    if (host.waiting_for_room(peer)) host.Notify(peer);  // (read: room)
    for (std::string& frame : frames) {
      wire::ControlMessage message;
      if (!message.ParseFromString(frame) || !message.has_request_list()) {
        s = absl::DataLossError("malformed control message");
        break;
      }
      if (rank_ == 0 && message.request_list().shutdown()) {
        MutexLock lock(&mu_);
        leaving_[from] = true;
      }
      shm_events_.push_back({from, std::move(message)});
    }
    if (!s.ok()) {
      if (rank_ == 0) {
        PeerLost(from, std::string(s.message()));
      } else if (!closed_ && !shutting_down_ &&
                 !lost_reported_.exchange(true)) {
        callbacks_.on_fatal(RankLostError(
            from, absl::StrCat("rank ", from, " lost: ", s.message(),
                               " (reported by its host's leader, rank ", rank_,
                               ")")));
      }
      return false;
    }
  }
  return true;
}

absl::Status ControlPlane::EnableHostRelay(Store& store, absl::Time deadline,
                                           const std::vector<int>& host_ranks,
                                           bool enable) {
  const auto me = std::find(host_ranks.begin(), host_ranks.end(), rank_);
  if (host_ranks.size() < 2 || me == host_ranks.end() || shm_.load()) {
    return absl::OkStatus();
  }
  const int index = static_cast<int>(me - host_ranks.begin());
  const int local = static_cast<int>(host_ranks.size());
  const std::string prefix = absl::StrCat("control/host/", host_ranks[0], "/");
  const absl::Duration timeout =
      std::max(absl::ZeroDuration(), deadline - absl::Now());
  std::unique_ptr<ShmControlSegment> segment;
  if (index == 0) {
    std::string name;
    absl::StatusOr<std::unique_ptr<ShmControlSegment>> created =
        absl::UnavailableError("the host relay is off");
    if (enable) {
      created = ShmControlSegment::Create(0, local, kMaxControlFrame, &name);
    }
    absl::Status s = store.Set(prefix + "name", created.ok() ? name : "");
    if (!s.ok()) {
      if (created.ok()) ShmControlSegment::Unlink(name);
      return s;
    }
    bool all = created.ok();
    for (int i = 1; i < local && created.ok(); ++i) {
      auto attached = store.Get(absl::StrCat(prefix, "attached/", i), timeout);
      if (!attached.ok()) {
        ShmControlSegment::Unlink(name);
        return attached.status();
      }
      all = all && *attached == "1";
    }
    if (created.ok()) ShmControlSegment::Unlink(name);
    KOLO_RETURN_IF_ERROR(store.Set(prefix + "use", all ? "1" : "0"));
    if (all) segment = std::move(*created);
  } else {
    auto name = store.Get(prefix + "name", timeout);
    if (!name.ok()) return name.status();
    if (name->empty()) return absl::OkStatus();  // Off on this host.
    auto opened =
        ShmControlSegment::Open(*name, index, local, kMaxControlFrame);
    KOLO_RETURN_IF_ERROR(store.Set(absl::StrCat(prefix, "attached/", index),
                                   opened.ok() ? "1" : "0"));
    auto use = store.Get(prefix + "use", timeout);
    if (!use.ok()) return use.status();
    if (*use == "1" && opened.ok()) segment = std::move(*opened);
  }
  if (segment) {
    host_ranks_ = host_ranks;
    host_index_ = index;
    host_owner_ = std::move(segment);
    host_.store(host_owner_.get());
  }
  return absl::OkStatus();
}

void ControlPlane::PushHostOut() {
  ShmControlSegment* host = host_.load();
  if (!host || host_out_.empty()) return;
  ShmRing& ring = host->up(host_index_);
  bool wrote = false;
  for (int attempt = 0; attempt < 2 && !host_out_.empty(); ++attempt) {
    while (!host_out_.empty()) {
      const size_t before = host_out_offset_;
      const bool done = ring.TryWrite(host_out_.front(), &host_out_offset_);
      wrote = wrote || host_out_offset_ != before;
      if (!done) break;
      host_out_.pop_front();
      host_out_offset_ = 0;
    }
    // Full: ask the leader to ring back once it has read, then look again
    // (it may have read in between, before it could see the request).
    host->SetWaitingForRoom(host_index_, !host_out_.empty());
  }
  if (wrote || !host_out_.empty()) host->Notify(0);
}

absl::Status ControlPlane::HostLeaderStatus() const {
  ShmControlSegment* host = host_.load();
  if (!host || host_index_ == 0 || !host->stopped(0)) return absl::OkStatus();
  const int leader = host_ranks_[0];
  return RankLostError(leader, absl::StrCat("rank ", leader,
                                            ", this host's leader, stopped "
                                            "relaying its ranks' requests"));
}

void ControlPlane::StopHostRelay() {
  ShmControlSegment* host = host_.load();
  if (!host || host_index_ != 0) return;
  host->SetStopped(0);
  for (int i = 1; i < host->size(); ++i) host->Notify(i);
}

}  // namespace kolo
