// CacheIdTable: entries keyed by response-cache id, for the coordinator's
// hits (Note [Cache hits as bits] in coordinator.cc). No I/O, no locks: the
// owner's thread only.
//
// The ids of a model's tensors are neighbours (the cache numbers them as
// they come), so ids in a window of 4x the cache's capacity from the first
// one live in a vector found by subtraction, the others (after much churn)
// in a map. Entries never move (the window is allocated once, at the first
// Get: a table that is never used costs nothing; the map's nodes are
// stable): an Entry& stays valid until its entry is erased. Entry is
// default-constructible with a `bool present` (the window's slots: the
// entry exists).
#ifndef KOLO_RUNTIME_NEGOTIATION_CACHE_ID_TABLE_H_
#define KOLO_RUNTIME_NEGOTIATION_CACHE_ID_TABLE_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/node_hash_map.h"

namespace kolo {

template <typename Entry>
class CacheIdTable {
 public:
  explicit CacheIdTable(int capacity)
      : window_size_(capacity > 0 ? static_cast<size_t>(4) * capacity : 0) {}

  Entry* Find(int64_t id) {
    if (InWindow(id)) {
      Entry& e = window_[id - base_];
      if (e.present) return &e;
    }
    // (Also for an id in the window's range: the map may hold it from
    // before the window moved.)
    if (others_.empty()) return nullptr;
    auto it = others_.find(id);
    return it == others_.end() ? nullptr : &it->second;
  }

  // Creates the entry if absent.
  Entry& Get(int64_t id) {
    if (Entry* e = Find(id)) return *e;
    if (window_.empty() && window_size_ > 0) window_.resize(window_size_);
    // The window starts one cache capacity (a quarter of it) below the
    // first id it is asked for, so that lower ids of the same step, from
    // lists that come later, still land in it rather than in the map.
    if (base_ < 0 && !window_.empty() && id >= 0) {
      base_ =
          std::max<int64_t>(0, id - static_cast<int64_t>(window_.size() / 4));
    }
    if (InWindow(id)) {
      const size_t i = static_cast<size_t>(id - base_);
      Entry& e = window_[i];
      e.present = true;
      ++in_window_;
      used_ = std::max(used_, i + 1);
      return e;
    }
    return others_[id];
  }

  void Erase(int64_t id) {
    if (InWindow(id)) {
      Entry& e = window_[id - base_];
      if (e.present) {
        e = Entry();
        // An empty window starts again from the next id it is asked for
        // (the ids have moved on).
        if (--in_window_ == 0) {
          base_ = -1;
          used_ = 0;
        }
        return;
      }
    }
    others_.erase(id);
  }

  // Ids of the entries, ascending, that satisfy `keep`.
  template <typename Keep>
  std::vector<int64_t> Ids(Keep&& keep) const {
    std::vector<int64_t> ids;
    for (size_t i = 0; i < used_; ++i) {
      if (window_[i].present && keep(window_[i])) ids.push_back(base_ + i);
    }
    for (const auto& [id, e] : others_) {
      if (keep(e)) ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }

 private:
  bool InWindow(int64_t id) const {
    return base_ >= 0 && id >= base_ &&
           static_cast<uint64_t>(id - base_) < window_.size();
  }

  const size_t window_size_;
  std::vector<Entry> window_;  // empty, or window_size_ entries
  int64_t base_ = -1;          // id of window_[0]; -1: no entry in the window
  int in_window_ = 0;
  size_t used_ = 0;  // window_[used_...] never held an entry since base_
  absl::node_hash_map<int64_t, Entry> others_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_NEGOTIATION_CACHE_ID_TABLE_H_
