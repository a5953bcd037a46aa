#include "tools/bench/bench_common.h"

#include <dirent.h>
#include <sched.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kolo {
namespace bench {
namespace {

bool ParseCollective(absl::string_view name, std::vector<Collective>* out) {
  const std::pair<const char*, Collective> known[] = {
      {"allreduce", Collective::kAllreduce},
      {"allgather", Collective::kAllgather},
      {"broadcast", Collective::kBroadcast},
      {"reducescatter", Collective::kReducescatter},
      {"alltoall", Collective::kAlltoall}};
  if (name == "all") {
    for (const auto& k : known) out->push_back(k.second);
    return true;
  }
  for (const auto& k : known) {
    if (name == k.first) {
      out->push_back(k.second);
      return true;
    }
  }
  return false;
}

bool ParseDataType(const std::string& name, DataType* dtype) {
  for (int i = 0; i < kNumDataTypes; ++i) {
    if (name == DataTypeName(static_cast<DataType>(i))) {
      *dtype = static_cast<DataType>(i);
      return true;
    }
  }
  return false;
}

bool ParseReduceOp(const std::string& name, ReduceOp* op) {
  const std::pair<const char*, ReduceOp> known[] = {
      {"sum", ReduceOp::kSum},
      {"avg", ReduceOp::kAverage},
      {"min", ReduceOp::kMin},
      {"max", ReduceOp::kMax},
      {"prod", ReduceOp::kProduct}};
  for (const auto& k : known) {
    if (name == k.first) {
      *op = k.second;
      return true;
    }
  }
  return false;
}

}  // namespace

const char* CollectiveName(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "allreduce";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReducescatter:
      return "reducescatter";
    case Collective::kAlltoall:
      return "alltoall";
  }
  return "?";
}

bool ParseBytes(const std::string& text, int64_t* bytes) {
  if (text.empty()) return false;
  int64_t unit = 1;
  std::string digits = text;
  switch (absl::ascii_toupper(text.back())) {
    case 'K':
      unit = 1 << 10;
      break;
    case 'M':
      unit = 1 << 20;
      break;
    case 'G':
      unit = int64_t{1} << 30;
      break;
    default:
      break;
  }
  if (unit != 1) digits.pop_back();
  int64_t v;
  if (!absl::SimpleAtoi(digits, &v) || v < 1) return false;
  *bytes = v * unit;
  return true;
}

std::string FormatBytes(int64_t bytes) {
  if (bytes >= (int64_t{1} << 30) && bytes % (int64_t{1} << 30) == 0) {
    return absl::StrCat(bytes >> 30, "G");
  }
  if (bytes >= (1 << 20) && bytes % (1 << 20) == 0)
    return absl::StrCat(bytes >> 20, "M");
  if (bytes >= (1 << 10) && bytes % (1 << 10) == 0)
    return absl::StrCat(bytes >> 10, "K");
  return absl::StrCat(bytes);
}

int64_t CountFor(Collective c, int64_t bytes, DataType dtype, int ranks) {
  int64_t count =
      std::max<int64_t>(1, bytes / static_cast<int64_t>(DataTypeSize(dtype)));
  if (c == Collective::kAllgather || c == Collective::kReducescatter ||
      c == Collective::kAlltoall) {
    count = std::max<int64_t>(ranks, count / ranks * ranks);
  }
  return count;
}

double BusFactor(Collective c, int ranks) {
  const double n = ranks;
  switch (c) {
    case Collective::kAllreduce:
      return 2.0 * (n - 1) / n;
    case Collective::kBroadcast:
      return 1.0;
    default:
      return (n - 1) / n;
  }
}

int IterationsFor(int64_t bytes) {
  if (bytes <= (64 << 10)) return 200;
  if (bytes <= (1 << 20)) return 100;
  if (bytes <= (16 << 20)) return 20;
  return 5;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t i =
      std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[i];
}

