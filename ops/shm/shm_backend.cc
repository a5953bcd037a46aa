#include "ops/shm/shm_backend.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "ops/cpu/copy.h"
#include "ops/cpu/reduce.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace shm {
namespace {

// Note [Segment layout]
//   offset 0     SegmentHeader (one cache line): what the creator decided
//   64           BarrierState (four cache lines)
//   64 + 256     RankState[size] (one cache line each)
//   page-aligned data: for parity q in {0, 1}:
//                  In(q, 0) ... In(q, size - 1), Result(q), chunk bytes each
// Every chunk is page-aligned, so vector loads never straddle two ranks'
// chunks and each rank writes only its own cache lines.
constexpr uint64_t kMagic = 0x6b6f6c6f73686d31ull;  // "kolosm1"
constexpr uint32_t kVersion = 1;
constexpr size_t kPage = 4096;
constexpr size_t kDefaultChunk = 1 << 20;
constexpr size_t kMinChunk = 64 << 10;
// Sets of many ranks get smaller chunks so that the data part of the segment
// stays near this size (containers often have a 64 MiB /dev/shm).
constexpr size_t kTargetDataBytes = 32 << 20;
// Reduction shares start on a cache line.
constexpr size_t kShareAlignBytes = 64;

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t size;
  uint64_t chunk_bytes;
  uint64_t total_bytes;
};

size_t RoundUp(size_t v, size_t to) { return (v + to - 1) / to * to; }

size_t HeaderBytes(int size) {
  return RoundUp(
      sizeof(SegmentHeader) + sizeof(BarrierState) + size * sizeof(RankState),
      kPage);
}

size_t SegmentBytes(int size, size_t chunk) {
  return HeaderBytes(size) + 2 * (size + 1) * chunk;
}

BarrierState* BarrierOf(void* base) {
  return reinterpret_cast<BarrierState*>(static_cast<uint8_t*>(base) +
                                         sizeof(SegmentHeader));
}

RankState* RanksOf(void* base) {
  return reinterpret_cast<RankState*>(static_cast<uint8_t*>(base) +
                                      sizeof(SegmentHeader) +
                                      sizeof(BarrierState));
}

// Store keys (the context's store is already prefixed per process set).
constexpr char kSegmentKey[] = "segment";
std::string AttachKey(int rank) { return absl::StrCat("attached/", rank); }

// Rank 0: creates and initialises the segment.
absl::StatusOr<std::unique_ptr<os::SharedSegment>> CreateSegment(
    const std::string& name, int size, size_t chunk) {
  auto segment = os::SharedSegment::Create(name, SegmentBytes(size, chunk));
  if (!segment.ok()) return segment.status();
  void* base = (*segment)->data();
  // The memory is zeroed; construct the atomics in place all the same.
  new (BarrierOf(base)) BarrierState();
  RankState* ranks = RanksOf(base);
  for (int r = 0; r < size; ++r) new (&ranks[r]) RankState();
  auto* header = static_cast<SegmentHeader*>(base);
  header->magic = kMagic;
  header->version = kVersion;
  header->size = static_cast<uint32_t>(size);
  header->chunk_bytes = chunk;
  header->total_bytes = (*segment)->size();
  return segment;
}

// Other ranks: maps the segment rank 0 announced as "<name> <chunk>".
absl::StatusOr<std::unique_ptr<os::SharedSegment>> OpenSegment(
    const std::string& announced, int size, size_t* chunk) {
  std::vector<std::string> parts = absl::StrSplit(announced, ' ');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], chunk) || *chunk == 0 ||
      *chunk % kPage != 0) {
    return absl::InternalError(absl::StrCat(
        "malformed shared-memory announcement \"", announced, "\""));
  }
  auto segment = os::SharedSegment::Open(parts[0], SegmentBytes(size, *chunk));
  if (!segment.ok()) return segment.status();
  const auto* header = static_cast<const SegmentHeader*>((*segment)->data());
  if (header->magic != kMagic || header->version != kVersion ||
      header->size != static_cast<uint32_t>(size) ||
      header->chunk_bytes != *chunk) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", parts[0],
                     " does not hold a kolo segment for ", size, " ranks"));
  }
  return segment;
}

