#include "tools/bench/bench_report.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace bench {
namespace {

// A helper next to the binary: Bazel's runfiles first, then the same
// directory (an installed copy).
std::string Helper(const std::string& given, const std::string& argv0,
                   const std::string& name) {
  if (!given.empty()) return given;
  for (const std::string& candidate :
       {absl::StrCat(argv0, ".runfiles/kolo/tools/bench/", name),
        absl::StrCat(argv0.substr(0, argv0.rfind('/') + 1), name)}) {
    if (access(candidate.c_str(), R_OK) == 0) return candidate;
  }
  return name;
}

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kLatency:
      return "latency";
    case Mode::kLoop:
      return "loop";
    case Mode::kFusion:
      return "fusion";
  }
  return "?";
}

std::string Join(const std::vector<Collective>& ops) {
  std::vector<std::string> names;
  for (Collective c : ops) names.push_back(CollectiveName(c));
  return absl::StrJoin(names, ",");
}

const Measurement* Find(const std::vector<Measurement>& results,
                        const std::string& impl, const std::string& op,
                        int64_t bytes) {
  for (const Measurement& m : results) {
    if (m.impl == impl && m.op == op && m.bytes == bytes) return &m;
  }
  return nullptr;
}

std::vector<std::string> Impls(const Flags& flags) {
  std::vector<std::string> impls = {"kolo"};
  for (const std::string& b : flags.baselines) impls.push_back(b);
  return impls;
}

}  // namespace

int RunProgram(const std::vector<std::string>& argv, std::string* output) {
  absl::StatusOr<os::Pipe> pipe = os::MakePipe(O_CLOEXEC);
  if (!pipe.ok()) return -1;
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    dup2(pipe->write_end.get(), 1);
    dup2(pipe->write_end.get(), 2);
    const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) dup2(null, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s\n", args[0]);
    _exit(127);
  }
  pipe->write_end.reset();  // EOF once the program (and its children) end.
  char buf[4096];
  ssize_t n;
  while ((n = read(pipe->read_end.get(), buf, sizeof(buf))) > 0) {
    output->append(buf, n);
  }
  pipe->read_end.reset();
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> WorkloadArgs(const Flags& flags) {
  std::vector<std::string> sizes;
  for (int64_t s : flags.sizes) sizes.push_back(absl::StrCat(s));
  const char* op = "sum";
  switch (flags.op) {
    case ReduceOp::kMin:
      op = "min";
      break;
    case ReduceOp::kMax:
      op = "max";
      break;
    case ReduceOp::kProduct:
      op = "prod";
      break;
    case ReduceOp::kAverage:
      op = "avg";
      break;
    default:
      break;
  }
  std::vector<std::string> args = {"--ops",
                                   Join(flags.ops),
                                   "--sizes",
                                   absl::StrJoin(sizes, ","),
                                   "--dtype",
                                   DataTypeName(flags.dtype),
                                   "--op",
                                   op,
                                   "--mode",
                                   ModeName(flags.mode),
                                   "--fusion-tensors",
                                   absl::StrCat(flags.fusion_tensors),
                                   "--fusion-bytes",
                                   absl::StrCat(flags.fusion_bytes),
                                   "--warmup",
                                   absl::StrCat(flags.warmup)};
  if (flags.iters) {
    args.push_back("--iters");
    args.push_back(absl::StrCat(flags.iters));
  }
  return args;
}

std::vector<Measurement> ParseResults(const std::string& output) {
  std::vector<Measurement> out;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    std::string tag;
    Measurement m;
    if (in >> tag >> m.impl >> m.op >> m.bytes >> m.p50_us >> m.p99_us >>
            m.mean_us &&
        tag == "RESULT") {
      out.push_back(m);
    }
  }
  return out;
}

