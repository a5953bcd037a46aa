// ResponseCache: the fast path for tensors negotiated before.
//
// Note [Response cache]
// Every rank of a process set, and the coordinator, hold a cache of the
// allreduce and broadcast requests the set has run: name -> (id, request).
// A rank whose new request equals the cached one (same name, dtype, shape,
// op, root, scale factors, device) sends only the id. The coordinator turns
// ids back into requests from its own copy, so negotiation and validation
// stay one code path; when every rank of a name came by id, the response
// list carries just the id and every rank rebuilds the response from its
// cache. In a steady-state training loop no full request reaches the
// coordinator.
//
// The copies stay identical because every rank applies the same changes in
// the same order, with the same code (ApplyResponse, Note [One cache
// protocol]): for each response list of the set, in order, Touch() for a
// response rebuilt from the cache, Insert() for any other allreduce or
// broadcast response, Erase() for an error; an Insert into a full cache
// evicts the least recently used entry. Ids are never reused. The
// coordinator applies a list's changes when it sends the list and the ranks
// when they execute it, so a rank may send an id that the coordinator has
// already evicted: the coordinator keeps evicted entries (the graveyard)
// until every rank of the set has acknowledged the list that evicted them.
// Lists sent while a rank has joined change nothing (the joined rank has no
// request to insert).
//
// Thread: owned by the background thread.
#ifndef KOLO_RUNTIME_NEGOTIATION_RESPONSE_CACHE_H_
#define KOLO_RUNTIME_NEGOTIATION_RESPONSE_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/wire.pb.h"

namespace kolo {

class ResponseCache;

// Note [One cache protocol]
// How one response of a list changes a cache, in one place: the coordinator
// applies it to its cache when it builds the list, every rank to its own
// when it executes the list (Note [Response cache]); both call
// ApplyResponse with the response as it travels:
//   an ERROR response: each of its names is erased;
//   a response that travels as cache ids: each id is touched;
//   any other response: each member's request is inserted, which keeps
//   only what ResponseCache::Cacheable accepts (the one definition of
//   "cacheable").
// `request_of(i)` returns member i's request as something pointer-like
// (null: none), held while it is inserted: Insert may first evict the entry
// it came from. `seq` is the list's position (the coordinator's graveyard).
template <typename RequestOf>
void ApplyResponse(ResponseCache& cache, const wire::Response& response,
                   RequestOf&& request_of, int64_t seq);

// Adds cache ids to a request list. kCompact (what the runtime sends): as
// bits when there are a few and they are dense enough that the bits take
// no more room than the ids would (a training step's gradients have
// neighbouring ids), else as a list; kBits, kList: that way (tests). `ids`
// may be reordered.
enum class HitEncoding { kCompact, kBits, kList };
void AddCacheHits(std::vector<int64_t>* ids, wire::RequestList* list,
                  HitEncoding encoding = HitEncoding::kCompact);
// Calls fn(id) for each cache id of `list`, the list's first, then the
// bits' in ascending order. Ids out of range (a hostile base) are skipped.
template <typename Fn>
void ForEachCacheHit(const wire::RequestList& list, Fn&& fn);

// Rebuilds a response that travelled as cache ids into `out` (whose storage
// it reuses; a response without ids is copied); false if an id is unknown
// (the caches diverged).
bool ExpandCachedResponse(const ResponseCache& cache,
                          const wire::Response& compact, wire::Response* out);
// The same from compact's cached responses, which the caller looked up:
// cached[i] is the cache's response for compact.cache_ids(i), none null.
void ExpandCachedResponse(const wire::Response* const* cached,
                          const wire::Response& compact, wire::Response* out);

class ResponseCache {
 public:
  explicit ResponseCache(int capacity) : capacity_(capacity) {}

  // Whether requests of this kind are cached at all.
  static bool Cacheable(const wire::Request& request);

  // The id under which an identical request (SameRequest) is cached, or -1.
  int64_t Lookup(const wire::Request& request) const;
  // The current id of `name`, whatever its request, or -1.
  int64_t IdOf(const std::string& name) const;