// Ranks whose input pointers ReduceInRankOrder keeps on the stack.
constexpr size_t kMaxRanksOnStack = 64;

// The [lo, hi) elements of a stage of `count` elements that `rank` reduces.
std::pair<size_t, size_t> Share(size_t count, size_t elem, int rank, int size) {
  const size_t align = std::max<size_t>(1, kShareAlignBytes / elem);
  const size_t per = RoundUp((count + size - 1) / size, align);
  const size_t lo = std::min(count, per * rank);
  return {lo, std::min(count, lo + per)};
}

// Reduces `n` elements of every rank's input at `offset` into `out`, in rank
// order. Every rank's input is here at once: float16 and bfloat16 are summed
// in float over all ranks and rounded once (Note [16-bit sums rounded once]
// in ops/cpu/reduce.cc).
void ReduceInRankOrder(ReduceOp op, DataType dtype, void* out,
                       const std::vector<const uint8_t*>& inputs,
                       size_t offset_bytes, size_t n) {
  const void* at[kMaxRanksOnStack];
  std::vector<const void*> many;
  const void** in = at;
  if (inputs.size() > kMaxRanksOnStack) {
    many.resize(inputs.size());
    in = many.data();
  }
  for (size_t r = 0; r < inputs.size(); ++r) in[r] = inputs[r] + offset_bytes;
  cpu::ReduceMany(op, dtype, out, in, inputs.size(), n);
}

// Note [Reducing in blocks]
// A rank's share of a stage is reduced into Result, where the others read
// it, and copied into the rank's own output as well. Done whole, the copy
// reads a share of up to a chunk (1 MiB) back from L2 or L3; done a block
// at a time, it reads what the reduction has just written from L1. The
// arithmetic is the same, element for element (Note [Bitwise identical
// results]). A block is a multiple of every element size and of a cache
// line.
constexpr size_t kReduceBlockBytes = 8 << 10;

// Reduces `bytes` of the inputs (each read at `offset_bytes` on) into
// `result` and copies them to `out`, block by block. `out` may be the
// caller's own input: a block is reduced before it is overwritten.
void ReduceAndCopy(ReduceOp op, DataType dtype, uint8_t* result, uint8_t* out,
                   const std::vector<const uint8_t*>& inputs,
                   size_t offset_bytes, size_t bytes, size_t elem);

void CopyIfAny(void* to, const void* from, size_t bytes) {
  if (bytes && to != from) std::memmove(to, from, bytes);
}

// Every copy between a rank's buffers and the segment (Note [Copies without
// REP MOVSB] in ops/cpu/copy.h).
inline void CopyBytes(void* to, const void* from, size_t bytes) {
  cpu::Copy(to, from, bytes);
}

void ReduceAndCopy(ReduceOp op, DataType dtype, uint8_t* result, uint8_t* out,
                   const std::vector<const uint8_t*>& inputs,
                   size_t offset_bytes, size_t bytes, size_t elem) {
  for (size_t done = 0; done < bytes; done += kReduceBlockBytes) {
    const size_t n = std::min(kReduceBlockBytes, bytes - done);
    ReduceInRankOrder(op, dtype, result + done, inputs, offset_bytes + done,
                      n / elem);
    CopyBytes(out + done, result + done, n);
  }
}

}  // namespace

size_t ChunkBytesFor(int size) {
  const size_t fit = kTargetDataBytes / (2 * (static_cast<size_t>(size) + 1));
  return std::max(kMinChunk, std::min(kDefaultChunk, fit / kPage * kPage));
}

