// kolo_bench: collective latency and bandwidth through kolo, nccl-tests
// style, with baselines measured in the same run: plain gloo (no kolo, same
// buffers, same processes), OpenMPI (mpi_bench under mpirun) and
// torch.distributed with gloo (torch_bench.py), each with its ratio.
//
//   kolorun -np 2 bazel-bin/tools/bench/kolo_bench [--ops all]
//       [--minbytes 4 --maxbytes 256M | --sizes 4096,1M,...] [--roofline]
//       [--mode latency|loop|fusion] [--baselines gloo,mpi,torch]
//       [--csv out.csv] [--plot out.png]
//   kolorun -np 2 bazel-bin/tools/bench/kolo_bench --idle 10
//       (CPU time an initialised job with nothing to do uses in 10 s)
//
// `--help` lists every flag; docs/benchmarks.md explains the columns (size,
// count, type, time, algbw = size / time, busbw = algbw * the collective's
// nccl-tests factor) and shows measured tables.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kolo/runtime.h"
#include "kolo/store.h"
#include "ops/gloo/gloo_context.h"
#include "runtime/rendezvous/tcp_store.h"
#include "tools/bench/bench_common.h"
#include "tools/bench/bench_ops.h"
#include "tools/bench/bench_report.h"

namespace kolo {
namespace bench {
namespace {

bool Has(const std::vector<std::string>& v, const std::string& x) {
  for (const auto& s : v) {
    if (s == x) return true;
  }
  return false;
}

double CpuSeconds(const struct rusage& u) {
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
         (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

int Idle(Runtime& rt, int seconds) {
  // Nothing submitted: the runtime's threads should sleep, not poll.
  struct rusage before, after;
  getrusage(RUSAGE_SELF, &before);
  sleep(seconds);
  getrusage(RUSAGE_SELF, &after);
  const double cpu = CpuSeconds(after) - CpuSeconds(before);
  std::printf("idle rank %d: %.3f s CPU in %d s (%.3f%%)\n", rt.rank(), cpu,
              seconds, 100.0 * cpu / seconds);
  return rt.Shutdown().ok() ? 0 : 1;
}

// Resident memory of this process (kB fields of /proc/self/status).
std::string MemoryLine() {
  std::ifstream in("/proc/self/status");
  std::string line, out;
  while (std::getline(in, line)) {
    for (const char* key : {"VmHWM:", "VmRSS:", "RssAnon:", "RssShmem:"}) {
      if (line.rfind(key, 0) == 0) {
        const long kb = std::atol(line.c_str() + std::string(key).size());
        out += absl::StrCat(" ", std::string(key, std::string(key).size() - 1),
                            " ", kb / 1024, " MB");
      }
    }
  }
  return out;
}

Measurement Record(const std::string& impl, const std::string& op,
                   int64_t bytes, const std::vector<double>& us) {
  Measurement m;
  m.impl = impl;
  m.op = op;
  m.bytes = bytes;
  m.p50_us = Percentile(us, 0.5);
  m.p99_us = Percentile(us, 0.99);
  double sum = 0;
  for (double u : us) sum += u;
  m.mean_us = us.empty() ? 0 : sum / us.size();
  return m;
}

// Times `op` in the flags' mode: per-op samples (latency), or one sample
// per op equal to the loop's mean (loop).
template <typename F>
std::vector<double> Measure(const Flags& flags, int iters, F&& op) {
  if (flags.mode == Mode::kLoop) {
    return std::vector<double>(1, TimeLoop(flags.warmup, iters, op));
  }
  return TimeEach(flags.warmup, iters, op);
}

// Runtime::Counters(), compared before and after a row.
using Counts = std::map<std::string, int64_t>;

double Delta(const Counts& after, const Counts& before, const char* name) {
  return static_cast<double>(after.at(name) - before.at(name));
}

class Bench {
 public:
  Bench(Runtime* rt, const Flags& flags, std::shared_ptr<::gloo::Context> gloo)
      : flags_(flags),
        rt_(rt),
        rank_(rt->rank()),
        ranks_(rt->size()),
        kolo_(rt, flags) {
    if (gloo) gloo_ = std::make_unique<GlooRunner>(std::move(gloo), flags);
  }

  void Collectives() {
    for (Collective c : flags_.ops) {
      for (int64_t bytes : flags_.sizes) {
        const int64_t count = CountFor(c, bytes, flags_.dtype, ranks_);
        Buffers buffers(c, count, flags_.dtype, ranks_);
        const int iters = flags_.iters ? flags_.iters : IterationsFor(bytes);
        const Counts before = rt_->Counters();
        auto kolo_us =
            Measure(flags_, iters, [&](int) { kolo_.Run(c, buffers); });
        Keep(Record("kolo", CollectiveName(c), bytes, kolo_us));
        const Counts after = rt_->Counters();
        if (c == Collective::kAllreduce && flags_.blocking) {
          // Note [Caller turns]: how many lone ops the caller ran itself.
          std::cerr << absl::StrFormat(
              "# allreduce %s rank %d: %d calls, %.0f caller turns, %.0f "
              "completed in the caller's turn\n",
              FormatBytes(bytes), rank_, flags_.warmup + iters,
              Delta(after, before, "loop.caller_turns"),
              Delta(after, before, "loop.caller_turns_completed"));
        }
        if (gloo_ && gloo_->Supports(c)) {
          UnboundScope unbound;  // Note [Baselines run unbound]
          auto gloo_us =
              Measure(flags_, iters, [&](int) { gloo_->Run(c, buffers); });
          Keep(Record("gloo", CollectiveName(c), bytes, gloo_us));
        }
      }
    }
  }

  // With KOLO_PHASE_TIMES=1: the loop's phases per step of a row, mean
  // (the "phase.*" counters). The last step's completing and recycling
  // may still be under way when the row's stats are read (and count in
  // the next row's): a bias of part of one step in warmup + iters.
  void PrintPhases(const char* row, const Counts& before, const Counts& after,
                   double steps) const {
    const auto us = [&](const char* name) {
      return Delta(after, before, name) / steps / 1e3;
    };
    const double send = us("phase.send_ns");
    const double prepare = us("phase.prepare_ns");
    const double collective = us("phase.collective_ns");
    const double complete = us("phase.complete_ns");
    const double recycle = us("phase.recycle_ns");
    if (send + prepare + collective + complete + recycle <= 0) return;
    std::cerr << absl::StrFormat(
        "# fusion rank %d phases per step, %s (mean us): send %.1f, prepare "
        "%.1f, collective %.1f, complete %.1f, recycle %.1f\n",
        rank_, row, send, prepare, collective, complete, recycle);
  }

  void Fusion() {
    const int n = flags_.fusion_tensors;
    const int64_t total = flags_.fusion_bytes * n;
    const int iters = flags_.iters ? flags_.iters : 20;
    const size_t elem = DataTypeSize(flags_.dtype);
    std::vector<std::vector<uint8_t>> tensors(
        n, std::vector<uint8_t>(flags_.fusion_bytes / elem * elem, 0));
    Buffers fused(Collective::kAllreduce, total / static_cast<int64_t>(elem),
                  flags_.dtype, ranks_);
    const Counts before = rt_->Counters();
    const int64_t collectives_before = rt_->stats().collectives_executed;
    kolo_.submit_us().clear();
    const Measurement async = Record("kolo", "fusion_async", total,
                                     TimeEach(flags_.warmup, iters, [&](int) {
                                       kolo_.RunMany(tensors, "fusion");
                                     }));
    Keep(async);
    // How many control messages and collectives a step took (ideally one
    // request list per rank, one response list, one collective).
    const Counts after = rt_->Counters();
    const double steps = flags_.warmup + iters;
    std::cerr << absl::StrFormat(
        "# fusion rank %d per step: %.1f request lists sent, %.1f response "
        "lists, %.1f collectives\n",
        rank_, Delta(after, before, "negotiation.request_lists_sent") / steps,
        Delta(after, before, "negotiation.response_lists_received") / steps,
        (rt_->stats().collectives_executed - collectives_before) / steps);
    PrintPhases("async row", before, after, steps);
    const double async_submit_us = Percentile(TimedSteps(iters), 0.5);
    kolo_.submit_us().clear();
    const Measurement batch = Record("kolo", "fusion_batch", total,
                                     TimeEach(flags_.warmup, iters, [&](int) {
                                       kolo_.RunBatch(tensors, "batch");
                                     }));
    Keep(batch);
    // The caller's share of a step: building and submitting the requests.
    std::cerr << absl::StrFormat(
        "# fusion rank %d submission per step, p50: %.1f us one call per "
        "tensor, %.1f us one batch call\n",
        rank_, async_submit_us, Percentile(TimedSteps(iters), 0.5));
    const Counts before_fused = rt_->Counters();
    const Measurement one = Record("kolo", "fusion_fused", total,
                                   TimeEach(flags_.warmup, iters, [&](int) {
                                     kolo_.Run(Collective::kAllreduce, fused);
                                   }));
    Keep(one);
    PrintPhases("one-allreduce row", before_fused, rt_->Counters(), steps);
    // The step's own cost: what n tensors cost beyond one allreduce of
    // their bytes, in the same run (the aim is below 0.5 us a tensor).
    std::cerr << absl::StrFormat(
        "# fusion rank %d own cost per step beyond one %d-byte allreduce, "
        "p50: %.1f us async (%.2f us a tensor), %.1f us one batch call "
        "(%.2f us a tensor)\n",
        rank_, total, async.p50_us - one.p50_us,
        (async.p50_us - one.p50_us) / n, batch.p50_us - one.p50_us,
        (batch.p50_us - one.p50_us) / n);
    Keep(Record("kolo", "fusion_per_tensor", total,
                TimeEach(flags_.warmup, std::max(1, iters / 4), [&](int) {
                  for (int i = 0; i < n; ++i) {
                    std::vector<std::vector<uint8_t>> one(1);
                    one[0].swap(tensors[i]);
                    kolo_.RunMany(one, absl::StrCat("per_tensor_", i));
                    one[0].swap(tensors[i]);
                  }
                })));
    if (gloo_) {
      UnboundScope unbound;  // Note [Baselines run unbound]
      Keep(Record("gloo", "fusion_per_tensor", total,
                  TimeEach(flags_.warmup, std::max(1, iters / 4),
                           [&](int) { gloo_->RunMany(tensors); })));
      Keep(Record("gloo", "fusion_fused", total,
                  TimeEach(flags_.warmup, iters, [&](int) {
                    gloo_->Run(Collective::kAllreduce, fused);
                  })));
    }
  }

  std::vector<Measurement>& results() { return results_; }

 private:
  // The submission times of the last `iters` calls (TimeEach's warm-up
  // calls come first).
  std::vector<double> TimedSteps(int iters) {
    std::vector<double>& all = kolo_.submit_us();
    const size_t n = std::min(all.size(), static_cast<size_t>(iters));
    return std::vector<double>(all.end() - n, all.end());
  }

  void Keep(Measurement m) {
    if (rank_ == 0) results_.push_back(std::move(m));
  }

  const Flags& flags_;
  Runtime* const rt_;
  const int rank_;
  const int ranks_;
  KoloRunner kolo_;
  std::unique_ptr<GlooRunner> gloo_;
  std::vector<Measurement> results_;
};

int Main(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::printf("%s", Usage(argv[0]).c_str());
      return 0;
    }
  }
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr, "%s", Usage(argv[0]).c_str());
    return 2;
  }
  auto options = Runtime::OptionsFromEnvironment();
  if (!options.ok()) Die(std::string(options.status().message()));
  auto rt = Runtime::Create(*options);
  if (!rt.ok()) Die(std::string(rt.status().message()));
  if (flags.idle_seconds > 0) return Idle(**rt, flags.idle_seconds);
  const int rank = (*rt)->rank(), n = (*rt)->size();