std::vector<Measurement> RunExternalBaselines(const Flags& flags, int ranks,
                                              const std::string& argv0) {
  std::vector<Measurement> all;
  const std::vector<std::string> workload = WorkloadArgs(flags);
  for (const std::string& baseline : flags.baselines) {
    std::vector<std::string> argv;
    if (baseline == "mpi") {
      // A separate program: OpenMPI's own launcher, shared-memory transport
      // (vader) within the host, its default binding.
      argv = {flags.mpirun,        "--allow-run-as-root",
              "--oversubscribe",   "-np",
              absl::StrCat(ranks), Helper(flags.mpi_bench, argv0, "mpi_bench")};
    } else if (baseline == "torch") {
      argv = {flags.python, Helper(flags.torch_bench, argv0, "torch_bench.py"),
              "--nproc", absl::StrCat(ranks)};
    } else {
      continue;  // gloo runs in process
    }
    argv.insert(argv.end(), workload.begin(), workload.end());
    std::string output;
    std::fprintf(stderr, "kolo_bench: running the %s baseline: %s\n",
                 baseline.c_str(), absl::StrJoin(argv, " ").c_str());
    const int rc = RunProgram(argv, &output);
    std::vector<Measurement> results = ParseResults(output);
    if (rc != 0 || results.empty()) {
      std::fprintf(stderr,
                   "kolo_bench: the %s baseline failed (exit %d):\n%s\n",
                   baseline.c_str(), rc, output.c_str());
    }
    all.insert(all.end(), results.begin(), results.end());
  }
  return all;
}

double TimeOf(const Flags& flags, const Measurement& m) {
  return flags.mode == Mode::kLoop ? m.mean_us : m.p50_us;
}

void PrintTables(const Flags& flags, int ranks,
                 const std::vector<Measurement>& results) {
  const std::vector<std::string> impls = Impls(flags);
  if (flags.mode == Mode::kFusion) {
    const int64_t total = flags.fusion_bytes * flags.fusion_tensors;
    std::printf(
        "# fusion workload: %d tensors x %lld B of %s per step, %d ranks "
        "(time per step, p50 / p99 us)\n",
        flags.fusion_tensors, static_cast<long long>(flags.fusion_bytes),
        DataTypeName(flags.dtype), ranks);
    std::printf("# %-8s %-40s %12s %12s %10s\n", "impl", "workload", "p50(us)",
                "p99(us)", "vs kolo");
    const Measurement* kolo = Find(results, "kolo", "fusion_async", total);
    const char* what[][2] = {
        {"fusion_async", "N tensors submitted async, then wait all"},
        {"fusion_batch", "N tensors in one batch call, wait all"},
        {"fusion_per_tensor", "N tensors, one blocking call each"},
        {"fusion_fused", "one allreduce of N x S bytes"}};
    for (const std::string& impl : impls) {
      for (const auto& w : what) {
        const Measurement* m = Find(results, impl, w[0], total);
        if (!m) continue;
        std::printf("  %-8s %-40s %12.1f %12.1f %9.2fx\n", impl.c_str(), w[1],
                    m->p50_us, m->p99_us,
                    kolo && kolo->p50_us > 0 ? m->p50_us / kolo->p50_us : 0.0);
      }
    }
    std::fflush(stdout);
    return;
  }
  for (Collective c : flags.ops) {
    const char* op = CollectiveName(c);
    const bool reduces =
        c == Collective::kAllreduce || c == Collective::kReducescatter;
    std::printf(
        "\n# %s, %s%s%s, %d ranks, mode %s (time: %s, us; algbw, busbw: GB/s;\n"
        "# ratio: baseline time / kolo time, > 1 means kolo is faster)\n",
        op, DataTypeName(flags.dtype), reduces ? " " : "",
        reduces ? ReduceOpName(flags.op) : "", ranks, ModeName(flags.mode),
        flags.mode == Mode::kLoop ? "mean" : "p50");
    std::string header = absl::StrCat("# ", std::string(10, ' '));
    std::printf("# %10s %10s %9s %10s %10s %8s %8s", "size(B)", "count", "type",
                "time", "p99", "algbw", "busbw");
    for (size_t i = 1; i < impls.size(); ++i) {
      std::printf(" %10s %8s %7s", (impls[i] + "(us)").c_str(), "busbw",
                  "ratio");
    }
    // Note [Roofline]: kolo's, after the baselines' columns.
    if (flags.roofline) {
      std::printf(" %12s %10s %6s", "mem(B)", "copy(GB/s)", "roof%");
    }
    std::printf("\n");
    for (int64_t bytes : flags.sizes) {
      const Measurement* kolo = Find(results, "kolo", op, bytes);
      if (!kolo) continue;
      const int64_t count = CountFor(c, bytes, flags.dtype, ranks);
      const int64_t moved =
          count * static_cast<int64_t>(DataTypeSize(flags.dtype));
      const double t = TimeOf(flags, *kolo);
      const double algbw = moved / t / 1e3;
      std::printf("  %10lld %10lld %9s %10.1f %10.1f %8.3f %8.3f",
                  static_cast<long long>(moved), static_cast<long long>(count),
                  DataTypeName(flags.dtype), t, kolo->p99_us, algbw,
                  algbw * BusFactor(c, ranks));
      for (size_t i = 1; i < impls.size(); ++i) {
        const Measurement* m = Find(results, impls[i], op, bytes);
        if (!m) {
          std::printf(" %10s %8s %7s", "n/a", "", "");
          continue;
        }
        const double bt = TimeOf(flags, *m);
        std::printf(" %10.1f %8.3f %7.2f", bt,
                    moved / bt / 1e3 * BusFactor(c, ranks), bt / t);
      }
      if (flags.roofline) {
        const int64_t memory = MemoryBytes(c, moved, ranks);
        auto copy = flags.copy_gbps.find(bytes);
        const double gbps = copy == flags.copy_gbps.end() ? 0 : copy->second;
        std::printf(" %12lld %10.2f %6.1f", static_cast<long long>(memory),
                    gbps, gbps > 0 ? 100.0 * memory / t / 1e3 / gbps : 0.0);
      }
      std::printf("\n");
    }
  }
  std::fflush(stdout);
}

