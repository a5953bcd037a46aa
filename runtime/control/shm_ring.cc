#include "runtime/control/shm_ring.h"

#include <time.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kolo {
namespace {

constexpr uint64_t kMagic = 0x6b6f6c6f63746c31;  // "koloctl1"
constexpr size_t kFrameHeader = 8;               // u32 length, u32 last
// A writer that finds the ring full: how long it polls before it sleeps,
// and the longest sleep between checks (never on the common path: the ring
// is much larger than a typical list).
constexpr absl::Duration kFullSpin = absl::Microseconds(20);
constexpr absl::Duration kFullMaxSleep = absl::Milliseconds(1);

size_t RoundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

}  // namespace

ShmRing::ShmRing(ShmRingHeader* header, uint8_t* data, size_t capacity,
                 size_t max_message)
    : header_(header),
      data_(data),
      capacity_(capacity),
      max_message_(max_message),
      max_fragment_(capacity / 4 - kFrameHeader) {}

void ShmRing::CopyIn(uint64_t pos, const void* src, size_t n) {
  const size_t at = pos & (capacity_ - 1);
  const size_t first = std::min(n, capacity_ - at);
  std::memcpy(data_ + at, src, first);
  std::memcpy(data_, static_cast<const uint8_t*>(src) + first, n - first);
}

void ShmRing::CopyOut(uint64_t pos, void* dst, size_t n) const {
  const size_t at = pos & (capacity_ - 1);
  const size_t first = std::min(n, capacity_ - at);
  std::memcpy(dst, data_ + at, first);
  std::memcpy(static_cast<uint8_t*>(dst) + first, data_, n - first);
}

absl::Status ShmRing::Write(const std::string& message, absl::Time deadline,
                            const std::function<bool()>& keep_going) {
  size_t offset = 0;
  auto written = [&] { return TryWrite(message, &offset); };
  if (written() || SpinUntil(written, kFullSpin)) return absl::OkStatus();
  // Full: sleep between looks.
  absl::Duration sleep = absl::Microseconds(50);
  while (!written()) {
    if (keep_going && !keep_going()) {
      return absl::CancelledError("the control channel was closed");
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          "the peer did not read its shared-memory control ring");
    }
    const absl::Duration d = std::min(sleep, deadline - now);
    struct timespec ts = absl::ToTimespec(d);
    nanosleep(&ts, nullptr);
    sleep = std::min(sleep * 2, kFullMaxSleep);
  }
  return absl::OkStatus();
}

bool ShmRing::TryWrite(const std::string& message, size_t* offset) {
  if (*offset > message.size()) return true;  // (done: see below)
  do {
    const size_t n = std::min(max_fragment_, message.size() - *offset);
    const uint32_t frame[2] = {static_cast<uint32_t>(n),
                               *offset + n == message.size() ? 1u : 0u};
    const size_t need = kFrameHeader + RoundUp8(n);
    const uint64_t head = header_->head.load(std::memory_order_relaxed);
    // (seq_cst: a writer that then says it waits, or a reader that then
    // looks whether one does, sees the other's side.)
    if (capacity_ - (head - header_->tail.load(std::memory_order_seq_cst)) <
        need) {
      return false;
    }
    CopyIn(head, frame, kFrameHeader);
    CopyIn(head + kFrameHeader, message.data() + *offset, n);
    header_->head.store(head + need, std::memory_order_release);
    *offset += n;
  } while (*offset < message.size());
  // The last fragment is in; past the end marks an empty message done.
  if (message.empty()) *offset = 1;
  return true;
}

absl::Status ShmRing::ReadAll(std::vector<std::string>* out) {
  uint64_t tail = header_->tail.load(std::memory_order_relaxed);
  const uint64_t head = header_->head.load(std::memory_order_acquire);
  absl::Status result;
  while (tail < head) {
    uint32_t frame[2];
    CopyOut(tail, frame, kFrameHeader);
    const size_t n = frame[0];
    const size_t need = kFrameHeader + RoundUp8(n);
    if (n > max_fragment_ || need > head - tail ||
        partial_.size() + n > max_message_) {
      result = absl::DataLossError("malformed shared-memory control message");
      tail = head;  // Drop the rest; the caller treats the peer as lost.
      partial_.clear();
      break;
    }
    const size_t old = partial_.size();
    partial_.resize(old + n);
    CopyOut(tail + kFrameHeader, partial_.data() + old, n);
    tail += need;
    if (frame[1]) {
      out->push_back(std::move(partial_));
      partial_.clear();
    }
  }
  header_->tail.store(tail, std::memory_order_seq_cst);
  return result;
}

