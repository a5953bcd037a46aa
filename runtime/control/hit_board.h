// HitBoard: the global process set's cache hits ANDed in shared memory
// when every rank runs on one host, and the one log that orders what every
// rank executes for that set.
//
// Note [Hits on the board]
// In steady state every request of the global set is a cache hit (Note
// [Response cache] in runtime/negotiation/response_cache.h). Without the board
// each hit travels as a bit to the coordinator, which ANDs them (Note [Cache
// hits as bits] in runtime/negotiation/coordinator.cc) and answers with a
// response list: a round trip through rank 0's background thread per cycle.
// With the board, a rank's background thread sets its bit for the id in a slot
// of the control segment; the rank that sets the last bit appends the id to the
// board's log, and every rank executes the log in order: the ids of one record,
// in ascending order, fused by the same plan on every rank (the fusion
// threshold is the coordinator's, in the segment). No message, no coordinator,
// no per-name work.
//
// The coordinator stays the source of truth. Its response lists, of every
// process set, are entered in the same log (a marker with the list's set
// and seq; the list itself still travels through the ring), so that a
// rank runs lists and board records in one order, the order of the log
// (two sets' collectives run in different orders on two ranks would block
// each in a different one). The global set's markers are appended only
// while the board is closed; while it is closed, hits go to the
// coordinator as before. The coordinator closes the board whenever
// anything reaches it for the global set (a request list: a new or
// changed name, a join, a shutdown, hits a rank could not set), when a
// partly set id is older than the stall or op-timeout checks allow (rank
// 0 wakes at least that often while the board is open), and before it
// sends a list of the global set; closing moves every bit on the board into the
// coordinator as the hits of their ranks (with the time of each id's
// first bit), so that nothing is half on the board and half at the
// coordinator. It opens the board again when its own side is quiet
// (nothing pending, no partial hit, no join, no shutdown, no recent error)
// and every request list a rank sent has arrived (`sent` counts them under
// the board's lock). The log position at which it opened (`open_pos`) is
// after every marker of the lists made while closed: a rank uses the board
// only once it has executed that far, so every rank that sets a bit has
// applied the same cache changes, and an id on the board means the same
// request everywhere. A record touches its ids in the LRU order of every
// rank's cache as it executes (rank 0's cache is the coordinator's), and
// rank 0 makes a list only once it has executed the log to its end, so
// the coordinator's cache has every record's touches before the list's
// marker, as every rank has when it reaches the marker: the copies stay
// identical and a name served from the board stays recently used.
//
// The lock is a futex word in the segment; it is held for the few
// operations below (setting one pass's bits is one hold). A waiter
// re-checks `keep_going` every 10 ms: a rank that died holding it is found
// by the control plane (its connection closes), which fails the job. The
// log has kRecords records; a rank that would append ids to a full log
// leaves them marked ready in their slots, rings every rank, and whoever
// finds room appends them (a reader that advanced, or the next writer), so
// nobody waits for room while holding the lock. Ids leave one record free
// for the coordinator, which waits (outside the lock, ringing every rank,
// which also wakes ranks outside the set whose markers they must pass)
// until the log has room before it makes a list.
//
// Thread safety: one background thread per rank. The board is a
// capability (Note [Annotated locks] in runtime/sync/mutex.h): the methods
// marked "locked" require it, so that the compiler checks that a caller
// holds the lock; it is taken with Lock() and held for a scope by a
// HitBoardLock. The others are for the rank's own thread.
#ifndef KOLO_RUNTIME_CONTROL_HIT_BOARD_H_
#define KOLO_RUNTIME_CONTROL_HIT_BOARD_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "absl/time/time.h"
#include "runtime/sync/mutex.h"