  // The request of a current or recently evicted id (coordinator), or null.
  // Shared: the coordinator holds it while the name is pending, without a
  // copy, and eviction does not take it away.
  std::shared_ptr<const wire::Request> Find(int64_t id) const;
  bool IsCurrent(int64_t id) const { return entries_.count(id) > 0; }
  // The single-tensor response of a current id, or null.
  const wire::Response* CachedResponse(int64_t id) const;
  std::shared_ptr<const wire::Response> SharedResponse(int64_t id) const;

  // The changes of Note [Response cache]. `seq` is the list's position.
  void Touch(int64_t id);
  void Insert(const wire::Request& request, int64_t seq);
  void Erase(const std::string& name, int64_t seq);

  // Drops graveyard entries evicted by lists up to `acked_seq`.
  void PruneGraveyard(int64_t acked_seq);

  // (name, id) of every current entry, sorted by name (tests compare the
  // coordinator's cache with the ranks').
  std::vector<std::pair<std::string, int64_t>> Contents() const;

  size_t size() const { return entries_.size(); }
  size_t graveyard_size() const { return graveyard_.size(); }
  // Entries evicted or erased so far (a count that only grows).
  int64_t evictions() const { return evictions_; }
  int capacity() const { return capacity_; }

 private:
  struct Entry {
    std::shared_ptr<const wire::Request> request;  // canonical: rank cleared
    std::shared_ptr<const wire::Response>
        response;  // what the coordinator would build
    std::list<int64_t>::iterator lru;
  };
  void Evict(int64_t id, int64_t seq);

  const int capacity_;
  int64_t next_id_ = 1;
  int64_t evictions_ = 0;
  absl::flat_hash_map<int64_t, Entry> entries_;
  absl::flat_hash_map<std::string, int64_t> by_name_;
  std::list<int64_t> lru_;  // most recently used first
  // id -> (request, seq of the list that evicted it)
  std::map<int64_t, std::pair<std::shared_ptr<const wire::Request>, int64_t>>
      graveyard_;
};

// Whether two requests are the same collective on the same tensor: every
// field but the submitting rank (doubles compared by their bits, as the
// wire would). coordinator_test checks that every field of wire::Request is
// compared, so a new field cannot be forgotten here.
bool SameRequest(const wire::Request& a, const wire::Request& b);

template <typename Fn>
void ForEachCacheHit(const wire::RequestList& list, Fn&& fn) {
  for (int64_t id : list.cached_ids()) fn(id);
  if (list.hit_bits_size() == 0 || list.hit_base() < 0) return;
  const uint64_t base = static_cast<uint64_t>(list.hit_base());
  for (int w = 0; w < list.hit_bits_size(); ++w) {
    uint64_t word = list.hit_bits(w);
    while (word) {
      const uint64_t id = base + 64 * static_cast<uint64_t>(w) +
                          static_cast<uint64_t>(__builtin_ctzll(word));
      word &= word - 1;
      // (base <= INT64_MAX and w < 2^31: the sum cannot wrap.)
      if (id > static_cast<uint64_t>(INT64_MAX)) return;
      fn(static_cast<int64_t>(id));
    }
  }
}

template <typename RequestOf>
void ApplyResponse(ResponseCache& cache, const wire::Response& response,
                   RequestOf&& request_of, int64_t seq) {
  if (response.type() == wire::RESPONSE_ERROR) {
    for (const std::string& name : response.names()) cache.Erase(name, seq);
  } else if (response.cache_ids_size() > 0) {
    for (int64_t id : response.cache_ids()) cache.Touch(id);
  } else {
    for (int i = 0; i < response.names_size(); ++i) {
      auto request = request_of(i);
      if (request) cache.Insert(*request, seq);
    }
  }
}

}  // namespace kolo

#endif  // KOLO_RUNTIME_NEGOTIATION_RESPONSE_CACHE_H_
