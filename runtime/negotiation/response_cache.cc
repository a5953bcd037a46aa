#include "runtime/negotiation/response_cache.h"

#include <algorithm>
#include <cstring>

#include "runtime/negotiation/collectives.h"
#include "runtime/negotiation/validation.h"

namespace kolo {
namespace {

wire::Request Canonical(const wire::Request& request) {
  wire::Request c = request;
  c.set_rank(0);
  return c;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <typename Repeated>
bool SameElements(const Repeated& a, const Repeated& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

}  // namespace

bool SameRequest(const wire::Request& a, const wire::Request& b) {
  // Cheap integer fields first; names last (they usually match).
  return a.type() == b.type() && a.dtype() == b.dtype() &&
         a.device_type() == b.device_type() &&
         a.device_index() == b.device_index() && a.root() == b.root() &&
         a.op() == b.op() && a.process_set() == b.process_set() &&
         a.group_size() == b.group_size() &&
         a.target_process_set() == b.target_process_set() &&
         a.timeout_us() == b.timeout_us() &&
         SameBits(a.prescale(), b.prescale()) &&
         SameBits(a.postscale(), b.postscale()) &&
         SameElements(a.shape(), b.shape()) &&
         SameElements(a.splits(), b.splits()) &&
         SameElements(a.member_ranks(), b.member_ranks()) &&
         a.group() == b.group() && a.name() == b.name();
}

bool ResponseCache::Cacheable(const wire::Request& r) {
  const CollectiveRules* rules = RulesFor(r.type());
  return rules && rules->cacheable && r.group().empty();
}

int64_t ResponseCache::Lookup(const wire::Request& request) const {
  if (capacity_ <= 0 || !Cacheable(request)) return -1;
  auto it = by_name_.find(request.name());
  if (it == by_name_.end()) return -1;
  const Entry& e = entries_.at(it->second);
  return SameRequest(*e.request, request) ? it->second : -1;
}

int64_t ResponseCache::IdOf(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? -1 : it->second;
}

std::shared_ptr<const wire::Request> ResponseCache::Find(int64_t id) const {
  auto it = entries_.find(id);
  if (it != entries_.end()) return it->second.request;
  auto g = graveyard_.find(id);
  return g == graveyard_.end() ? nullptr : g->second.first;
}

const wire::Response* ResponseCache::CachedResponse(int64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.response.get();
}

std::shared_ptr<const wire::Response> ResponseCache::SharedResponse(
    int64_t id) const {
  auto it = entries_.find(id);
  return it == entries_.end() ? nullptr : it->second.response;
}

void ResponseCache::Touch(int64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
}

void ResponseCache::Evict(int64_t id, int64_t seq) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  ++evictions_;
  graveyard_.emplace(id, std::make_pair(std::move(it->second.request), seq));
  lru_.erase(it->second.lru);
  entries_.erase(it);
}

void ResponseCache::Insert(const wire::Request& request, int64_t seq) {
  if (capacity_ <= 0 || !Cacheable(request)) return;
  auto named = by_name_.find(request.name());
  if (named != by_name_.end()) {
    Evict(named->second, seq);
    by_name_.erase(named);
  }
  while (static_cast<int>(entries_.size()) >= capacity_) {
    const int64_t victim = lru_.back();
    by_name_.erase(entries_.at(victim).request->name());
    Evict(victim, seq);
  }
  const int64_t id = next_id_++;
  lru_.push_front(id);
  Entry& e = entries_[id];
  auto canonical = std::make_shared<wire::Request>(Canonical(request));
  e.response = std::make_shared<const wire::Response>(
      BuildResponse(std::vector<const wire::Request*>{canonical.get()}, {0}));
  e.request = std::move(canonical);
  e.lru = lru_.begin();
  by_name_[request.name()] = id;
}

void ResponseCache::Erase(const std::string& name, int64_t seq) {
  auto named = by_name_.find(name);
  if (named == by_name_.end()) return;
  Evict(named->second, seq);
  by_name_.erase(named);
}

std::vector<std::pair<std::string, int64_t>> ResponseCache::Contents() const {
  std::vector<std::pair<std::string, int64_t>> out(by_name_.begin(),
                                                   by_name_.end());
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

// ExpandCachedResponse's work; cached_of(i) is the cached response of
// compact's i-th id, or null.
template <typename CachedOf>
bool Expand(CachedOf&& cached_of, const wire::Response& compact,
            wire::Response* out) {
  if (compact.cache_ids_size() == 0) {
    out->CopyFrom(compact);
    return true;
  }
  // CopyFrom and add_names reuse the strings `out` held before (a protobuf
  // repeated field keeps cleared elements): no allocation per name once
  // `out` has seen a batch this large.
  for (int i = 0; i < compact.cache_ids_size(); ++i) {
    const wire::Response* cached = cached_of(i);
    if (!cached) return false;
    if (i == 0) {
      out->CopyFrom(*cached);
      out->mutable_elements()->Reserve(compact.cache_ids_size());
    } else {
      *out->add_names() = cached->names(0);
      out->add_elements(cached->elements(0));
    }
  }
  *out->mutable_cache_ids() = compact.cache_ids();
  return true;
}

}  // namespace

bool ExpandCachedResponse(const ResponseCache& cache,
                          const wire::Response& compact, wire::Response* out) {
  return Expand(
      [&](int i) { return cache.CachedResponse(compact.cache_ids(i)); },
      compact, out);
}

void ExpandCachedResponse(const wire::Response* const* cached,
                          const wire::Response& compact, wire::Response* out) {
  Expand([&](int i) { return cached[i]; }, compact, out);
}

void AddCacheHits(std::vector<int64_t>* ids, wire::RequestList* list,
                  HitEncoding encoding) {
  if (ids->empty()) return;
  std::sort(ids->begin(), ids->end());
  const int64_t first = ids->front();
  const uint64_t span = static_cast<uint64_t>(ids->back() - first) + 1;
  // Bits: 8 bytes per 64 ids of the span; a list: a tag and about one or
  // two bytes per id. Bits when they are not bigger (and a few ids).
  const uint64_t words = (span + 63) / 64;
  const bool compact_list = ids->size() < 8 || words * 8 > ids->size() * 2;
  if (first < 0 || encoding == HitEncoding::kList ||
      (encoding == HitEncoding::kCompact && compact_list)) {
    for (int64_t id : *ids) list->add_cached_ids(id);
    return;
  }
  list->set_hit_base(first);
  list->mutable_hit_bits()->Resize(static_cast<int>(words), 0);
  uint64_t* bits = list->mutable_hit_bits()->mutable_data();
  for (int64_t id : *ids) {
    const uint64_t k = static_cast<uint64_t>(id - first);
    bits[k / 64] |= uint64_t{1} << (k % 64);
  }
}

void ResponseCache::PruneGraveyard(int64_t acked_seq) {
  for (auto it = graveyard_.begin(); it != graveyard_.end();) {
    if (it->second.second <= acked_seq) {
      it = graveyard_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace kolo