// Note [Creating the segment]
// 1. Rank 0 creates the segment under a random name and announces
//    "<name> <chunk bytes>" under "segment" in the set's store (or
//    "error <message>" if it could not).
// 2. Every rank maps it and reports "ok" or its error under
//    "attached/<rank>".
// 3. Every rank waits for every report, then unlinks the name (Note
//    [Segment lifetime] in runtime/os/shared_segment.h; whoever comes
//    first succeeds, the rest see ENOENT).
// 4. Every rank reads the same reports, so every rank returns the same
//    verdict: the backend, or an error naming each rank that failed.
absl::StatusOr<std::unique_ptr<ShmBackend>> ShmBackend::Create(
    const BackendContext& context, const ShmOptions& options) {
  const int rank = context.rank, size = context.size;
  if (size == 1) {
    return std::unique_ptr<ShmBackend>(
        new ShmBackend(context, options, nullptr, 0));
  }
  if (!context.all_ranks_on_host) {
    return absl::FailedPreconditionError(
        "the shm backend needs every rank of the set on one host");
  }
  if (!context.store) {
    return absl::InvalidArgumentError("the shm backend needs a store");
  }
  Store& store = *context.store;
  std::string name;
  size_t chunk = 0;
  absl::StatusOr<std::unique_ptr<os::SharedSegment>> segment =
      absl::UnknownError("not attached");
  if (rank == 0) {
    chunk = options.chunk_bytes ? RoundUp(options.chunk_bytes, kPage)
                                : ChunkBytesFor(size);
    // Alltoall cuts a chunk into one cache-line-aligned slot per rank.
    chunk = std::max(chunk, RoundUp(size * kShareAlignBytes, kPage));
    name = os::SharedSegment::RandomName("kolo");
    segment = CreateSegment(name, size, chunk);
    absl::Status s = store.Set(
        kSegmentKey, segment.ok()
                         ? absl::StrCat(name, " ", chunk)
                         : absl::StrCat("error ", segment.status().message()));
    if (!s.ok()) {
      os::SharedSegment::Unlink(name).IgnoreError();
      return s;
    }
  } else {
    auto announced = store.Get(kSegmentKey, context.start_timeout);
    if (!announced.ok()) {
      segment = announced.status();
    } else if (absl::StartsWith(*announced, "error ")) {
      // Rank 0's own report says why.
      segment = absl::UnavailableError("rank 0 could not create the segment");
    } else {
      name = announced->substr(0, announced->find(' '));
      segment = OpenSegment(*announced, size, &chunk);
    }
  }
  absl::Status s =
      store.Set(AttachKey(rank),
                segment.ok() ? "ok" : std::string(segment.status().message()));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(AttachKey(r));
  if (s.ok()) s = store.Wait(keys, context.start_timeout);
  if (!name.empty()) os::SharedSegment::Unlink(name).IgnoreError();
  if (!s.ok()) return s;

  std::vector<std::string> failures;
  absl::StatusCode code = absl::StatusCode::kUnavailable;
  for (int r = 0; r < size; ++r) {
    auto report = store.Get(AttachKey(r), context.start_timeout);
    if (!report.ok()) return report.status();
    if (*report != "ok")
      failures.push_back(absl::StrCat("rank ", r, ": ", *report));
    if (absl::StrContains(*report, "/dev/shm has")) {
      code = absl::StatusCode::kResourceExhausted;
    }
  }
  if (!failures.empty()) {
    return absl::Status(code,
                        absl::StrCat("shared memory for the shm backend: ",
                                     absl::StrJoin(failures, "; ")));
  }
  return std::unique_ptr<ShmBackend>(
      new ShmBackend(context, options, std::move(*segment), chunk));
}

ShmBackend::ShmBackend(const BackendContext& context, const ShmOptions& options,
                       std::unique_ptr<os::SharedSegment> segment, size_t chunk)
    : rank_(context.rank),
      size_(context.size),
      op_timeout_(context.op_timeout),
      options_(options),
      segment_(std::move(segment)),
      chunk_(chunk) {
  if (!segment_) return;
  void* base = segment_->data();
  data_ = static_cast<uint8_t*>(base) + HeaderBytes(size_);
  ranks_ = RanksOf(base);
  ShmBarrier::Config config;
  config.rank = rank_;
  config.size = size_;
  config.spin = options_.spin;
  barrier_ = std::make_unique<ShmBarrier>(BarrierOf(base), ranks_, config);
}