namespace kolo {

// Lives in shared memory, zero-initialised.
struct HitBoardShared {
  static constexpr int kMaxRanks = 64;    // bits per slot
  static constexpr int kSlots = 4096;     // id mod kSlots
  static constexpr int kRecords = 128;    // the log's capacity
  static constexpr int kRecordIds = 509;  // ids per record
  enum Kind : uint32_t { kIds = 1, kList = 2 };
  struct Slot {
    int64_t id;
    uint64_t mask;     // bit r: rank r set it
    int64_t first_ns;  // monotonic clock of the first bit
    uint32_t ready;    // every bit set, not in the log yet (log was full)
    uint32_t unused;
  };
  struct Record {
    uint32_t kind;
    uint32_t count;       // kIds: ids used
    int64_t list_seq;     // kList: the response list's seq
    int32_t process_set;  // kList: the list's process set
    int32_t unused;
    int64_t ids[kRecordIds];
  };
  // Written by the creator before any other rank maps the segment.
  uint32_t enabled;
  uint32_t size;
  int64_t fusion_threshold_bytes;
  alignas(64) std::atomic<uint32_t> lock;
  alignas(64) std::atomic<uint64_t> tail;  // records published (release)
  std::atomic<int64_t> partial;    // slots with some bits (lock to write)
  std::atomic<int64_t> ready;      // slots complete but not logged
  std::atomic<int64_t> oldest_ns;  // <= every partial slot's first_ns
  // Under the lock.
  uint32_t open;
  uint64_t open_pos;
  uint64_t sent[kMaxRanks];  // request lists rank r sent for the set
  struct alignas(64) Head {
    std::atomic<uint64_t> pos;  // records rank r has executed
    // Rank r's caller polls the log (Note [Caller turns] in
    // runtime/loop/caller_turn.cc): appending ids needs no ring to it.
    std::atomic<uint32_t> polling;
  };
  Head heads[kMaxRanks];
  Slot slots[kSlots];
  Record records[kRecords];
};

class KOLO_CAPABILITY("hit board") HitBoard {
 public:
  // A bit that Close() took off the board.
  struct Pulled {
    int rank;
    int64_t id;
    int64_t first_ns;
  };

  // Bytes to reserve in the segment (a multiple of 64).
  static size_t Bytes();
  // The creator (rank 0), before the segment is shared: the board is used
  // if `enabled` and the set has at most kMaxRanks ranks.
  static void Init(HitBoardShared* shared, int size, bool enabled,
                   int64_t fusion_threshold_bytes);

  HitBoard(HitBoardShared* shared, int rank, int size);

  bool enabled() const { return shared_->enabled != 0; }
  int64_t fusion_threshold_bytes() const {
    return shared_->fusion_threshold_bytes;
  }

  // False if `keep_going` said stop or `deadline` passed first. A caller
  // that got it hands it to a HitBoardLock at once.
  bool Lock(absl::Time deadline, const std::function<bool()>& keep_going)
      KOLO_TRY_ACQUIRE(true);
  void Unlock() KOLO_RELEASE();

  // --- Locked.
  // Whether a rank that has executed the log up to `cursor` sets its hits
  // here.
  bool Usable(uint64_t cursor) const KOLO_REQUIRES(this) {
    return shared_->open != 0 && cursor >= shared_->open_pos;
  }
  // Sets this rank's bit for each id; ids whose slot another id holds go
  // to *refused (for the coordinator), ids now set by every rank to
  // *complete (marked ready). `now_ns`: the monotonic clock.
  void Set(const std::vector<int64_t>& ids, int64_t now_ns,
           std::vector<int64_t>* complete, std::vector<int64_t>* refused)
      KOLO_REQUIRES(this);
  // Appends `ids` (complete; sorted here) to the log. False, changing
  // nothing, if the log has no room for them and one more record (kept
  // for the coordinator's markers): they stay ready.
  bool Publish(std::vector<int64_t>* ids) KOLO_REQUIRES(this);
  // Appends every ready id if there is room (a scan of the slots: only
  // after a full log). True if something was appended.
  bool FlushReady() KOLO_REQUIRES(this);
  // This rank sent the coordinator a request list for the set.
  void CountSent() KOLO_REQUIRES(this) { ++shared_->sent[rank_]; }
  uint64_t sent(int rank) const KOLO_REQUIRES(this) {
    return shared_->sent[rank];
  }
  // Coordinator. (open() and HasRoom() are also read without the lock by
  // rank 0, the only rank that writes `open` and appends markers: room
  // for one marker, once seen, stays, since Publish leaves one record.)
  bool open() const { return shared_->open != 0; }
  // Closes the board and takes every bit off it, ready ids' included.
  void Close(std::vector<Pulled>* pulled) KOLO_REQUIRES(this);
  // Opens it at the current end of the log. Requires it to be empty
  // (after Close nobody sets bits).
  void Open() KOLO_REQUIRES(this);
  // Appends a marker for response list `seq` of `process_set`; false if
  // the log is full.
  bool AppendList(int64_t seq, int process_set = 0) KOLO_REQUIRES(this);
  bool HasRoom(uint64_t records) const;
  // The earliest first bit of a partly set id, by a scan; also resets the
  // lower bound that oldest_ns() returns.
  int64_t RescanOldest() KOLO_REQUIRES(this);

