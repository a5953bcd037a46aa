// kolo_bench: collective latency and bandwidth through kolo, with plain gloo
// (no kolo) on the same buffers in the same run as the baseline.
//
//   kolorun -np 2 bazel-bin/tools/bench/kolo_bench [--sizes 4096,1048576,...]
//       [--iters N] [--warmup N]
//   kolorun -np 2 bazel-bin/tools/bench/kolo_bench --idle 10
//       (CPU time an initialised job with nothing to do uses in 10 s)
//
// Columns follow nccl-tests: size in bytes, element count, time (p50 and p99
// over iterations, microseconds), algbw = size / time and busbw = algbw *
// 2(n-1)/n for allreduce (GB/s), then the plain-gloo p50 and the ratio
// gloo/kolo (> 1: kolo is faster).
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "gloo/allreduce.h"
#include "gloo/math.h"
#include "kolo/runtime.h"
#include "kolo/store.h"
#include "ops/gloo/gloo_context.h"
#include "runtime/rendezvous/tcp_store.h"

namespace {

struct Flags {
  std::vector<int64_t> sizes = {4096, 1 << 20, 64 << 20};
  int iters = 0;  // 0: chosen per size
  int warmup = 3;
  int idle_seconds = 0;
};

bool ParseFlags(int argc, char** argv, Flags* f) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (i + 1 >= argc) return false;
    std::string value = argv[++i];
    if (arg == "--sizes") {
      f->sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        int64_t v;
        if (!absl::SimpleAtoi(s, &v) || v < 4) return false;
        f->sizes.push_back(v);
      }
    } else if (arg == "--iters") {
      if (!absl::SimpleAtoi(value, &f->iters) || f->iters < 1) return false;
    } else if (arg == "--idle") {
      if (!absl::SimpleAtoi(value, &f->idle_seconds) || f->idle_seconds < 1) return false;
    } else if (arg == "--warmup") {
      if (!absl::SimpleAtoi(value, &f->warmup) || f->warmup < 0) return false;
    } else {
      return false;
    }
  }
  return true;
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(p * v.size()));
  return v[i];
}

template <typename F>
std::vector<double> Time(int warmup, int iters, F&& op) {
  for (int i = 0; i < warmup; ++i) op(i);
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    op(warmup + i);
    auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return us;
}

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kolo_bench: %s\n", what.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr,
                 "usage: %s [--sizes B1,B2,...] [--iters N] [--warmup N] "
                 "[--idle SECONDS]\n",
                 argv[0]);
    return 2;
  }
  auto options = kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) Die(std::string(options.status().message()));
  auto rt = kolo::Runtime::Create(*options);
  if (!rt.ok()) Die(std::string(rt.status().message()));
  const int rank = (*rt)->rank(), n = (*rt)->size();

  if (flags.idle_seconds > 0) {
    // Nothing submitted: the runtime's threads should sleep, not poll.
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    sleep(flags.idle_seconds);
    getrusage(RUSAGE_SELF, &after);
    auto cpu = [](const struct rusage& u) {
      return u.ru_utime.tv_sec + u.ru_stime.tv_sec +
             (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
    };
    std::printf("idle rank %d: %.3f s CPU in %d s (%.3f%%)\n", rank,
                cpu(after) - cpu(before), flags.idle_seconds,
                100.0 * (cpu(after) - cpu(before)) / flags.idle_seconds);
    absl::Status s = (*rt)->Shutdown();
    return s.ok() ? 0 : 1;
  }

  // The baseline: a plain gloo context of its own, over the same store.
  std::shared_ptr<kolo::Store> store = kolo::NewInMemoryStore();
  if (n > 1) {
    auto client = kolo::rendezvous::ConnectTcpStore(
        options->rendezvous_addr, options->rendezvous_port, options->secret,
        options->start_timeout);
    if (!client.ok()) Die(std::string(client.status().message()));
    store = kolo::NewPrefixStore("bench/gloo", *client);
  }
  std::shared_ptr<::gloo::Context> gloo_ctx;
  if (n > 1) {
    auto ctx = kolo::gloo_backend::ConnectGlooContext(
        rank, n, store, options->bind_addr, options->start_timeout,
        options->op_timeout);
    if (!ctx.ok()) Die(std::string(ctx.status().message()));
    gloo_ctx = *ctx;
  }

  if (rank == 0) {
    std::printf("# kolo_bench: allreduce float32 sum, %d ranks\n", n);
    std::printf("# %12s %10s %10s %10s %8s %8s %10s %8s\n", "size(B)", "count",
                "p50(us)", "p99(us)", "algbw", "busbw", "gloo(us)", "ratio");
  }
  for (int64_t bytes : flags.sizes) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> buf(count, 1.0f);
    int iters = flags.iters;
    if (iters == 0) iters = bytes <= (1 << 20) ? 200 : (bytes <= (16 << 20) ? 20 : 5);
    auto kolo_us = Time(flags.warmup, iters, [&](int i) {
      kolo::AllreduceRequest req;
      req.name = "bench/" + std::to_string(bytes);
      req.input = req.output = kolo::TensorView(
          buf.data(), kolo::DataType::kFloat32, {static_cast<int64_t>(count)});
      auto w = (*rt)->Allreduce(req);
      if (!w.ok()) Die(std::string(w.status().message()));
      absl::Status s = w->Wait();
      if (!s.ok()) Die(std::string(s.message()));
    });
    std::vector<double> gloo_us(1, 0.0);
    if (gloo_ctx) {
      gloo_us = Time(flags.warmup, iters, [&](int) {
        ::gloo::AllreduceOptions opts(gloo_ctx);
        opts.setOutput(buf.data(), count);
        void (*fn)(void*, const void*, const void*, size_t) = &::gloo::sum<float>;
        opts.setReduceFunction(fn);
        ::gloo::allreduce(opts);
      });
    }
    if (rank == 0) {
      const double p50 = Percentile(kolo_us, 0.5);
      const double algbw = bytes / p50 / 1e3;  // GB/s
      const double busbw = algbw * 2.0 * (n - 1) / n;
      const double gloo_p50 = Percentile(gloo_us, 0.5);
      std::printf("  %12lld %10zu %10.1f %10.1f %8.3f %8.3f %10.1f %8.2f\n",
                  static_cast<long long>(bytes), count, p50,
                  Percentile(kolo_us, 0.99), algbw, busbw, gloo_p50,
                  gloo_p50 > 0 ? gloo_p50 / p50 : 0.0);
      std::fflush(stdout);
    }
  }
  absl::Status s = (*rt)->Shutdown();
  if (!s.ok()) Die(std::string(s.message()));
  return 0;
}