  // The baselines' rendezvous: the job's store, under a prefix of our own.
  std::shared_ptr<Store> store;
  if (n > 1) {
    auto client = rendezvous::ConnectTcpStore(
        options->rendezvous_addr, options->rendezvous_port, options->secret,
        options->start_timeout);
    if (!client.ok()) Die(std::string(client.status().message()));
    store = NewPrefixStore("bench", *client);
  }
  std::shared_ptr<::gloo::Context> gloo_ctx;
  if (n > 1 && Has(flags.baselines, "gloo")) {
    auto ctx = gloo_backend::ConnectGlooContext(
        rank, n, NewPrefixStore("gloo", store), options->bind_addr,
        options->start_timeout, options->op_timeout);
    if (!ctx.ok()) Die(std::string(ctx.status().message()));
    gloo_ctx = *ctx;
  }

  if (flags.roofline) {  // Note [Roofline]: every rank copies at once
    const auto barrier = [&] {
      absl::StatusOr<Work> w = (*rt)->Barrier();
      absl::Status s = w.ok() ? w->Wait() : w.status();
      if (!s.ok()) Die(std::string(s.message()));
    };
    for (int64_t bytes : flags.sizes) {
      barrier();
      flags.copy_gbps[bytes] = MeasureCopyBandwidth(bytes);
    }
    barrier();
  }
  Bench bench(rt->get(), flags, gloo_ctx);
  if (flags.mode == Mode::kFusion) {
    bench.Fusion();
  } else {
    bench.Collectives();
  }
  std::vector<Measurement> results = std::move(bench.results());