ShmBackend::~ShmBackend() = default;

Clock::time_point ShmBackend::Deadline() const {
  // Clamp so that an "infinite" timeout does not overflow the clock.
  const absl::Duration timeout = std::min(op_timeout_, absl::Hours(24 * 365));
  return Clock::now() + absl::ToChronoNanoseconds(timeout);
}

absl::Status ShmBackend::Arrive(Clock::time_point deadline, const char* what) {
  return barrier_->Arrive(deadline, what, op_timeout_);
}

uint8_t* ShmBackend::In(int parity, int rank) const {
  return data_ + (static_cast<size_t>(parity) * (size_ + 1) + rank) * chunk_;
}

uint8_t* ShmBackend::Result(int parity) const { return In(parity, size_); }

// Note [Double buffering]
// The data part of the segment exists twice, indexed by the parity of the
// barrier that publishes it (barriers are numbered alike on every rank).
//  - In(q, r) and RankState::value[q] are written by rank r just before
//    barrier s (q = s % 2) and read by anyone just after it, before barrier
//    s + 1.
//  - Result(q) is written just after barrier s and read just after s + 1.
// So a region is rewritten (before s + 2, or after s + 2) only after every
// rank has passed barrier s + 1, i.e. finished reading the old contents:
// one barrier per pipeline stage is enough, and collectives can follow one
// another without extra synchronisation.
//
// Note [Bitwise identical results]
// Every element of a reduction is computed by exactly one rank (its share
// of the stage), as in[0] op in[1] op ... op in[size-1], left to right (the
// owner reads its own in[] from its buffer, the others' from the segment:
// the same bytes), and copied by all; small allreduces are computed by every
// rank with that same expression over the same bytes and the same elementwise
// kernels. Either way each rank gets the same bits.
absl::Status ShmBackend::Allreduce(void* data, size_t count, DataType dtype,
                                   ReduceOp op) {
  if (size_ == 1 || count == 0) return absl::OkStatus();
  uint8_t* bytes = static_cast<uint8_t*>(data);
  if (count * DataTypeSize(dtype) <=
      std::min(options_.small_allreduce_bytes, chunk_)) {
    return AllreduceSmall(bytes, count, dtype, op);
  }
  return AllreducePipelined(bytes, count, dtype, op);
}

absl::Status ShmBackend::AllreduceSmall(uint8_t* data, size_t count,
                                        DataType dtype, ReduceOp op) {
  const auto deadline = Deadline();
  const int q = Parity();
  CopyBytes(In(q, rank_), data, count * DataTypeSize(dtype));
  KOLO_RETURN_IF_ERROR(Arrive(deadline, "allreduce"));
  std::vector<const uint8_t*> inputs(size_);
  for (int r = 0; r < size_; ++r) inputs[r] = In(q, r);
  ReduceInRankOrder(op, dtype, data, inputs, 0, count);
  return absl::OkStatus();
}

