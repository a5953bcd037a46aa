// ShmRing: a single-producer, single-consumer ring of messages in shared
// memory, and ShmControlSegment: the per-job segment that carries the
// control plane's request and response lists between ranks on one host.
//
// Note [Control over shared memory]
// When every rank of the job runs on one host (and KOLO_SHM is on), request
// lists (rank r -> coordinator) and response lists (coordinator -> rank r)
// travel through two rings per rank in one segment instead of the loopback
// TCP connection: a message is a memcpy into the ring plus a Wakeup
// (runtime/sync/wakeup.h) of the receiver's background thread, which waits
// on a doorbell word in the same segment. Local events (a caller's submit,
// a control-plane reader thread) ring the same doorbell, so the background
// thread waits on one word for everything. The TCP connection stays: it
// carries the handshake, heartbeats, "rank k lost" and "job failed", and
// its closing is how a dead rank is noticed (Note [Liveness] in
// runtime_impl.cc), exactly as without shared memory. What TCP ordering
// used to guarantee (a rank's shutdown request before its connection
// closes; the coordinator's final list before its own) is kept by flags in
// the segment that the sender sets before it sends: a peer that closes
// after setting them is leaving, not lost.
// The segment is an os::SharedSegment and follows its Note [Segment
// lifetime] (runtime/os/shared_segment.h): a random name, mode 0600,
// unlinked as soon as every rank has mapped it, so nothing is left in
// /dev/shm even after kill -9.
//
// Messages larger than a fragment (a quarter of the ring) are split; a
// writer that finds the ring full waits for the reader (spin, then short
// sleeps) at most until its deadline, and gives up at once when `keep_going`
// says so (the plane was closed or lost a peer). While it waits it runs
// `keep_going`, which also drains the writer's own incoming rings, so two
// ranks that both write into full rings cannot deadlock.
//
// Thread safety: one producer thread and one consumer thread per ring.
#ifndef KOLO_RUNTIME_CONTROL_SHM_RING_H_
#define KOLO_RUNTIME_CONTROL_SHM_RING_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/control/hit_board.h"
#include "runtime/os/shared_segment.h"
#include "runtime/sync/wakeup.h"

namespace kolo {

// Lives in shared memory, zero-initialised.
struct ShmRingHeader {
  alignas(64) std::atomic<uint64_t> head;  // bytes ever written (producer)
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever consumed (consumer)
};

class ShmRing {
 public:
  // `capacity`: a power of two, at least 64 bytes.
  ShmRing(ShmRingHeader* header, uint8_t* data, size_t capacity,
          size_t max_message);

  // Producer. Writes `message` (split into fragments as needed). If the
  // ring is full, waits until the consumer makes room, `deadline`
  // (DeadlineExceeded) or `keep_going` returns false (Cancelled).
  absl::Status Write(const std::string& message, absl::Time deadline,
                     const std::function<bool()>& keep_going);

  // Producer, never blocks: writes the fragments of `message` from byte
  // *offset on while the ring has room for them, advancing *offset (start
  // at 0); true once all of it is in the ring.
  bool TryWrite(const std::string& message, size_t* offset);

  // Consumer. Moves complete messages into `out`; never blocks.
  // DataLoss if a message exceeds `max_message` (a broken peer).
  absl::Status ReadAll(std::vector<std::string>* out);

  // Whether the consumer has something to read (any thread, for tests).
  bool HasData() const;
  size_t max_fragment() const { return max_fragment_; }

 private:
  void CopyIn(uint64_t pos, const void* src, size_t n);
  void CopyOut(uint64_t pos, void* dst, size_t n) const;

