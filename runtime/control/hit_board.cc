#include "runtime/control/hit_board.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/time/clock.h"
#include "runtime/os/futex.h"

namespace kolo {
namespace {

constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
// Lock word: 0 free, 1 held, 2 held and someone may sleep on it.
constexpr uint32_t kFree = 0, kHeld = 1, kContended = 2;
constexpr int kLockSpins = 200;
constexpr absl::Duration kLockSleep = absl::Milliseconds(10);

}  // namespace

size_t HitBoard::Bytes() { return (sizeof(HitBoardShared) + 63) & ~size_t{63}; }

void HitBoard::Init(HitBoardShared* shared, int size, bool enabled,
                    int64_t fusion_threshold_bytes) {
  shared->enabled =
      enabled && size >= 2 && size <= HitBoardShared::kMaxRanks ? 1 : 0;
  shared->size = static_cast<uint32_t>(size);
  shared->fusion_threshold_bytes = fusion_threshold_bytes;
  shared->oldest_ns.store(kNone, std::memory_order_relaxed);
  for (auto& s : shared->slots) s.id = -1;
}

HitBoard::HitBoard(HitBoardShared* shared, int rank, int size)
    : shared_(shared),
      rank_(rank),
      size_(size),
      all_(size >= 64 ? ~uint64_t{0} : (uint64_t{1} << size) - 1) {}

bool HitBoard::Lock(absl::Time deadline,
                    const std::function<bool()>& keep_going) {
  std::atomic<uint32_t>& word = shared_->lock;
  uint32_t c = kFree;
  if (word.compare_exchange_strong(c, kHeld, std::memory_order_acquire)) {
    return true;
  }
  for (int i = 0; i < kLockSpins; ++i) {
    os::CpuPause();
    c = kFree;
    if (word.load(std::memory_order_relaxed) == kFree &&
        word.compare_exchange_strong(c, kHeld, std::memory_order_acquire)) {
      return true;
    }
  }
  // Drepper's mutex: whoever sleeps leaves the word at kContended, so the
  // holder's Unlock wakes the sleepers.
  c = word.exchange(kContended, std::memory_order_acquire);
  while (c != kFree) {
    if (!keep_going() || absl::Now() >= deadline) return false;
    os::FutexWait(&word, kContended, kLockSleep, os::FutexScope::kShared);
    c = word.exchange(kContended, std::memory_order_acquire);
  }
  return true;
}

void HitBoard::Unlock() {
  if (shared_->lock.exchange(kFree, std::memory_order_release) == kContended) {
    os::FutexWakeAll(&shared_->lock, os::FutexScope::kShared);
  }
}

void HitBoard::ClearSlot(HitBoardShared::Slot& s) {
  if (s.ready) shared_->ready.fetch_sub(1, std::memory_order_relaxed);
  if (s.mask != 0) shared_->partial.fetch_sub(1, std::memory_order_relaxed);
  s.mask = 0;
  s.ready = 0;
  s.id = -1;
}

void HitBoard::Set(const std::vector<int64_t>& ids, int64_t now_ns,
                   std::vector<int64_t>* complete,
                   std::vector<int64_t>* refused) {
  const uint64_t me = uint64_t{1} << rank_;
  for (int64_t id : ids) {
    HitBoardShared::Slot& s = slot(id);
    if (s.mask == 0) {
      s.id = id;
      s.first_ns = now_ns;
      shared_->partial.fetch_add(1, std::memory_order_relaxed);
      if (now_ns < shared_->oldest_ns.load(std::memory_order_relaxed)) {
        shared_->oldest_ns.store(now_ns, std::memory_order_relaxed);
      }
    } else if (s.id != id || (s.mask & me) != 0) {
      // Another id's, or (cannot happen: a name is in flight once) ours.
      refused->push_back(id);
      continue;
    }
    s.mask |= me;
    if (s.mask == all_) {
      s.ready = 1;
      // seq_cst, with Room()'s loads of the heads and a reader's store of
      // its head before its load of `ready` (ready_pending): either the
      // writer sees the room the reader made or the reader sees the ready
      // ids and flushes them.
      shared_->ready.fetch_add(1, std::memory_order_seq_cst);
      complete->push_back(id);
    }
  }
}

uint64_t HitBoard::Room() const {
  const uint64_t tail = shared_->tail.load(std::memory_order_relaxed);
  uint64_t low = tail;
  for (int r = 0; r < size_; ++r) {
    low = std::min(low, shared_->heads[r].pos.load(std::memory_order_seq_cst));
  }
  return HitBoardShared::kRecords - (tail - low);
}

bool HitBoard::HasRoom(uint64_t records) const { return Room() >= records; }

void HitBoard::AppendIds(const int64_t* ids, size_t n) {
  uint64_t tail = shared_->tail.load(std::memory_order_relaxed);
  while (n > 0) {
    HitBoardShared::Record& r =
        shared_->records[tail % HitBoardShared::kRecords];
    const size_t k = std::min<size_t>(n, HitBoardShared::kRecordIds);
    r.kind = HitBoardShared::kIds;
    r.count = static_cast<uint32_t>(k);
    r.list_seq = 0;
    r.process_set = 0;
    std::memcpy(r.ids, ids, k * sizeof(int64_t));
    ids += k;
    n -= k;
    ++tail;
  }
  shared_->tail.store(tail, std::memory_order_release);
}

bool HitBoard::Publish(std::vector<int64_t>* ids) {
  if (ids->empty()) return false;
  const uint64_t need = (ids->size() + HitBoardShared::kRecordIds - 1) /
                        HitBoardShared::kRecordIds;
  // One record stays free for the coordinator's next marker: once rank 0
  // has seen room for it, nobody else takes it.
  if (!HasRoom(need + 1)) return false;
  std::sort(ids->begin(), ids->end());
  AppendIds(ids->data(), ids->size());
  for (int64_t id : *ids) ClearSlot(slot(id));
  return true;
}

bool HitBoard::FlushReady() {
  if (shared_->ready.load(std::memory_order_relaxed) == 0) return false;
  std::vector<int64_t> ids;
  for (const auto& s : shared_->slots) {
    if (s.ready) ids.push_back(s.id);
  }
  return Publish(&ids);
}

void HitBoard::Close(std::vector<Pulled>* pulled) {
  shared_->open = 0;
  if (shared_->partial.load(std::memory_order_relaxed) > 0) {
    for (auto& s : shared_->slots) {
      if (s.mask == 0) continue;
      for (int r = 0; r < size_; ++r) {
        if (s.mask >> r & 1) pulled->push_back({r, s.id, s.first_ns});
      }
      ClearSlot(s);
    }
  }
  shared_->oldest_ns.store(kNone, std::memory_order_relaxed);
}

void HitBoard::Open() {
  shared_->open_pos = shared_->tail.load(std::memory_order_relaxed);
  shared_->open = 1;
}

bool HitBoard::AppendList(int64_t seq, int process_set) {
  if (!HasRoom(1)) return false;
  const uint64_t tail = shared_->tail.load(std::memory_order_relaxed);
  HitBoardShared::Record& r = shared_->records[tail % HitBoardShared::kRecords];
  r.kind = HitBoardShared::kList;
  r.count = 0;
  r.list_seq = seq;
  r.process_set = process_set;
  shared_->tail.store(tail + 1, std::memory_order_release);
  return true;
}

int64_t HitBoard::RescanOldest() {
  int64_t oldest = kNone;
  if (shared_->partial.load(std::memory_order_relaxed) > 0) {
    for (const auto& s : shared_->slots) {
      if (s.mask != 0) oldest = std::min(oldest, s.first_ns);
    }
  }
  shared_->oldest_ns.store(oldest, std::memory_order_relaxed);
  return oldest;
}

}  // namespace kolo