  // The baselines that are programs of their own run one after the other
  // on rank 0 while the other ranks wait (blocked on the store, using no
  // CPU), so that nothing else competes for the cores.
  if (Has(flags.baselines, "mpi") || Has(flags.baselines, "torch")) {
    if (rank == 0) {
      UnboundScope unbound;  // Note [Baselines run unbound]
      auto external = RunExternalBaselines(flags, n, argv[0]);
      results.insert(results.end(), external.begin(), external.end());
      if (store) store->Set("baselines_done", "1").IgnoreError();
    } else {
      auto done = store->Get("baselines_done", absl::Hours(24));
      if (!done.ok()) Die(std::string(done.status().message()));
    }
  }

  std::fprintf(
      stderr, "# memory rank %d:%s (of which kolo's staging buffers %lld MB)\n",
      rank, MemoryLine().c_str(),
      static_cast<long long>((*rt)->stats().host_buffer_bytes >> 20));
  if (rank == 0) {
    PrintTables(flags, n, results);
    std::string csv = flags.csv;
    if (csv.empty() && !flags.plot.empty()) csv = flags.plot + ".csv";
    if (!csv.empty()) {
      WriteCsv(csv, flags, n, results);
      std::printf("# measurements written to %s\n", csv.c_str());
    }
    if (!flags.plot.empty()) Plot(flags, csv, flags.plot, argv[0], n);
  }
  absl::Status s = (*rt)->Shutdown();
  if (!s.ok()) Die(std::string(s.message()));
  return 0;
}

}  // namespace
}  // namespace bench
}  // namespace kolo

int main(int argc, char** argv) { return kolo::bench::Main(argc, argv); }