int64_t MemoryBytes(Collective c, int64_t moved, int ranks) {
  const double n = static_cast<double>(moved), p = ranks;
  if (ranks < 2) return 0;
  const double exchange = 2 * n / p + 4 * n * (p - 1) / p;  // alltoall
  double bytes = 0;
  switch (c) {
    case Collective::kAllreduce:
      bytes = moved <= (32 << 10) ? (p + 3) * n
                                  : 4 * n * (p - 1) / p + n + 2 * n / p;
      break;
    case Collective::kBroadcast:
    case Collective::kAllgather:
      bytes = 2 * n;
      break;
    case Collective::kAlltoall:
      bytes = exchange;
      break;
    case Collective::kReducescatter:
      bytes = exchange + 2 * n / p + 3 * n * (p - 1) / p;
      break;
  }
  return static_cast<int64_t>(bytes);
}

double MeasureCopyBandwidth(int64_t bytes) {
  const size_t n = static_cast<size_t>(std::max<int64_t>(bytes, 1));
  std::vector<uint8_t> from(n, 1), to(n, 0);  // touched: no faults
  const int copies = static_cast<int>(std::min<int64_t>(
      100000, std::max<int64_t>(5, (int64_t{256} << 20) / n)));
  double best = 0;
  for (int i = 0; i < copies; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(to.data(), from.data(), n);
    const auto t1 = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(t1 - t0).count();
    if (s > 0) best = std::max(best, 2.0 * n / s / 1e9);
    from[i % n] = to[n - 1 - i % n];  // the copies are used
  }
  return best;
}

void Die(const std::string& what) {
  std::fprintf(stderr, "kolo_bench: %s\n", what.c_str());
  std::fflush(stderr);
  std::_Exit(1);
}

std::string Usage(const char* argv0) {
  return absl::StrCat("usage: ", argv0, R"( [flags]
  --ops LIST            allreduce,allgather,broadcast,reducescatter,alltoall or all
                        (default allreduce)
  --sizes B1,B2,...     sizes in bytes (suffixes K, M, G; default 4096,1M,64M)
  --minbytes B --maxbytes B [--stepfactor F]
                        sizes B, B*F, ... up to the maximum (F default 2)
  --dtype NAME          float32 (default), float64, float16, bfloat16, int32, ...
  --op NAME             sum (default), avg, min, max, prod
  --mode MODE           latency (default: p50/p99 of lone ops), loop (mean
                        over back-to-back ops), fusion (N tensors per step)
  --fusion-tensors N    tensors per step in fusion mode (default 200)
  --fusion-bytes S      bytes per tensor in fusion mode (default 4096)
  --call blocking|async how a lone kolo allreduce is called: AllreduceAndWait
                        (default) or Allreduce, then Work::Wait
  --iters N --warmup N  timed and untimed iterations (default: by size; 3)
  --baselines LIST      gloo,mpi,torch or none (default gloo)
  --csv PATH            write every measurement (rank 0)
  --plot PATH.png       plot bus bandwidth against size (needs matplotlib)
  --mpi-bench PATH --torch-bench PATH --plot-script PATH --mpirun PATH
  --python PATH         helpers (default: next to this binary; mpirun;
                        /usr/bin/python3)
  --idle SECONDS        measure the CPU an idle initialised job uses
  --roofline            measure the copy bandwidth (every rank at once) and
                        print kolo's bytes through memory per rank (mem(B))
                        and their share of that bandwidth (roof%) per size
)");
}

