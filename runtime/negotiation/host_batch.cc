#include "runtime/negotiation/host_batch.h"

#include <algorithm>
#include <utility>

#include "kolo/runtime.h"
#include "runtime/negotiation/response_cache.h"

namespace kolo {

HostBatch::HostBatch(std::vector<int> host_ranks)
    : host_(std::move(host_ranks)),
      anded_(host_.size() <= 64),
      all_(host_.size() >= 64 ? ~uint64_t{0}
                              : (uint64_t{1} << host_.size()) - 1),
      in_join_(host_.size(), false) {}

int HostBatch::Index(int rank) const {
  return static_cast<int>(std::lower_bound(host_.begin(), host_.end(), rank) -
                          host_.begin());
}

void HostBatch::Add(int rank, wire::RequestList list, absl::Time now) {
  if (list.process_set() != kGlobalProcessSet || list.requests_size() > 0 ||
      list.shutdown()) {
    only_hits_ = false;
  }
  if (list.process_set() == kGlobalProcessSet) {
    bool join = false;
    for (const wire::Request& r : list.requests()) {
      join = join || r.type() == wire::JOIN;
    }
    const int i = Index(rank);
    if (i < static_cast<int>(in_join_.size())) in_join_[i] = join;
  }
  counted_ = false;
  wire::RelayedList& relayed = lists_.emplace_back();
  relayed.set_rank(rank);
  relayed.mutable_list()->Swap(&list);
  since_ = std::min(since_, now);
}

void HostBatch::CountHits() {
  if (counted_) return;  // (Due counted, nothing came since)
  counted_ = true;
  batch_.clear();
  if (!anded_) return;
  for (const wire::RelayedList& relayed : lists_) {
    if (relayed.list().process_set() != kGlobalProcessSet) continue;
    const uint64_t bit = uint64_t{1} << Index(relayed.rank());
    const int64_t acked = relayed.list().acked_seq();
    ForEachCacheHit(relayed.list(), [&](int64_t id) {
      Carried& c = batch_[id];
      if (c.mask == 0) {
        c.acked = acked;
      } else if (c.acked != acked) {
        c.mixed = true;
      }
      c.mask |= bit;
    });
  }
}

absl::flat_hash_map<int64_t, uint64_t>::iterator HostBatch::SplitRound(
    int64_t id, uint64_t mask) {
  auto it = split_.find(id);
  // A rank that sends the id again has seen its last round run: a new one.
  if (it != split_.end() && (it->second & mask) != 0) return split_.end();
  return it;
}

absl::Time HostBatch::Due(absl::Duration hold) {
  if (lists_.empty()) return absl::InfiniteFuture();
  const bool in_join =
      std::find(in_join_.begin(), in_join_.end(), true) != in_join_.end();
  if (!only_hits_ || in_join || !anded_ || hold <= absl::ZeroDuration()) {
    return absl::InfinitePast();
  }
  CountHits();
  for (const auto& [id, c] : batch_) {
    if (c.mask != all_ && SplitRound(id, c.mask) == split_.end()) {
      return since_ + hold;  // waits for a rank of the host
    }
  }
  return absl::InfinitePast();
}

void HostBatch::Take(wire::HostRequests* out, int64_t* host_hits) {
  CountHits();
  host_ids_.clear();
  for (const auto& [id, c] : batch_) {
    auto it = SplitRound(id, c.mask);
    if (it == split_.end()) {
      split_.erase(id);  // (A round that ended, if any.)
      if (c.mask == all_ && !c.mixed) {
        host_ids_.emplace_back(c.acked, id);
      } else {
        split_.emplace(id, c.mask);
      }
    } else if ((it->second |= c.mask) == all_) {
      split_.erase(it);
    }
  }
  for (int r : host_) out->add_ranks(r);
  *host_hits = static_cast<int64_t>(host_ids_.size());
  if (!host_ids_.empty()) {
    std::sort(host_ids_.begin(), host_ids_.end());
    auto is_host_id = [&](int64_t id) {
      auto it = batch_.find(id);
      return it != batch_.end() &&
             std::binary_search(host_ids_.begin(), host_ids_.end(),
                                std::make_pair(it->second.acked, id));
    };
    for (wire::RelayedList& relayed : lists_) {
      wire::RequestList& list = *relayed.mutable_list();
      if (list.process_set() != kGlobalProcessSet) continue;
      keep_.clear();
      bool had = false;
      ForEachCacheHit(list, [&](int64_t id) {
        if (is_host_id(id)) {
          had = true;
        } else {
          keep_.push_back(id);
        }
      });
      if (!had) continue;
      list.clear_cached_ids();
      list.clear_hit_base();
      list.clear_hit_bits();
      AddCacheHits(&keep_, &list);
    }
    // One list per acked_seq (usually one: the host's ranks have run the
    // same lists), with that ack for the coordinator's errors.
    for (size_t i = 0; i < host_ids_.size();) {
      const int64_t acked = host_ids_[i].first;
      group_.clear();
      for (; i < host_ids_.size() && host_ids_[i].first == acked; ++i) {
        group_.push_back(host_ids_[i].second);
      }
      wire::RequestList& hits = *out->add_host_hits();
      hits.set_process_set(kGlobalProcessSet);
      hits.set_acked_seq(acked);
      AddCacheHits(&group_, &hits);
    }
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
  counted_ = false;
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

HostMessages::HostMessages(std::vector<int> leader_of)
    : leader_of_(std::move(leader_of)), host_size_(leader_of_.size(), 0) {
  for (int l : leader_of_) {
    if (l >= 0 && l < static_cast<int>(host_size_.size())) ++host_size_[l];
  }
}

absl::Status HostMessages::Accept(
    int leader, wire::HostRequests& message, Coordinator& global,
    const std::function<bool(int rank, wire::RequestList list)>& add_list,
    absl::Time now) {
  // A leader speaks for exactly the ranks of its host.
  bool ok = OnHost(leader, leader) && message.ranks_size() > 0 &&
            message.ranks_size() == host_size_[leader] &&
            message.ranks(0) == leader;
  ranks_.clear();
  for (int r : message.ranks()) {
    ok = ok && OnHost(leader, r) && (ranks_.empty() || r > ranks_.back());
    ranks_.push_back(r);
  }
  for (const wire::RelayedList& l : message.lists()) {
    ok = ok && OnHost(leader, l.rank());
  }
  for (const wire::RankAck& a : message.acks()) {
    ok = ok && OnHost(leader, a.rank());
  }
  if (!ok) {
    return absl::InternalError(
        absl::StrCat("rank ", leader,
                     " relayed requests for ranks that are not on its host"));
  }
  for (const wire::RequestList& hits : message.host_hits()) {
    global.AddHostHits(ranks_, hits, now);
  }
  for (wire::RelayedList& l : *message.mutable_lists()) {
    if (!add_list(l.rank(), std::move(*l.mutable_list()))) {
      return absl::AbortedError(
          absl::StrCat("a list relayed by rank ", leader, " was refused"));
    }
  }
  if (message.acks_size() > 0) {
    acks_.clear();
    for (const wire::RankAck& a : message.acks()) {
      acks_.emplace_back(a.rank(), a.acked_seq());
    }
    global.AddAcks(acks_);
  }
  return absl::OkStatus();
}

}  // namespace kolo
