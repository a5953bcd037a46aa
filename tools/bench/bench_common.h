// Shared pieces of kolo_bench: flags, the collectives it measures, the
// nccl-tests formulas, timing helpers and measurement records.
#ifndef KOLO_TOOLS_BENCH_BENCH_COMMON_H_
#define KOLO_TOOLS_BENCH_BENCH_COMMON_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kolo/types.h"

namespace kolo {
namespace bench {

enum class Collective {
  kAllreduce,
  kAllgather,
  kBroadcast,
  kReducescatter,
  kAlltoall
};
const char* CollectiveName(Collective c);

// How a size is timed (see docs/benchmarks.md):
//  kLatency: one op submitted and waited for, repeated; p50 and p99.
//  kLoop:    `iters` ops back to back, one timer around the loop; the mean.
//  kFusion:  per step, `fusion_tensors` allreduces of `fusion_bytes` each,
//            submitted asynchronously, then all waited for.
enum class Mode { kLatency, kLoop, kFusion };

struct Flags {
  std::vector<Collective> ops = {Collective::kAllreduce};
  std::vector<int64_t> sizes = {4096, 1 << 20, 64 << 20};
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Mode mode = Mode::kLatency;
  int fusion_tensors = 200;
  int64_t fusion_bytes = 4096;
  // How a lone kolo allreduce is called (latency and loop modes, and the
  // fusion mode's "one blocking call each"): Runtime::AllreduceAndWait
  // (blocking), or Runtime::Allreduce then Work::Wait (async).
  bool blocking = true;
  int iters = 0;  // 0: chosen per size (IterationsFor)
  int warmup = 3;
  int idle_seconds = 0;
  // Baselines measured in the same run: "gloo" (in process, same buffers),
  // "mpi" (OpenMPI, a separate program under mpirun), "torch"
  // (torch.distributed gloo, a Python script).
  std::vector<std::string> baselines = {"gloo"};
  std::string csv;   // rank 0 writes every measurement here
  std::string plot;  // PNG of bus bandwidth against size
  // Helpers; empty = found next to the binary (Bazel runfiles).
  std::string mpi_bench, torch_bench, plot_script;
  std::string mpirun = "mpirun";
  std::string python = "/usr/bin/python3";  // Debian's, with torch
  // --roofline: measure this machine's copy bandwidth first and print,
  // beside each size, kolo's bytes through memory per rank and the share
  // of that bandwidth they make (Note [Roofline]).
  bool roofline = false;
  // Measured copy bandwidth (rank 0's) by size, when roofline.
  std::map<int64_t, double> copy_gbps;
};

// Parses argv; false (and a message on stderr) on a bad flag.
bool ParseFlags(int argc, char** argv, Flags* flags);
std::string Usage(const char* argv0);

// "4", "64K", "1M", "256M" -> bytes; false if malformed.
bool ParseBytes(const std::string& text, int64_t* bytes);
// 4 -> "4", 1048576 -> "1M".
std::string FormatBytes(int64_t bytes);

// Elements moved for a size of `bytes` (nccl-tests: the result buffer of
// allreduce/broadcast, the full gathered/scattered/exchanged buffer of the
// others, rounded down to a multiple of the world size, at least one per
// rank).
int64_t CountFor(Collective c, int64_t bytes, DataType dtype, int ranks);
// busbw = algbw * factor: 2(n-1)/n allreduce, (n-1)/n allgather,
// reducescatter, alltoall; 1 broadcast.
double BusFactor(Collective c, int ranks);
// Note [Roofline]
// How close a collective comes to the memory limit: the bytes one rank
// reads and writes in memory for it (MemoryBytes), per second, as a share
// of the copy bandwidth every rank gets while all copy buffers of the same
// size at once (MeasureCopyBandwidth: a memcpy of n bytes counts 2n, its
// read and its write). The copy is measured per size because the limit is
// the cache's up to the last level's size and memory's beyond it, and the
// collective's own buffers are as warm as the copy's (both repeat on the
// same buffers). MemoryBytes counts the copies and reductions of kolo's
// shared-memory backend (ops/shm/shm_backend.cc) for `moved` bytes (the
// table's size) on `ranks` ranks, N = moved, p = ranks:
//   allreduce, N <= 32 KiB (AllreduceSmall): copy in 2N, reduce every
//     rank's input (p + 1)N: (p + 3)N;
//   allreduce, larger (AllreducePipelined): the other shares in and out
//     4N(p-1)/p, reducing its share N + N/p, into Result and back N/p:
//     4N(p-1)/p + N + 2N/p (4N at p = 2);
//   broadcast: the root copies in, the others out: 2N;
//   allgather: its block in 2N/p, the others out 2N(p-1)/p: 2N;
//   alltoall: its own slot 2N/p, the others in and out 4N(p-1)/p;
//   reducescatter (the executor's alltoall, then a copy and p-1 combines of
//     its N/p): alltoall's + 2N/p + 3N(p-1)/p.
// The segment's chunks are reused stage after stage, so above the cache's
// size part of that traffic still stays in the cache: roof% can pass 100
// there. Bytes a single-copy path would not move (the copies in and out of
// the segment) are what lowers mem(B) itself.
int64_t MemoryBytes(Collective c, int64_t moved, int ranks);
// The copy bandwidth of this process in GB/s (2n bytes per memcpy of n)
// for buffers of `bytes`: the best of enough copies to take a few
// milliseconds. Call it on every rank at once.
double MeasureCopyBandwidth(int64_t bytes);

// The default iteration count for a size (also used by the baselines).
int IterationsFor(int64_t bytes);

double Percentile(std::vector<double> values, double p);

// Note [Baselines run unbound]
// kolorun binds each rank to its share of the CPUs (--bind-to core, Note
// [Binding] in tools/kolorun/process.h). Every baseline is measured the way
// its own launcher runs it: plain gloo and torch.distributed unbound (as
// torchrun does), MPI bound by mpirun's own default. So while a baseline
// runs, every thread of this process, and every program it starts, may use
// every CPU; kolo's own measurements keep the binding kolorun gave.
class UnboundScope {
 public:
  UnboundScope();   // every thread of this process on every online CPU
  ~UnboundScope();  // every thread back on the calling thread's old CPUs
  UnboundScope(const UnboundScope&) = delete;
  UnboundScope& operator=(const UnboundScope&) = delete;

 private:
  std::vector<int> saved_;
};

// Runs op(i) `warmup` times, then `iters` timed times; microseconds each.
template <typename F>
std::vector<double> TimeEach(int warmup, int iters, F&& op) {
  for (int i = 0; i < warmup; ++i) op(i);
  std::vector<double> us;
  us.reserve(iters);
  for (int i = 0; i < iters; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    op(warmup + i);
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return us;
}

// One timer around `iters` ops: the mean, in microseconds.
template <typename F>
double TimeLoop(int warmup, int iters, F&& op) {
  for (int i = 0; i < warmup; ++i) op(i);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) op(warmup + i);
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / iters;
}

// One result row. `op` is a collective name, or "fusion_per_tensor" /
// "fusion_batch" /
// "fusion_fused" / "fusion_async" for the fusion workload.
struct Measurement {
  std::string impl;  // "kolo", "gloo", "mpi", "torch"
  std::string op;
  int64_t bytes = 0;
  double p50_us = 0, p99_us = 0, mean_us = 0;
};

[[noreturn]] void Die(const std::string& what);

}  // namespace bench
}  // namespace kolo

#endif  // KOLO_TOOLS_BENCH_BENCH_COMMON_H_