bool ParseFlags(int argc, char** argv, Flags* f) {
  int64_t min_bytes = 0, max_bytes = 0;
  double factor = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--roofline") {  // the one flag without a value
      f->roofline = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "kolo_bench: %s needs a value\n", arg.c_str());
      return false;
    }
    const std::string value = argv[++i];
    bool ok = true;
    if (arg == "--sizes") {
      f->sizes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        int64_t v;
        ok = ok && ParseBytes(std::string(s), &v);
        if (ok) f->sizes.push_back(v);
      }
    } else if (arg == "--minbytes") {
      ok = ParseBytes(value, &min_bytes);
    } else if (arg == "--maxbytes") {
      ok = ParseBytes(value, &max_bytes);
    } else if (arg == "--stepfactor") {
      ok = absl::SimpleAtod(value, &factor) && factor > 1;
    } else if (arg == "--ops") {
      f->ops.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        ok = ok && ParseCollective(s, &f->ops);
      }
    } else if (arg == "--dtype") {
      ok = ParseDataType(value, &f->dtype);
    } else if (arg == "--op") {
      ok = ParseReduceOp(value, &f->op);
    } else if (arg == "--mode") {
      if (value == "latency")
        f->mode = Mode::kLatency;
      else if (value == "loop")
        f->mode = Mode::kLoop;
      else if (value == "fusion")
        f->mode = Mode::kFusion;
      else
        ok = false;
    } else if (arg == "--fusion-tensors") {
      ok =
          absl::SimpleAtoi(value, &f->fusion_tensors) && f->fusion_tensors >= 1;
    } else if (arg == "--fusion-bytes") {
      ok = ParseBytes(value, &f->fusion_bytes);
    } else if (arg == "--call") {
      ok = value == "blocking" || value == "async";
      f->blocking = value == "blocking";
    } else if (arg == "--iters") {
      ok = absl::SimpleAtoi(value, &f->iters) && f->iters >= 1;
    } else if (arg == "--warmup") {
      ok = absl::SimpleAtoi(value, &f->warmup) && f->warmup >= 0;
    } else if (arg == "--idle") {
      ok = absl::SimpleAtoi(value, &f->idle_seconds) && f->idle_seconds >= 1;
    } else if (arg == "--baselines") {
      f->baselines.clear();
      if (value != "none") {
        for (absl::string_view s : absl::StrSplit(value, ',')) {
          ok = ok && (s == "gloo" || s == "mpi" || s == "torch");
          f->baselines.emplace_back(s);
        }
      }
    } else if (arg == "--csv") {
      f->csv = value;
    } else if (arg == "--plot") {
      f->plot = value;
    } else if (arg == "--mpi-bench") {
      f->mpi_bench = value;
    } else if (arg == "--torch-bench") {
      f->torch_bench = value;
    } else if (arg == "--plot-script") {
      f->plot_script = value;
    } else if (arg == "--mpirun") {
      f->mpirun = value;
    } else if (arg == "--python") {
      f->python = value;
    } else {
      std::fprintf(stderr, "kolo_bench: unknown flag %s\n", arg.c_str());
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "kolo_bench: bad value for %s: %s\n", arg.c_str(),
                   value.c_str());
      return false;
    }
  }
  if (min_bytes || max_bytes) {
    if (!min_bytes) min_bytes = 4;
    if (!max_bytes) max_bytes = 256 << 20;
    f->sizes.clear();
    for (double b = static_cast<double>(min_bytes); b <= max_bytes * 1.0001;
         b *= factor) {
      f->sizes.push_back(static_cast<int64_t>(b));
    }
  }
  return true;
}

namespace {

void SetEveryThread(const cpu_set_t& set) {
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return;
  while (struct dirent* entry = readdir(dir)) {
    int tid = 0;
    if (!absl::SimpleAtoi(entry->d_name, &tid)) continue;
    sched_setaffinity(tid, sizeof(set), &set);  // best effort
  }
  closedir(dir);
}

}  // namespace

UnboundScope::UnboundScope() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) saved_.push_back(cpu);
    }
  }
  CPU_ZERO(&set);
  const long online = sysconf(_SC_NPROCESSORS_CONF);
  for (long cpu = 0; cpu < online && cpu < CPU_SETSIZE; ++cpu)
    CPU_SET(cpu, &set);
  SetEveryThread(set);
}

UnboundScope::~UnboundScope() {
  if (saved_.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : saved_) CPU_SET(cpu, &set);
  SetEveryThread(set);
}

}  // namespace bench
}  // namespace kolo