// Stage i: copy chunk i in, except this rank's own share (nobody else reads
// it); barrier; reduce this rank's share of chunk i into Result, reading its
// own input from `data` itself, and put it straight back into `data` (a
// block at a time: Note [Reducing in blocks]); copy
// the other shares of chunk i - 1 (complete since this barrier) out. One
// barrier per chunk, plus one to finish the last.
absl::Status ShmBackend::AllreducePipelined(uint8_t* data, size_t count,
                                            DataType dtype, ReduceOp op) {
  const auto deadline = Deadline();
  const size_t elem = DataTypeSize(dtype);
  const size_t chunk_elems = chunk_ / elem;
  const size_t stages = (count + chunk_elems - 1) / chunk_elems;
  std::vector<const uint8_t*> inputs(size_);
  // Copies elements [0, n) but [skip_lo, skip_hi) from `from` to `to`.
  auto copy_but = [elem](uint8_t* to, const uint8_t* from, size_t n,
                         size_t skip_lo, size_t skip_hi) {
    if (skip_lo) CopyBytes(to, from, skip_lo * elem);
    if (skip_hi < n) {
      CopyBytes(to + skip_hi * elem, from + skip_hi * elem,
                (n - skip_hi) * elem);
    }
  };
  int previous_q = 0;
  for (size_t i = 0; i <= stages; ++i) {
    const int q = Parity();
    const size_t first = i * chunk_elems;
    const size_t n = i < stages ? std::min(chunk_elems, count - first) : 0;
    uint8_t* chunk = data + first * elem;
    const auto [lo, hi] = Share(n, elem, rank_, size_);
    if (n) copy_but(In(q, rank_), chunk, n, lo, hi);
    KOLO_RETURN_IF_ERROR(Arrive(deadline, "allreduce"));
    if (hi > lo) {
      for (int r = 0; r < size_; ++r) inputs[r] = r == rank_ ? chunk : In(q, r);
      ReduceAndCopy(op, dtype, Result(q) + lo * elem, chunk + lo * elem, inputs,
                    lo * elem, (hi - lo) * elem, elem);
    }
    if (i > 0) {
      const size_t prev_first = (i - 1) * chunk_elems;
      const size_t prev_n = std::min(chunk_elems, count - prev_first);
      const auto [prev_lo, prev_hi] = Share(prev_n, elem, rank_, size_);
      copy_but(data + prev_first * elem, Result(previous_q), prev_n, prev_lo,
               prev_hi);
    }
    previous_q = q;
  }
  return absl::OkStatus();
}

namespace {

// The pieces of a fused allreduce seen as one array of bytes (their inputs
// for reading, their outputs for writing).
class PieceView {
 public:
  PieceView(const std::vector<FusedPiece>& pieces, size_t elem)
      : pieces_(pieces) {
    starts_.reserve(pieces.size() + 1);
    size_t at = 0;
    for (const FusedPiece& p : pieces) {
      starts_.push_back(at);
      at += p.count * elem;
    }
    starts_.push_back(at);
  }

  // Calls f(piece, offset in the piece, bytes, offset in [from, from + n))
  // for the parts of bytes [from, from + n), in order.
  template <typename F>
  void ForEach(size_t from, size_t n, F&& f) const {
    if (n == 0) return;
    size_t i = std::upper_bound(starts_.begin(), starts_.end(), from) -
               starts_.begin() - 1;
    size_t done = 0;
    while (done < n) {
      const size_t at = from + done;
      const size_t in_piece = at - starts_[i];
      const size_t take = std::min(n - done, starts_[i + 1] - at);
      if (take) f(pieces_[i], in_piece, take, done);
      done += take;
      ++i;
    }
  }
  void Gather(size_t from, size_t n, uint8_t* to) const {
    ForEach(from, n,
            [&](const FusedPiece& p, size_t off, size_t bytes, size_t done) {
              CopyBytes(to + done, static_cast<const uint8_t*>(p.input) + off,
                        bytes);
            });
  }
  void Scatter(size_t from, size_t n, const uint8_t* src) const {
    ForEach(from, n,
            [&](const FusedPiece& p, size_t off, size_t bytes, size_t done) {
              CopyBytes(static_cast<uint8_t*>(p.output) + off, src + done,
                        bytes);
            });
  }

 private:
  const std::vector<FusedPiece>& pieces_;
  std::vector<size_t> starts_;  // byte offset of each piece, then the total
};

}  // namespace

// AllreducePipelined over the pieces: the same stages, barriers and
// reduction order (Note [Bitwise identical results]); the only difference
// is where bytes come from and go to. This rank's own share is read from
// its inputs in place, piece by piece, as AllreducePipelined reads it from
// `data`.
bool ShmBackend::SupportsAllreducePieces(size_t count, DataType dtype) const {
  // Exactly the sizes that Allreduce pipelines (or does not communicate).
  return size_ == 1 || count == 0 ||
         count * DataTypeSize(dtype) >
             std::min(options_.small_allreduce_bytes, chunk_);
}

