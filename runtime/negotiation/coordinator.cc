#include "runtime/negotiation/coordinator.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/negotiation/collectives.h"
#include "runtime/negotiation/fusion.h"
#include "runtime/util/format.h"

namespace kolo {
namespace {

constexpr char kJoinName[] = "__kolo_join__";

bool IsData(const wire::Response& r) {
  return r.type() != wire::RESPONSE_ERROR;
}

// A response made here (not the cache's) for a Ready.
std::shared_ptr<const wire::Response> Built(wire::Response response) {
  return std::make_shared<const wire::Response>(std::move(response));
}

}  // namespace

Coordinator::Coordinator(Config config)
    : config_(std::move(config)),
      size_(static_cast<int>(config_.global_ranks.size())),
      cache_(config_.cache_capacity),
      hits_(config_.cache_capacity),
      acked_(size_, 0) {}

std::string Coordinator::RankLabel(int rank) const {
  return absl::StrCat(config_.global_ranks[rank]);
}

void Coordinator::AddRequests(int rank, wire::RequestList list,
                              absl::Time now) {
  acked_[rank] = std::max(acked_[rank], list.acked_seq());
  ForgetAcknowledged();
  // Note [Requests an error will take]
  // An error response fails, on each rank, whatever entry of that name the
  // rank holds when it executes the error's list, a request it submitted
  // after the coordinator made the error included. Such a request (sent
  // before the rank executed that list: its acked_seq is older, or before
  // the list was even sent: TakeResponseList drops those) is the error's
  // on the rank, so it must not count here, or the name would run later
  // without that rank's entry.
  auto taken_by_error = [&](const std::string& name) {
    return TakenByError(name, list.acked_seq());
  };
  const bool bits = BitsAllowed();
  ForEachCacheHit(list, [&](int64_t id) {
    ++cache_hits_received_;
    if (Hits* hits = bits ? FastHits(id) : nullptr) {
      AddHit(rank, id, *hits, now);
      return;
    }
    std::shared_ptr<const wire::Request> request = cache_.Find(id);
    if (!request) return;  // Cannot happen: ids outlive every ack.
    if (taken_by_error(request->name())) return;
    Add(rank, std::move(request), id, now);
  });
  for (wire::Request& request : *list.mutable_requests()) {
    ++requests_received_;
    if (request.type() == wire::JOIN) {
      AddJoin(rank, now);
    } else if (taken_by_error(request.name())) {
      continue;
    } else {
      Add(rank, std::make_shared<const wire::Request>(std::move(request)), -1,
          now);
    }
  }
  if (list.shutdown() && !shutdown_.count(rank)) {
    // Partly sent hits move to the slow path before the rank counts as
    // gone, each as one name (the slow path fails names a departed rank
    // never submitted as they arrive).
    MaterializeHits();
    shutdown_.insert(rank);
    for (absl::string_view name : SortedPendingNames()) {
      auto it = pending_.find(name);
      if (it->second.by_rank[rank] || !Awaits(it->second, rank)) continue;
      FailPending(it->first, it->second, absl::StatusCode::kAborted,
                  absl::StrCat("rank ", RankLabel(rank),
                               " shut down without submitting it"),
                  now);
      ErasePending(it);
    }
  }
}

Coordinator::Hits* Coordinator::FastHits(int64_t id) {
  // One subtraction in steady state: an id in hits_ that is not slow is
  // current (ForgetEvictedHits drops the others).
  Hits* hits = hits_.Find(id);
  if (!hits && cache_.IsCurrent(id)) hits = &hits_.Get(id);
  return hits && !hits->slow ? hits : nullptr;
}

void Coordinator::ForgetAcknowledged() {
  if (cache_.graveyard_size() == 0 && recent_errors_.empty()) return;
  // O(ranks): only when there is work.
  const int64_t all_acked = *std::min_element(acked_.begin(), acked_.end());
  if (cache_.graveyard_size() > 0) cache_.PruneGraveyard(all_acked);
  for (auto it = recent_errors_.begin(); it != recent_errors_.end();) {
    it = it->second <= all_acked ? recent_errors_.erase(it) : std::next(it);
  }
}

void Coordinator::AddAcks(const std::vector<std::pair<int, int64_t>>& acks) {
  for (const auto& [rank, seq] : acks) {
    acked_[rank] = std::max(acked_[rank], seq);
  }
  ForgetAcknowledged();
}

bool Coordinator::TakenByError(const std::string& name,
                               int64_t acked_seq) const {
  if (recent_errors_.empty()) return false;
  auto it = recent_errors_.find(name);
  return it != recent_errors_.end() && it->second > acked_seq;
}

void Coordinator::AddHostHits(const std::vector<int>& ranks,
                              const wire::RequestList& list, absl::Time now) {
  if (ranks.empty()) return;
  RankWords words;
  for (int r : ranks) {
    const int w = r >> 6;
    const uint64_t bit = uint64_t{1} << (r & 63);
    if (!words.empty() && words.back().first == w) {
      words.back().second |= bit;
    } else {
      words.emplace_back(w, bit);
    }
  }
  const bool bits = BitsAllowed();
  ForEachCacheHit(list, [&](int64_t id) {
    cache_hits_received_ += static_cast<int64_t>(ranks.size());
    if (Hits* hits = bits ? FastHits(id) : nullptr) {
      AddHits(words, id, *hits, now);
      return;
    }
    // Each rank as if its own list had carried the id.
    std::shared_ptr<const wire::Request> request = cache_.Find(id);
    if (!request) return;  // Cannot happen: ids outlive every ack.
    if (TakenByError(request->name(), list.acked_seq())) return;
    for (int r : ranks) Add(r, request, id, now);
  });
}

void Coordinator::AddHits(const RankWords& words, int64_t id, Hits& hits,
                          absl::Time now) {
  if (ABSL_PREDICT_FALSE(hits.ranks.empty())) {
    hits.ranks.assign((size_ + 63) / 64, 0);
  }
  int added = 0;
  for (const auto& [w, mask] : words) {
    const uint64_t fresh = mask & ~hits.ranks[w];
    hits.ranks[w] |= fresh;
    added += __builtin_popcountll(fresh);
  }
  if (added == 0) return;
  if (hits.count == 0) FirstHit(id, hits, now);
  hits.count += added;
  if (hits.count == size_) HitEverywhere(id, hits, now);
}

std::vector<absl::string_view> Coordinator::SortedPendingNames() const {
  std::vector<absl::string_view> names;
  names.reserve(pending_.size());
  for (const auto& [name, p] : pending_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

void Coordinator::ErasePending(PendingMap::iterator it) {
  if (it->second.hit_id >= 0) {
    const int64_t id = it->second.hit_id;
    if (Hits* hits = hits_.Find(id)) {
      hits->slow = false;
      if (!cache_.IsCurrent(id)) hits_.Erase(id);
    }
  }
  if (it->second.stall_reported) --stall_reported_;
  if (it->second.first_seen <= oldest_) oldest_stale_ = true;
  pending_.erase(it);
}

absl::Time Coordinator::OldestPending() const {
  if (oldest_stale_) {
    oldest_ = absl::InfiniteFuture();
    for (const auto& [name, p] : pending_)
      oldest_ = std::min(oldest_, p.first_seen);
    oldest_stale_ = false;
  }
  return std::min(oldest_, OldestHit());
}

// Note [Cache hits as bits]
// In steady state every rank sends cache ids only, and a name is ready
// when every rank of the set has sent its id. The coordinator counts that
// without per-name work: per cache id one bit per rank (which ranks sent
// it this round) and their count; the id is ready when the count reaches
// the set's size, and its response is the cached one (no validation, no
// copy: every rank's request equals the cached request, validated when it
// entered the cache). No name is hashed and no slot per rank is filled;
// the ready id's bits are cleared for the next round (a rank cannot send
// an id again before it has executed the list that ran it: its queue
// holds one request per name).
// Anything else takes the slow path (a Pending entry per name with a slot
// per rank: validation, error messages, time-outs, stall reports), which
// stays the source of truth: an id whose name is pending there (a rank
// sent a changed request, or an evicted id) goes there too (Hits::slow,
// set while the name is pending), and a partly sent id moves there
// (MaterializeHit, keeping its first bit's time) whenever something only
// the slow path handles concerns it: a full request of its name, its
// eviction, a join, a rank's shutdown, its op time-out or stall report.
// While some rank has joined or shut down, or an error's list is not yet
// executed everywhere (Note [Requests an error will take]), every id takes
// the slow path.
// (The common case, a bit set and counted, stays small enough to be
// inlined; the first bit of a round and the last go out of line.)
inline void Coordinator::AddHit(int rank, int64_t id, Hits& hits,
                                absl::Time now) {
  if (ABSL_PREDICT_FALSE(hits.ranks.empty())) {
    hits.ranks.assign((size_ + 63) / 64, 0);
  }
  uint64_t& word = hits.ranks[rank >> 6];
  const uint64_t bit = uint64_t{1} << (rank & 63);
  if (word & bit) return;  // Sent twice: its queue rejected the second.
  word |= bit;
  if (ABSL_PREDICT_FALSE(hits.count++ == 0)) FirstHit(id, hits, now);
  if (ABSL_PREDICT_FALSE(hits.count == size_)) HitEverywhere(id, hits, now);
}

void Coordinator::FirstHit(int64_t id, Hits& hits, absl::Time now) {
  hits.first_seen = now;
  ++partial_hits_;
  hits_oldest_ = std::min(hits_oldest_, now);
  if (config_.timeline && config_.timeline->enabled()) {
    const std::shared_ptr<const wire::Request> request = cache_.Find(id);
    config_.timeline->Begin(request->name(), NegotiatePhase(request->type()));
  }
}

void Coordinator::HitEverywhere(int64_t id, Hits& hits, absl::Time now) {
  Ready ready;
  ready.ready_at = now;
  ready.cache_id = id;
  ready.response = cache_.SharedResponse(id);
  if (!ready.response || !IsData(*ready.response)) {
    MaterializeHit(id, hits);  // Cannot happen: the slow path decides.
    return;
  }
  ClearHit(hits);
  PushReady(std::move(ready));
}

void Coordinator::ClearHit(Hits& hits) {
  if (hits.count == 0) return;
  hits.count = 0;
  std::fill(hits.ranks.begin(), hits.ranks.end(), 0);
  --partial_hits_;
  if (hits.first_seen <= hits_oldest_) hits_oldest_stale_ = true;
}

void Coordinator::MaterializeHit(int64_t id, Hits& hits) {
  if (hits.count == 0) return;
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if (hits.ranks[r >> 6] >> (r & 63) & 1) ranks.push_back(r);
  }
  const absl::Time first_seen = hits.first_seen;
  ClearHit(hits);
  hits.slow = true;  // Add() below keeps it so while the name is pending.
  std::shared_ptr<const wire::Request> request = cache_.Find(id);
  if (!request) return;  // Cannot happen: ids outlive every ack.
  for (int r : ranks) {
    Add(r, request, id, first_seen, /*begun=*/true);
  }
}

void Coordinator::MaterializeHits() {
  if (partial_hits_ == 0) return;
  const std::vector<int64_t> ids =
      hits_.Ids([](const Hits& h) { return h.count > 0; });
  for (int64_t id : ids) {
    // (An earlier one's Add may have erased it.)
    if (Hits* hits = hits_.Find(id)) MaterializeHit(id, *hits);
  }
}

void Coordinator::ForgetEvictedHits() {
  if (cache_.evictions() == evictions_seen_) return;
  evictions_seen_ = cache_.evictions();
  std::vector<int64_t> evicted;
  for (int64_t id : hits_.Ids([](const Hits&) { return true; })) {
    if (!cache_.IsCurrent(id)) evicted.push_back(id);
  }
  for (int64_t id : evicted) {
    Hits* hits = hits_.Find(id);
    if (!hits) continue;  // (Erased by an earlier one's Add.)
    MaterializeHit(id, *hits);
    hits = hits_.Find(id);
    if (hits && !hits->slow) hits_.Erase(id);
  }
}

absl::Time Coordinator::OldestHit() const {
  if (partial_hits_ == 0) return absl::InfiniteFuture();
  if (hits_oldest_stale_) {
    hits_oldest_ = absl::InfiniteFuture();
    hits_.Ids([&](const Hits& h) {
      if (h.count > 0) hits_oldest_ = std::min(hits_oldest_, h.first_seen);
      return false;
    });
    hits_oldest_stale_ = false;
  }
  return hits_oldest_;
}

void Coordinator::Add(int rank, std::shared_ptr<const wire::Request> request,
                      int64_t cache_id, absl::Time now, bool begun) {
  // The name's current cache id: its partly sent hits join this slot, and
  // its hits come here while the name is pending (Note [Cache hits as
  // bits]).
  const int64_t current_id = cache_.IdOf(request->name());
  if (current_id >= 0) {
    Hits* hits = hits_.Find(current_id);
    if (hits && hits->count > 0) MaterializeHit(current_id, *hits);
  }
  // The key views the name inside `request`, which the entry keeps alive
  // (by_rank[rank] below; a slot is never reassigned).
  auto [it, inserted] =
      pending_.try_emplace(absl::string_view(request->name()));
  Pending& p = it->second;
  if (inserted) {
    p.by_rank.resize(size_);
    p.cache_id.assign(size_, -1);
    p.first_seen = now;
    oldest_ = std::min(oldest_, now);  // (a stale value is rescanned anyway)
    if (config_.timeline && !begun) {
      config_.timeline->Begin(request->name(), NegotiatePhase(request->type()));
    }
    if (current_id >= 0) {
      p.hit_id = current_id;
      hits_.Get(current_id).slow = true;
    }
  }
  if (inserted && request->type() == wire::ADD_MEMBER_PROCESS_SET) {
    // Note [Sets created by their members]
    // A set that torch.distributed's new_group() creates is created by its
    // members alone (the others never call the backend). They submit
    // ADD_MEMBER_PROCESS_SET in the global set; the coordinator waits for
    // the ranks it names, not for every rank, and its response reaches
    // every rank, so that every rank registers the set (members connect
    // its backends). Time-outs and stall reports name missing members only.
    const auto& members = request->member_ranks();
    bool valid = !members.empty();
    for (int i = 0; valid && i < members.size(); ++i) {
      const int m = members[i];
      valid = m >= 0 && m < size_ && (i == 0 || m > members[i - 1]);
      if (valid) p.members.push_back(m);
    }
    if (!valid) {
      p.by_rank[rank] = std::move(request);
      ++p.count;
      FailPending(it->first, p, absl::StatusCode::kInvalidArgument,
                  "the member ranks must be distinct ranks of the job, "
                  "sorted",
                  now);
      ErasePending(it);
      return;
    }
  }
  if (!inserted && !p.members.empty() &&
      !std::equal(p.members.begin(), p.members.end(),
                  request->member_ranks().begin(),
                  request->member_ranks().end())) {
    // Members that disagree on the members: fail at once (the first list
    // would wait for ranks the others never meant).
    if (!p.by_rank[rank]) {
      p.by_rank[rank] = std::move(request);
      ++p.count;
    }
    std::vector<const wire::Request*> submitted;
    std::vector<int> labels;
    for (int r = 0; r < size_; ++r) {
      if (!p.by_rank[r]) continue;
      submitted.push_back(p.by_rank[r].get());
      labels.push_back(config_.global_ranks[r]);
    }
    Ready ready;
    ready.ready_at = now;
    ready.response = Built(BuildResponse(submitted, labels));
    ready.canonical = p.by_rank[p.members.front()]
                          ? p.by_rank[p.members.front()]
                          : p.by_rank[rank];
    ErasePending(it);
    PushReady(std::move(ready));
    return;
  }
  if (p.by_rank[rank]) return;  // Rejected on the rank already.
  if (const int64_t t = request->timeout_us(); t > 0) {
    if (p.timeout_us == 0 || t < p.timeout_us) p.timeout_us = t;
    if (shortest_timeout_us_ == 0 || t < shortest_timeout_us_) {
      shortest_timeout_us_ = t;
    }
  }
  p.by_rank[rank] = std::move(request);
  p.cache_id[rank] = cache_id;
  ++p.count;
  // A name that a departed rank never submitted can never become ready.
  std::vector<int> gone;
  for (int r : shutdown_) {
    if (!p.by_rank[r] && Awaits(p, r)) gone.push_back(config_.global_ranks[r]);
  }
  if (!gone.empty()) {
    FailPending(
        it->first, p, absl::StatusCode::kAborted,
        absl::StrCat(RankList(gone), " shut down without submitting it"), now);
    ErasePending(it);
    return;
  }
  MaybeReady(it, now);
}

void Coordinator::AddJoin(int rank, absl::Time now) {
  if (joined_.count(rank)) return;
  MaterializeHits();  // Joined ranks count as submitted on the slow path.
  joined_.insert(rank);
  last_joined_ = rank;
  if (static_cast<int>(joined_.size()) == size_) {
    wire::Response done;
    done.set_type(wire::RESPONSE_JOIN);
    done.add_names(kJoinName);
    done.add_elements(0);
    done.set_last_joined_rank(config_.global_ranks[last_joined_]);
    joined_.clear();
    Ready ready;
    ready.response = Built(std::move(done));
    ready.ready_at = now;
    PushReady(std::move(ready));
    return;
  }
  // Names that waited only for this rank may now be ready.
  for (absl::string_view name : SortedPendingNames()) {
    MaybeReady(pending_.find(name), now);
  }
}

bool Coordinator::Awaits(const Pending& p, int rank) {
  return p.members.empty() ||
         std::binary_search(p.members.begin(), p.members.end(), rank);
}

void Coordinator::MaybeReadyMembers(PendingMap::iterator it, absl::Time now) {
  Pending& p = it->second;
  for (int m : p.members) {
    if (!p.by_rank[m]) return;
  }
  std::vector<const wire::Request*> by_member;
  std::vector<int> labels;
  for (int m : p.members) {
    by_member.push_back(p.by_rank[m].get());
    labels.push_back(config_.global_ranks[m]);
  }
  Ready ready;
  ready.ready_at = now;
  wire::Response response = BuildResponse(by_member, labels);
  ready.canonical = p.by_rank[p.members.front()];
  if (response.type() == wire::RESPONSE_ADD_PROCESS_SET) {
    response.set_new_process_set(next_process_set_id_++);
  }
  ready.response = Built(std::move(response));
  ErasePending(it);
  PushReady(std::move(ready));
}

void Coordinator::MaybeReady(PendingMap::iterator it, absl::Time now) {
  Pending& p = it->second;
  if (!p.members.empty()) return MaybeReadyMembers(it, now);
  // Cheap necessary condition first, so that each request costs O(1) until
  // the name can be ready (joined ranks may have submitted too, hence >=).
  if (p.count == 0 || p.count + static_cast<int>(joined_.size()) < size_) {
    return;
  }
  // (count counts distinct ranks: with nobody joined, everyone submitted.)
  if (!joined_.empty()) {
    for (int r = 0; r < size_; ++r) {
      if (!p.by_rank[r] && !joined_.count(r)) return;  // Still waiting for r.
    }
  }
  Ready ready;
  ready.ready_at = now;
  // Served from the cache only if every rank sent the same id.
  ready.cache_id = p.cache_id[0];
  for (int r = 0; r < size_; ++r) {
    if (p.cache_id[r] != ready.cache_id) ready.cache_id = -1;
  }
  // Every rank sent the same current id, so every rank's request equals
  // the cached one, which was validated when it entered the cache: its
  // response is the cached one (the steady state of a training loop; no
  // validation, no copies of the request).
  std::shared_ptr<const wire::Response> cached =
      ready.cache_id >= 0 && joined_.empty()
          ? cache_.SharedResponse(ready.cache_id)
          : nullptr;
  if (cached && cached->type() != wire::RESPONSE_ERROR) {
    ready.response =
        std::move(cached);  // canonical stays null: see TakeResponseList
  } else {
    std::vector<const wire::Request*> by_rank(size_, nullptr);
    for (int r = 0; r < size_; ++r) by_rank[r] = p.by_rank[r].get();
    wire::Response response = BuildResponse(by_rank, config_.global_ranks);
    for (int r = 0; r < size_; ++r) {
      if (p.by_rank[r]) {
        ready.canonical = p.by_rank[r];
        break;
      }
    }
    if (response.type() == wire::RESPONSE_ADD_PROCESS_SET) {
      response.set_new_process_set(next_process_set_id_++);
    }
    ready.response = Built(std::move(response));
  }
  ErasePending(it);
  PushReady(std::move(ready));
}

void Coordinator::PushReady(Ready ready) {
  if (!joined_.empty()) ready_while_joined_ = true;
  if (config_.timeline && config_.timeline->enabled()) {
    const std::string& name = ready.get().names(0);
    // The name of an E event is informational: it closes the last B.
    config_.timeline->End(name, "NEGOTIATE");
    if (IsData(ready.get())) {
      if (const char* op = OperationPhase(ready.get().type())) {
        config_.timeline->Begin(name, op);
      }
      config_.timeline->Begin(name, "QUEUE");
    }
  }
  if (!ready.canonical || ready.canonical->group().empty()) {
    ready_.push_back(std::move(ready));
    return;
  }
  // Grouped (never from the cache): wait for every member, then release
  // them together; one bad member fails the group.
  const std::string group = ready.canonical->group();
  const int group_size = ready.canonical->group_size();
  std::vector<Ready>& members = groups_[group];
  members.push_back(std::move(ready));
  if (static_cast<int>(members.size()) < group_size) return;
  const wire::Response* bad = nullptr;
  for (const Ready& m : members) {
    if (!IsData(m.get())) {
      bad = &m.get();
      break;
    }
  }
  for (Ready& m : members) {
    if (bad && IsData(m.get())) {
      wire::Response e;
      e.set_type(wire::RESPONSE_ERROR);
      e.add_names(m.get().names(0));
      e.set_error_code(bad->error_code());
      e.set_error(
          absl::StrCat("grouped allreduce \"", group,
                       "\" failed because of another member: ", bad->error()));
      m.response = Built(std::move(e));
    }
    ready_.push_back(std::move(m));
  }
  groups_.erase(group);
}

std::string Coordinator::RanksWhere(const Pending& p, bool submitted) const {
  std::vector<int> ranks;
  for (int r = 0; r < size_; ++r) {
    if ((p.by_rank[r] != nullptr) == submitted && (submitted || Awaits(p, r))) {
      ranks.push_back(config_.global_ranks[r]);
    }
  }
  return RankList(ranks);
}

void Coordinator::FailPending(absl::string_view name, const Pending& p,
                              absl::StatusCode code, const std::string& message,
                              absl::Time now) {
  Ready ready;
  for (const auto& r : p.by_rank) {
    if (r) {
      ready.canonical = r;
      break;
    }
  }
  wire::Response e;
  e.set_type(wire::RESPONSE_ERROR);
  e.add_names(std::string(name));
  e.set_error_code(static_cast<int>(code));
  e.set_error(
      absl::StrCat(CollectiveName(ready.canonical ? ready.canonical->type()
                                                  : wire::ALLREDUCE),
                   " \"", name, "\": ", message, " (submitted by ",
                   RanksWhere(p, /*submitted=*/true), ")"));
  ready.response = Built(std::move(e));
  ready.ready_at = now;
  PushReady(std::move(ready));
}

absl::Duration Coordinator::ShortestTimeout(absl::Duration op_timeout) const {
  return shortest_timeout_us_ > 0
             ? std::min(op_timeout, absl::Microseconds(shortest_timeout_us_))
             : op_timeout;
}

absl::Time Coordinator::NextTimeout(absl::Duration op_timeout) const {
  if (shortest_timeout_us_ == 0) return OldestPending() + op_timeout;
  // A partly hit id's timeout is known once it is on the slow path, where
  // ExpireOlderThan moves it when the shortest one could have passed.
  absl::Time next = OldestHit() + ShortestTimeout(op_timeout);
  for (const auto& [name, p] : pending_) {
    next = std::min(next, p.first_seen + TimeoutOf(p, op_timeout));
  }
  return next;
}

void Coordinator::ExpireOlderThan(absl::Duration op_timeout, absl::Time now) {
  if (now < NextTimeout(op_timeout)) return;
  if (now - OldestHit() >= ShortestTimeout(op_timeout)) MaterializeHits();
  for (absl::string_view name : SortedPendingNames()) {
    auto it = pending_.find(name);
    const Pending& p = it->second;
    if (now - p.first_seen < TimeoutOf(p, op_timeout)) continue;
    FailPending(
        it->first, p, absl::StatusCode::kDeadlineExceeded,
        absl::StrCat("timed out after ",
                     DescribeTimeout(p.timeout_us, op_timeout), " waiting for ",
                     RanksWhere(p, /*submitted=*/false), " to submit it"),
        now);
    ErasePending(it);
  }
}

std::vector<std::string> Coordinator::StallReport(absl::Duration check_time,
                                                  absl::Time now) {
  if (now - OldestPending() < check_time) return {};
  if (now - OldestHit() >= check_time) MaterializeHits();
  std::map<int, std::vector<std::string>> missing_by_rank;
  for (absl::string_view name : SortedPendingNames()) {
    Pending& p = pending_.find(name)->second;
    if (p.stall_reported || now - p.first_seen < check_time) continue;
    p.stall_reported = true;
    ++stall_reported_;
    for (int r = 0; r < size_; ++r) {
      if (!p.by_rank[r] && !joined_.count(r) && Awaits(p, r)) {
        missing_by_rank[config_.global_ranks[r]].emplace_back(name);
      }
    }
  }
  std::vector<std::string> lines;
  for (const auto& [rank, names] : missing_by_rank) {
    lines.push_back(
        absl::StrCat("rank ", rank, ": [", absl::StrJoin(names, ", "), "]"));
  }
  return lines;
}

std::optional<std::string> Coordinator::StalledPast(
    absl::Duration shutdown_time, absl::Time now) {
  if (now - OldestPending() < shutdown_time) return std::nullopt;
  if (now - OldestHit() >= shutdown_time) MaterializeHits();
  for (absl::string_view name : SortedPendingNames()) {
    const Pending& p = pending_.find(name)->second;
    if (now - p.first_seen >= shutdown_time) {
      return absl::StrCat(
          "stalled: \"", name, "\" waited ", FormatSeconds(now - p.first_seen),
          " (KOLO_STALL_SHUTDOWN_TIME) for ", RanksWhere(p, false),
          " to submit it (submitted by ", RanksWhere(p, true), ")");
    }
  }
  return std::nullopt;
}

absl::Time Coordinator::NextPendingDeadline(absl::Duration delay) const {
  return OldestPending() + delay;
}

absl::Time Coordinator::NextStallCheck(absl::Duration check_time) const {
  // Until a name is reported, the oldest is the next to check.
  if (stall_reported_ == 0) return OldestPending() + check_time;
  // Hits are never reported (a report moves them to the slow path first).
  absl::Time next = OldestHit() + check_time;
  for (const auto& [name, p] : pending_) {
    if (!p.stall_reported) next = std::min(next, p.first_seen + check_time);
  }
  return next;
}

wire::ResponseList Coordinator::TakeResponseList() {
  wire::ResponseList list;
  list.set_process_set(config_.process_set);
  list.set_seq(++seq_);
  // A response made ready while a rank had joined (the joined rank has no
  // request to insert) freezes its list even if the last rank has joined
  // since (which ends the join before the list is taken).
  list.set_cache_frozen(!joined_.empty() || ready_while_joined_);
  ready_while_joined_ = false;
  std::vector<std::string> errors;  // names of this list's error responses
  std::vector<const wire::Response*> singles;
  singles.reserve(ready_.size());
  for (const Ready& r : ready_) singles.push_back(&r.get());
  const std::vector<std::vector<size_t>> members =
      PlanBuckets(singles, config_.fusion_threshold_bytes, size_);
  list.mutable_responses()->Reserve(static_cast<int>(members.size()));
  for (size_t b = 0; b < members.size(); ++b) {
    const bool data = IsData(*singles[members[b][0]]);
    // The response cache's changes (Note [Response cache]); and a response
    // whose every member came by cache id travels as those ids.
    bool all_cached = data;
    for (size_t i : members[b]) {
      const Ready& r = ready_[i];
      if (r.cache_id < 0 || !cache_.IsCurrent(r.cache_id)) all_cached = false;
    }
    // Built before this bucket's cache changes, which may evict the
    // entries its members' responses came from (they stay alive: shared).
    wire::Response* fused = list.add_responses();
    if (all_cached) {
      fused->mutable_cache_ids()->Reserve(static_cast<int>(members[b].size()));
      for (size_t i : members[b]) fused->add_cache_ids(ready_[i].cache_id);
    } else {
      *fused = FuseBucket(singles, members[b]);
    }
    if (!data) {
      for (const std::string& name : fused->names()) {
        recent_errors_[name] = list.seq();
        errors.push_back(name);
      }
    }
    if (list.cache_frozen()) continue;
    // Note [One cache protocol]. A member served from the cache
    // (MaybeReady) but fused with others that were not is re-inserted from
    // the cache's own copy, held while Insert evicts the entry it came from.
    ApplyResponse(
        cache_, *fused,
        [&](int k) -> std::shared_ptr<const wire::Request> {
          const Ready& r = ready_[members[b][k]];
          return r.canonical ? r.canonical : cache_.Find(r.cache_id);
        },
        list.seq());
  }
  ready_.clear();
  ForgetEvictedHits();
  // Requests of an error's name that came after the error was made are
  // the error's too (Note [Requests an error will take]): no rank has
  // executed this list yet.
  for (const std::string& name : errors) {
    auto it = pending_.find(name);
    if (it != pending_.end()) ErasePending(it);
  }
  return list;
}

std::vector<std::string> Coordinator::PendingNames() const {
  std::vector<std::string> names;
  for (absl::string_view name : SortedPendingNames()) names.emplace_back(name);
  for (int64_t id : hits_.Ids([](const Hits& h) { return h.count > 0; })) {
    if (auto request = cache_.Find(id)) names.push_back(request->name());
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace kolo