  // --- Any time, without the lock.
  uint64_t tail() const {
    return shared_->tail.load(std::memory_order_acquire);
  }
  const HitBoardShared::Record& record(uint64_t pos) const {
    return shared_->records[pos % HitBoardShared::kRecords];
  }
  // This rank has executed records [0, pos).
  void Executed(uint64_t pos) {
    shared_->heads[rank_].pos.store(pos, std::memory_order_seq_cst);
  }
  // Note [Caller turns] (runtime/loop/caller_turn.cc): while this rank's
  // caller polls the log itself, a rank that appends ids need not ring it
  // (a system call and a wake-up of its background thread, on the core
  // the caller spins on). Clearing is followed by a look at tail(): a
  // writer that saw the flag set appended before it looked (seq_cst on
  // both sides), so the poller sees its record then and rings its own
  // thread.
  void SetPolling(bool polling) {
    shared_->heads[rank_].polling.store(polling ? 1 : 0,
                                        std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  // Whether ids appended by this rank (after tail's store) need a ring to
  // `rank`.
  bool NeedsRing(int rank) const {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return shared_->heads[rank].polling.load(std::memory_order_seq_cst) == 0;
  }
  // (seq_cst: see Set.)
  bool ready_pending() const {
    return shared_->ready.load(std::memory_order_seq_cst) > 0;
  }
  int64_t partial() const {
    return shared_->partial.load(std::memory_order_relaxed);
  }
  // A lower bound of the first bit over partly set ids (INT64_MAX: none
  // since the last rescan).
  int64_t oldest_ns() const {
    return shared_->oldest_ns.load(std::memory_order_relaxed);
  }
  int rank() const { return rank_; }
  int size() const { return size_; }

 private:
  HitBoardShared::Slot& slot(int64_t id) {
    return shared_->slots[static_cast<uint64_t>(id) % HitBoardShared::kSlots];
  }
  uint64_t Room() const;
  void AppendIds(const int64_t* ids, size_t n) KOLO_REQUIRES(this);
  void ClearSlot(HitBoardShared::Slot& s) KOLO_REQUIRES(this);

  HitBoardShared* const shared_;
  const int rank_;
  const int size_;
  const uint64_t all_;  // every rank's bit
};

// Holds a board's lock, taken by HitBoard::Lock, until the end of its
// scope:
//
//   if (!board->Lock(deadline, keep_going)) return;
//   HitBoardLock locked(board);
class KOLO_SCOPED_CAPABILITY HitBoardLock {
 public:
  explicit HitBoardLock(HitBoard* board) KOLO_REQUIRES(board) : board_(board) {}
  ~HitBoardLock() KOLO_RELEASE() { board_->Unlock(); }
  HitBoardLock(const HitBoardLock&) = delete;
  HitBoardLock& operator=(const HitBoardLock&) = delete;

 private:
  HitBoard* const board_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_CONTROL_HIT_BOARD_H_