absl::Status ShmBackend::AllreducePieces(const std::vector<FusedPiece>& pieces,
                                         size_t count, DataType dtype,
                                         ReduceOp op) {
  const size_t elem = DataTypeSize(dtype);
  if (!SupportsAllreducePieces(count, dtype)) {
    return absl::UnimplementedError("small: pack and use Allreduce");
  }
  if (size_ == 1 || count == 0) {
    for (const FusedPiece& p : pieces)
      CopyIfAny(p.output, p.input, p.count * elem);
    return absl::OkStatus();
  }
  const PieceView view(pieces, elem);
  const auto deadline = Deadline();
  const size_t chunk_elems = chunk_ / elem;
  const size_t stages = (count + chunk_elems - 1) / chunk_elems;
  std::vector<const uint8_t*> inputs(size_);
  int previous_q = 0;
  for (size_t i = 0; i <= stages; ++i) {
    const int q = Parity();
    const size_t first = i * chunk_elems;
    const size_t n = i < stages ? std::min(chunk_elems, count - first) : 0;
    const size_t base = first * elem;
    // Plain variables: lambdas below capture them (C++17 cannot capture
    // structured bindings).
    const std::pair<size_t, size_t> share = Share(n, elem, rank_, size_);
    const size_t lo = share.first, hi = share.second;
    if (n) {
      view.Gather(base, lo * elem, In(q, rank_));
      view.Gather(base + hi * elem, (n - hi) * elem, In(q, rank_) + hi * elem);
    }
    KOLO_RETURN_IF_ERROR(Arrive(deadline, "allreduce"));
    if (hi > lo) {
      uint8_t* result = Result(q) + lo * elem;
      view.ForEach(
          base + lo * elem, (hi - lo) * elem,
          [&](const FusedPiece& p, size_t off, size_t bytes, size_t done) {
            for (int r = 0; r < size_; ++r) {
              inputs[r] = r == rank_
                              ? static_cast<const uint8_t*>(p.input) + off
                              : In(q, r) + lo * elem + done;
            }
            ReduceAndCopy(op, dtype, result + done,
                          static_cast<uint8_t*>(p.output) + off, inputs, 0,
                          bytes, elem);
          });
    }
    if (i > 0) {
      const size_t prev_first = (i - 1) * chunk_elems;
      const size_t prev_n = std::min(chunk_elems, count - prev_first);
      const auto [prev_lo, prev_hi] = Share(prev_n, elem, rank_, size_);
      const size_t prev_base = prev_first * elem;
      view.Scatter(prev_base, prev_lo * elem, Result(previous_q));
      view.Scatter(prev_base + prev_hi * elem, (prev_n - prev_hi) * elem,
                   Result(previous_q) + prev_hi * elem);
    }
    previous_q = q;
  }
  return absl::OkStatus();
}

// The root fills all `size` In chunks of a parity at once; the others copy
// them out after the barrier.
absl::Status ShmBackend::Broadcast(void* data, size_t bytes, int root) {
  if (size_ == 1 || bytes == 0) return absl::OkStatus();
  const auto deadline = Deadline();
  uint8_t* out = static_cast<uint8_t*>(data);
  const size_t span = chunk_ * size_;
  for (size_t offset = 0; offset < bytes; offset += span) {
    const size_t n = std::min(span, bytes - offset);
    const int q = Parity();
    if (rank_ == root) CopyBytes(In(q, 0), out + offset, n);
    KOLO_RETURN_IF_ERROR(Arrive(deadline, "broadcast"));
    if (rank_ != root) CopyBytes(out + offset, In(q, 0), n);
  }
  return absl::OkStatus();
}

