#include "runtime/host_relay.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "kolo/runtime.h"
#include "runtime/response_cache.h"

namespace kolo {

HostBatch::HostBatch(std::vector<int> host_ranks)
    : host_(std::move(host_ranks)),
      anded_(host_.size() <= 64),
      all_(host_.size() >= 64 ? ~uint64_t{0}
                              : (uint64_t{1} << host_.size()) - 1) {}

void HostBatch::Add(int rank, wire::RequestList list, absl::Time now) {
  if (list.process_set() != kGlobalProcessSet || list.requests_size() > 0 ||
      list.shutdown()) {
    only_hits_ = false;
  }
  wire::RelayedList& relayed = lists_.emplace_back();
  relayed.set_rank(rank);
  relayed.mutable_list()->Swap(&list);
  since_ = std::min(since_, now);
}

void HostBatch::CountHits() {
  batch_.clear();
  if (!anded_) return;
  for (const wire::RelayedList& relayed : lists_) {
    if (relayed.list().process_set() != kGlobalProcessSet) continue;
    const auto at = std::lower_bound(host_.begin(), host_.end(), relayed.rank());
    const uint64_t bit = uint64_t{1} << (at - host_.begin());
    ForEachCacheHit(relayed.list(), [&](int64_t id) { batch_[id] |= bit; });
  }
}

absl::flat_hash_map<int64_t, uint64_t>::iterator HostBatch::SplitRound(
    int64_t id, uint64_t mask) {
  auto it = split_.find(id);
  // A rank that sends the id again has seen its last round run: a new one.
  if (it != split_.end() && (it->second & mask) != 0) return split_.end();
  return it;
}

absl::Time HostBatch::Due(absl::Duration hold, bool in_join) {
  if (lists_.empty()) return absl::InfiniteFuture();
  if (!only_hits_ || in_join || !anded_ || hold <= absl::ZeroDuration()) {
    return absl::InfinitePast();
  }
  CountHits();
  for (const auto& [id, mask] : batch_) {
    if (mask != all_ && SplitRound(id, mask) == split_.end()) {
      return since_ + hold;  // waits for a rank of the host
    }
  }
  return absl::InfinitePast();
}

void HostBatch::Take(wire::HostRequests* out, int64_t* host_hits) {
  CountHits();
  host_ids_.clear();
  for (const auto& [id, mask] : batch_) {
    auto it = SplitRound(id, mask);
    if (it == split_.end()) {
      split_.erase(id);  // (A round that ended, if any.)
      if (mask == all_) {
        host_ids_.push_back(id);
      } else {
        split_.emplace(id, mask);
      }
    } else if ((it->second |= mask) == all_) {
      split_.erase(it);
    }
  }
  for (int r : host_) out->add_ranks(r);
  *host_hits = static_cast<int64_t>(host_ids_.size());
  if (!host_ids_.empty()) {
    std::sort(host_ids_.begin(), host_ids_.end());
    // Any sender's ack will do for the coordinator's errors (an id is
    // taken by an error for every rank that sent it or for none).
    int64_t acked = std::numeric_limits<int64_t>::max();
    for (wire::RelayedList& relayed : lists_) {
      wire::RequestList& list = *relayed.mutable_list();
      if (list.process_set() != kGlobalProcessSet) continue;
      keep_.clear();
      bool had = false;
      ForEachCacheHit(list, [&](int64_t id) {
        if (std::binary_search(host_ids_.begin(), host_ids_.end(), id)) {
          had = true;
        } else {
          keep_.push_back(id);
        }
      });
      if (!had) continue;
      acked = std::min(acked, list.acked_seq());
      list.clear_cached_ids();
      list.clear_hit_base();
      list.clear_hit_bits();
      AddCacheHits(&keep_, &list);
    }
    wire::RequestList& hits = *out->mutable_host_hits();
    hits.set_process_set(kGlobalProcessSet);
    hits.set_acked_seq(acked);
    AddCacheHits(&host_ids_, &hits);
  }
  for (wire::RelayedList& relayed : lists_) {
    const wire::RequestList& list = relayed.list();
    if (list.process_set() == kGlobalProcessSet && list.requests_size() == 0 &&
        !list.shutdown() && list.cached_ids_size() == 0 &&
        list.hit_bits_size() == 0) {
      // Nothing left but its ack (a rank's acks only grow).
      wire::RankAck* ack = out->add_acks();
      ack->set_rank(relayed.rank());
      ack->set_acked_seq(list.acked_seq());
      continue;
    }
    out->add_lists()->Swap(&relayed);
  }
  lists_.clear();
  since_ = absl::InfiniteFuture();
  only_hits_ = true;
}

void HostBatch::ForgetRounds(const std::function<bool(int64_t)>& gone) {
  for (auto it = split_.begin(); it != split_.end();) {
    if (gone(it->first)) {
      split_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace kolo
