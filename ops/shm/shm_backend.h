// The shm backend: CPU collectives among the ranks of a process set that
// all run on one host, through one shared-memory segment per set.
//
// Why: within a host, gloo goes through loopback TCP (~100 us per round
// trip, ~2 GB/s), while the memory system moves ~8 GB/s per core. Here every
// rank copies its data into the segment, the ranks reduce disjoint shares
// with ops/cpu's vectorised kernels, and every rank copies the result out.
//
// Contract (runtime/loop/backend.h): collectives are called by one thread per
// rank, in the same order on every rank; Close() may be called from any
// thread and makes waiting ranks (of every process) fail: a rank that
// waits when a peer closes first gives its own runtime up to 1 s (kCloseGrace,
// Note [Naming the lost rank]) to close it too, so that its error names the
// lost rank rather than the segment. Every wait
// is bounded by BackendContext::op_timeout. Results are bitwise identical
// on every rank (Note [Bitwise identical results] in shm_backend.cc).
// Creation is collective and either succeeds on every rank or fails on every
// rank with the same error, so that the runtime's fallback to gloo is taken
// by all ranks alike.
#ifndef KOLO_OPS_SHM_SHM_BACKEND_H_
#define KOLO_OPS_SHM_SHM_BACKEND_H_

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ops/cpu/host_backend.h"
#include "ops/shm/barrier.h"
#include "runtime/os/shared_segment.h"

namespace kolo {
namespace shm {

// Tuning; the defaults are what the registered "shm" backend uses.
struct ShmOptions {
  // Bytes per rank per pipeline stage. The segment holds 2 * (size + 1)
  // such chunks, so memory stays bounded whatever the tensor size.
  // 0: 1 MiB, less for sets of more than 15 ranks (see ChunkBytesFor).
  size_t chunk_bytes = 0;
  // Allreduces up to this many bytes take one stage in which every rank
  // reduces the whole tensor (one barrier) instead of its share (two).
  size_t small_allreduce_bytes = 32 << 10;
  // How long a waiting rank spins before it sleeps in the kernel.
  absl::Duration spin = absl::Microseconds(50);
};

// The chunk size used for a set of `size` ranks when ShmOptions leaves it 0.
size_t ChunkBytesFor(int size);

class ShmBackend : public cpu::HostBackend {
 public:
  // Collective: every rank of the set calls it (see the file comment).
  // FailedPrecondition when !context.all_ranks_on_host; Unavailable or
  // ResourceExhausted (naming the rank and /dev/shm's free space) when the
  // segment cannot be created or mapped on some rank.
  static absl::StatusOr<std::unique_ptr<ShmBackend>> Create(
      const BackendContext& context, const ShmOptions& options = {});
  ~ShmBackend() override;

  const char* name() const override { return "shm"; }
  absl::Status Allreduce(void* data, size_t count, DataType dtype,
                         ReduceOp op) override;
  // The pipelined Allreduce (same stages, barriers and segment use, so
  // ranks may mix the two), straight from and to the pieces. Not for
  // allreduces small enough for Allreduce's one-stage path (packing them
  // costs less than the per-piece work): Unimplemented.
  bool SupportsAllreducePieces(size_t count, DataType dtype) const override;
  absl::Status AllreducePieces(const std::vector<FusedPiece>& pieces,
                               size_t count, DataType dtype,
                               ReduceOp op) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Allgatherv(const void* input, void* output,
                          const std::vector<size_t>& bytes_per_rank) override;
  absl::Status Alltoallv(const void* input,
                         const std::vector<size_t>& send_bytes, void* output,
                         const std::vector<size_t>& recv_bytes) override;
  void Close() override;

  // Diagnostics and tests.
  size_t chunk_bytes() const { return chunk_; }
  size_t segment_bytes() const { return segment_ ? segment_->size() : 0; }
  uint64_t futex_sleeps() const {
    return barrier_ ? barrier_->futex_sleeps() : 0;
  }

 private:
  ShmBackend(const BackendContext& context, const ShmOptions& options,
             std::unique_ptr<os::SharedSegment> segment, size_t chunk);
  Clock::time_point Deadline() const;
  absl::Status Arrive(Clock::time_point deadline, const char* what);
  // The parity of the next barrier (Note [Double buffering]).
  int Parity() const { return static_cast<int>(barrier_->step() & 1); }
  uint8_t* In(int parity, int rank) const;
  uint8_t* Result(int parity) const;
  absl::Status AllreduceSmall(uint8_t* data, size_t count, DataType dtype,
                              ReduceOp op);
  absl::Status AllreducePipelined(uint8_t* data, size_t count, DataType dtype,
                                  ReduceOp op);

  const int rank_;
  const int size_;
  const absl::Duration op_timeout_;
  const ShmOptions options_;
  const std::unique_ptr<os::SharedSegment> segment_;  // null for a set of one
  const size_t chunk_;
  uint8_t* data_ = nullptr;     // first chunk in the segment
  RankState* ranks_ = nullptr;  // in the segment
  std::unique_ptr<ShmBarrier> barrier_;
};

}  // namespace shm
}  // namespace kolo

#endif  // KOLO_OPS_SHM_SHM_BACKEND_H_