// Stage i: every rank puts bytes [i * chunk, (i + 1) * chunk) of its block
// in its own In chunk; after the barrier everyone copies the others' out.
absl::Status ShmBackend::Allgatherv(const void* input, void* output,
                                    const std::vector<size_t>& bytes_per_rank) {
  std::vector<size_t> offset(size_, 0);
  size_t total = 0, largest = 0;
  for (int r = 0; r < size_; ++r) {
    offset[r] = total;
    total += bytes_per_rank[r];
    largest = std::max(largest, bytes_per_rank[r]);
  }
  uint8_t* out = static_cast<uint8_t*>(output);
  const uint8_t* in = static_cast<const uint8_t*>(input);
  CopyIfAny(out + offset[rank_], in, bytes_per_rank[rank_]);
  // Every rank knows every block size: all agree on the stage count.
  if (size_ == 1 || total == 0) return absl::OkStatus();
  const auto deadline = Deadline();
  for (size_t at = 0; at < largest; at += chunk_) {
    const int q = Parity();
    const size_t mine = bytes_per_rank[rank_];
    if (at < mine)
      CopyBytes(In(q, rank_), in + at, std::min(chunk_, mine - at));
    KOLO_RETURN_IF_ERROR(Arrive(deadline, "allgather"));
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || at >= bytes_per_rank[r]) continue;
      CopyBytes(out + offset[r] + at, In(q, r),
                std::min(chunk_, bytes_per_rank[r] - at));
    }
  }
  return absl::OkStatus();
}

// Each In chunk is cut into `size` slots, slot k holding the next piece for
// rank k. A rank knows only its own row and column of the traffic matrix, so
// in the first stage each rank also publishes how many stages it needs, and
// all run the maximum.
absl::Status ShmBackend::Alltoallv(const void* input,
                                   const std::vector<size_t>& send_bytes,
                                   void* output,
                                   const std::vector<size_t>& recv_bytes) {
  const uint8_t* in = static_cast<const uint8_t*>(input);
  uint8_t* out = static_cast<uint8_t*>(output);
  std::vector<size_t> send_offset(size_, 0), recv_offset(size_, 0);
  size_t largest = 0;
  for (int r = 1; r < size_; ++r) {
    send_offset[r] = send_offset[r - 1] + send_bytes[r - 1];
    recv_offset[r] = recv_offset[r - 1] + recv_bytes[r - 1];
  }
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    largest = std::max({largest, send_bytes[r], recv_bytes[r]});
  }
  CopyIfAny(out + recv_offset[rank_], in + send_offset[rank_],
            send_bytes[rank_]);
  if (size_ == 1) return absl::OkStatus();
  const size_t slot = chunk_ / size_ / kShareAlignBytes * kShareAlignBytes;
  const uint64_t my_stages = std::max<uint64_t>(1, (largest + slot - 1) / slot);
  const auto deadline = Deadline();
  uint64_t stages = 1;
  for (uint64_t stage = 0; stage < stages; ++stage) {
    const int q = Parity();
    const size_t at = stage * slot;
    if (stage == 0)
      ranks_[rank_].value[q].store(my_stages, std::memory_order_relaxed);
    for (int k = 0; k < size_; ++k) {
      if (k == rank_ || at >= send_bytes[k]) continue;
      CopyBytes(In(q, rank_) + k * slot, in + send_offset[k] + at,
                std::min(slot, send_bytes[k] - at));
    }
    KOLO_RETURN_IF_ERROR(Arrive(deadline, "alltoall"));
    if (stage == 0) {
      for (int r = 0; r < size_; ++r) {
        stages = std::max(stages,
                          ranks_[r].value[q].load(std::memory_order_relaxed));
      }
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || at >= recv_bytes[r]) continue;
      CopyBytes(out + recv_offset[r] + at, In(q, r) + rank_ * slot,
                std::min(slot, recv_bytes[r] - at));
    }
  }
  return absl::OkStatus();
}

void ShmBackend::Close() {
  if (barrier_) barrier_->Close();
}

namespace {

const BackendRegistrar kRegistrar(
    DeviceType::kCpu, "shm",
    [](const BackendContext& c) -> absl::StatusOr<std::unique_ptr<Backend>> {
      ShmOptions options;
      options.spin = c.spin_time;
      auto backend = ShmBackend::Create(c, options);
      if (!backend.ok()) return backend.status();
      return std::unique_ptr<Backend>(std::move(*backend));
    },
    // The runtime asks for "shm" by name when the set's placement allows.
    BackendSelection::kByNameOnly);

}  // namespace
}  // namespace shm
}  // namespace kolo