void WriteCsv(const std::string& path, const Flags& flags, int ranks,
              const std::vector<Measurement>& results) {
  std::ofstream out(path);
  out << "impl,op,bytes,count,dtype,ranks,mode,p50_us,p99_us,mean_us,time_us,"
         "algbw_gbs,busbw_gbs\n";
  for (const Measurement& m : results) {
    Collective c = Collective::kAllreduce;
    bool known = false;
    for (Collective k : {Collective::kAllreduce, Collective::kAllgather,
                         Collective::kBroadcast, Collective::kReducescatter,
                         Collective::kAlltoall}) {
      if (m.op == CollectiveName(k)) {
        c = k;
        known = true;
      }
    }
    const int64_t count = CountFor(c, m.bytes, flags.dtype, ranks);
    const int64_t moved =
        known ? count * static_cast<int64_t>(DataTypeSize(flags.dtype))
              : m.bytes;
    const double t = TimeOf(flags, m);
    const double algbw = t > 0 ? moved / t / 1e3 : 0;
    out << m.impl << "," << m.op << "," << moved << "," << (known ? count : 0)
        << "," << DataTypeName(flags.dtype) << "," << ranks << ","
        << ModeName(flags.mode) << "," << m.p50_us << "," << m.p99_us << ","
        << m.mean_us << "," << t << "," << algbw << ","
        << (known ? algbw * BusFactor(c, ranks) : algbw) << "\n";
  }
}

bool Plot(const Flags& flags, const std::string& csv, const std::string& png,
          const std::string& argv0, int ranks) {
  std::string output;
  const int rc = RunProgram(
      {flags.python, Helper(flags.plot_script, argv0, "plot_bench.py"), csv,
       png, "--title",
       absl::StrCat("kolo_bench, ", ranks, " ranks, ",
                    DataTypeName(flags.dtype))},
      &output);
  if (rc != 0) {
    std::fprintf(stderr, "kolo_bench: plotting failed (exit %d): %s\n", rc,
                 output.c_str());
    return false;
  }
  std::printf("# plot written to %s\n", png.c_str());
  return true;
}

}  // namespace bench
}  // namespace kolo