bool ShmRing::HasData() const {
  return header_->head.load(std::memory_order_acquire) !=
         header_->tail.load(std::memory_order_acquire);
}

size_t ShmControlSegment::RingBytes(int size) {
  const size_t rings = 2 * static_cast<size_t>(std::max(1, size - 1));
  size_t bytes = 256 << 10;
  while (bytes > (64u << 10) && bytes * rings > (8u << 20)) bytes /= 2;
  return bytes;
}

// Layout: one cache line of magic and size, the ranks' ShmControlRank,
// then per rank r > 0 its up ring and its down ring (header, then data),
// then the hit board.
size_t ShmControlSegment::Bytes(int size) {
  const size_t ring = sizeof(ShmRingHeader) + RingBytes(size);
  return 64 + sizeof(ShmControlRank) * size + 2 * ring * (size - 1) +
         HitBoard::Bytes();
}

ShmControlSegment::ShmControlSegment(std::unique_ptr<os::SharedSegment> segment,
                                     int rank, int size, size_t max_message)
    : segment_(std::move(segment)), rank_(rank), size_(size) {
  uint8_t* p = static_cast<uint8_t*>(segment_->data()) + 64;
  ranks_ = reinterpret_cast<ShmControlRank*>(p);
  p += sizeof(ShmControlRank) * size;
  for (int r = 0; r < size; ++r) {
    doorbells_.push_back(
        std::make_unique<Wakeup>(&ranks_[r].doorbell, /*shared=*/true));
  }
  up_.resize(size);
  down_.resize(size);
  for (int r = 1; r < size; ++r) {
    for (auto* rings : {&up_, &down_}) {
      auto* header = reinterpret_cast<ShmRingHeader*>(p);
      p += sizeof(ShmRingHeader);
      (*rings)[r] =
          std::make_unique<ShmRing>(header, p, RingBytes(size), max_message);
      p += RingBytes(size);
    }
  }
  board_ = std::make_unique<HitBoard>(reinterpret_cast<HitBoardShared*>(p),
                                      rank, size);
}

void ShmControlSegment::SetLeaving(int r) {
  ranks_[r].leaving.store(1, std::memory_order_seq_cst);
}

bool ShmControlSegment::leaving(int r) const {
  return ranks_[r].leaving.load(std::memory_order_seq_cst) != 0;
}

absl::StatusOr<std::unique_ptr<ShmControlSegment>> ShmControlSegment::Create(
    int rank, int size, size_t max_message, std::string* name, bool hit_board,
    int64_t fusion_threshold_bytes) {
  *name = os::SharedSegment::RandomName("kolo-ctl");
  absl::StatusOr<std::unique_ptr<os::SharedSegment>> segment =
      os::SharedSegment::Create(*name, Bytes(size));
  if (!segment.ok()) return segment.status();
  (*segment)->Populate();  // (the latency path: no page faults)
  auto* magic = static_cast<uint64_t*>((*segment)->data());
  HitBoard::Init(reinterpret_cast<HitBoardShared*>(
                     static_cast<uint8_t*>((*segment)->data()) + Bytes(size) -
                     HitBoard::Bytes()),
                 size, hit_board, fusion_threshold_bytes);
  magic[1] = static_cast<uint64_t>(size);
  std::atomic_thread_fence(std::memory_order_release);
  magic[0] = kMagic;
  return std::unique_ptr<ShmControlSegment>(
      new ShmControlSegment(*std::move(segment), rank, size, max_message));
}

absl::StatusOr<std::unique_ptr<ShmControlSegment>> ShmControlSegment::Open(
    const std::string& name, int rank, int size, size_t max_message) {
  absl::StatusOr<std::unique_ptr<os::SharedSegment>> segment =
      os::SharedSegment::Open(name, Bytes(size));
  if (!segment.ok()) return segment.status();
  (*segment)->Populate();
  const auto* magic = static_cast<const uint64_t*>((*segment)->data());
  if (magic[0] != kMagic || magic[1] != static_cast<uint64_t>(size)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", name, " is not a control segment for ",
                     size, " ranks"));
  }
  return std::unique_ptr<ShmControlSegment>(
      new ShmControlSegment(*std::move(segment), rank, size, max_message));
}

void ShmControlSegment::Unlink(const std::string& name) {
  // Only a bug fails here (ENOENT is fine): the control plane falls back to
  // TCP whatever happened to the segment.
  os::SharedSegment::Unlink(name).IgnoreError();
}

}  // namespace kolo