  ShmRingHeader* const header_;
  uint8_t* const data_;
  const size_t capacity_;
  const size_t max_message_;
  const size_t max_fragment_;
  std::string partial_;  // consumer only: fragments of an unfinished message
};

// Everything in the segment that is not a ring.
struct ShmControlRank {
  WakeupWord doorbell;                        // this rank's background thread
  alignas(64) std::atomic<uint32_t> leaving;  // asked to shut down (rank r)
  // Rank r waits for room in its ring to rank 0 (the host relay's writers):
  // the reader rings r's doorbell once it has read.
  std::atomic<uint32_t> waiting_for_room;
  // The host relay's leader (rank 0 of the host's segment) stopped
  // relaying before the job's end (its loop ended on an error).
  std::atomic<uint32_t> stopped;
};

class ShmControlSegment {
 public:
  // Ring size per direction per rank: 256 KiB, less for jobs of more than
  // 17 ranks (at least 64 KiB), so that the segment stays near 8 MiB (16
  // MiB at 128 ranks) and leaves /dev/shm to the data path. Messages larger
  // than a ring's fragment size are split anyway.
  static size_t RingBytes(int size);

  // Creates a segment for `size` ranks under a fresh random name (returned
  // in *name), mapped, with the global set's hit board (Note [Hits on the
  // board] in hit_board.h) enabled if `hit_board`. Errors as
  // os::SharedSegment::Create.
  static absl::StatusOr<std::unique_ptr<ShmControlSegment>> Create(
      int rank, int size, size_t max_message, std::string* name,
      bool hit_board = false, int64_t fusion_threshold_bytes = 0);
  // Maps the segment `name` created for `size` ranks. Errors as
  // os::SharedSegment::Open, and FailedPrecondition when the segment is not
  // a control segment for `size` ranks.
  static absl::StatusOr<std::unique_ptr<ShmControlSegment>> Open(
      const std::string& name, int rank, int size, size_t max_message);
  // Removes the name (mappings stay valid); absent is fine.
  static void Unlink(const std::string& name);

  ~ShmControlSegment() = default;  // Unmaps.
  ShmControlSegment(const ShmControlSegment&) = delete;
  ShmControlSegment& operator=(const ShmControlSegment&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // This rank's doorbell; Notify(r) rings rank r's.
  Wakeup& doorbell() { return *doorbells_[rank_]; }
  void Notify(int r) { doorbells_[r]->Notify(); }
  // Rank r (> 0) -> coordinator, and coordinator -> rank r.
  ShmRing& up(int r) { return *up_[r]; }
  ShmRing& down(int r) { return *down_[r]; }
  // Rank r asked to leave the job (set before its shutdown request).
  void SetLeaving(int r);
  bool leaving(int r) const;
  void SetWaitingForRoom(int r, bool waiting) {
    ranks_[r].waiting_for_room.store(waiting ? 1 : 0,
                                     std::memory_order_seq_cst);
  }
  bool waiting_for_room(int r) const {
    return ranks_[r].waiting_for_room.load(std::memory_order_seq_cst) != 0;
  }
  void SetStopped(int r) {
    ranks_[r].stopped.store(1, std::memory_order_seq_cst);
  }
  bool stopped(int r) const {
    return ranks_[r].stopped.load(std::memory_order_seq_cst) != 0;
  }
  // The coordinator sent (or is about to send) its final list.
  void SetCoordinatorDone() { SetLeaving(0); }
  bool coordinator_done() const { return leaving(0); }
  // The hit board, or null if the creator did not enable it.
  HitBoard* hit_board() { return board_->enabled() ? board_.get() : nullptr; }

 private:
  ShmControlSegment(std::unique_ptr<os::SharedSegment> segment, int rank,
                    int size, size_t max_message);
  static size_t Bytes(int size);

  const std::unique_ptr<os::SharedSegment> segment_;
  const int rank_;
  const int size_;
  ShmControlRank* ranks_;
  std::vector<std::unique_ptr<Wakeup>> doorbells_;
  std::vector<std::unique_ptr<ShmRing>> up_, down_;  // index 0 unused
  std::unique_ptr<HitBoard> board_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_CONTROL_SHM_RING_H_
