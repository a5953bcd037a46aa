// allreduce_demo: every rank submits tensors of mixed sizes and dtypes, in a
// rank-dependent order, asynchronously; kolo negotiates, fuses and runs them.
// Each rank checks every result and prints OK.
//
//   kolorun -np 4 bazel-bin/tools/examples/allreduce_demo [--tensors N]
//       [--iterations K] [--max-elements M]
//
// Results are checked exactly (integer-valued inputs), and each rank prints a
// checksum of all its result bytes: equal checksums on every rank show the
// results are bitwise identical.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kolo/runtime.h"

namespace {

struct Flags {
  int tensors = 64;
  int iterations = 3;
  int max_elements = 1 << 18;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](int* out) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1) return false;
      *out = static_cast<int>(v);
      return true;
    };
    bool ok = false;
    if (arg == "--tensors")
      ok = value(&flags->tensors);
    else if (arg == "--iterations")
      ok = value(&flags->iterations);
    else if (arg == "--max-elements")
      ok = value(&flags->max_elements);
    if (!ok) {
      std::fprintf(stderr,
                   "usage: %s [--tensors N] [--iterations K] "
                   "[--max-elements M]\n(bad or unknown argument: %s)\n",
                   argv[0], arg.c_str());
      return false;
    }
  }
  return true;
}

// Element types the demo mixes; all represent small integers exactly.
const kolo::DataType kTypes[] = {
    kolo::DataType::kFloat32, kolo::DataType::kInt32, kolo::DataType::kFloat64,
    kolo::DataType::kInt64};

double Value(int rank, int tensor, size_t i) {
  return static_cast<double>((rank + 1) * ((tensor + i) % 13));
}

void Set(kolo::DataType t, void* p, size_t i, double v) {
  switch (t) {
    case kolo::DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case kolo::DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case kolo::DataType::kFloat64:
      static_cast<double*>(p)[i] = v;
      break;
    default:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
  }
}

double Get(kolo::DataType t, const void* p, size_t i) {
  switch (t) {
    case kolo::DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case kolo::DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case kolo::DataType::kFloat64:
      return static_cast<const double*>(p)[i];
    default:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
  }
}

uint64_t Fnv1a(uint64_t h, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  auto options = kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "kolo: %s\n",
                 std::string(options.status().message()).c_str());
    return 1;
  }
  auto runtime = kolo::Runtime::Create(*options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "kolo: %s\n",
                 std::string(runtime.status().message()).c_str());
    return 1;
  }
  kolo::Runtime& rt = **runtime;
  const int rank = rt.rank(), size = rt.size();

  // Sizes: mostly small (like biases and layer norms), some large.
  std::mt19937 sizes_rng(42);  // same on every rank
  std::vector<size_t> counts(flags.tensors);
  for (auto& c : counts) {
    c = (sizes_rng() % 4 == 0) ? sizes_rng() % flags.max_elements
                               : sizes_rng() % 1024;
  }
  const double rank_sum = size * (size + 1) / 2.0;

  uint64_t checksum = 1469598103934665603ull;
  int errors = 0;
  for (int it = 0; it < flags.iterations; ++it) {
    std::vector<std::vector<uint8_t>> buffers(flags.tensors);
    std::vector<int> order(flags.tensors);
    for (int t = 0; t < flags.tensors; ++t) {
      order[t] = t;
      kolo::DataType type = kTypes[t % 4];
      buffers[t].resize(counts[t] * kolo::DataTypeSize(type));
      for (size_t i = 0; i < counts[t]; ++i) {
        Set(type, buffers[t].data(), i, Value(rank, t, i));
      }
    }
    std::shuffle(order.begin(), order.end(), std::mt19937(rank * 31 + it));
    std::vector<kolo::Work> works(flags.tensors);
    for (int t : order) {
      kolo::AllreduceRequest req;
      req.name = "demo/tensor" + std::to_string(t);
      req.input = req.output = kolo::TensorView(
          buffers[t].data(), kTypes[t % 4], {static_cast<int64_t>(counts[t])});
      auto work = rt.Allreduce(req);
      if (!work.ok()) {
        std::fprintf(stderr, "kolo: %s\n",
                     std::string(work.status().message()).c_str());
        return 1;
      }
      works[t] = *work;
    }
    for (int t = 0; t < flags.tensors; ++t) {
      absl::Status s = works[t].Wait();
      if (!s.ok()) {
        std::fprintf(stderr, "kolo: %s\n", std::string(s.message()).c_str());
        return 1;
      }
      for (size_t i = 0; i < counts[t]; ++i) {
        const double want = rank_sum * ((t + i) % 13);
        if (Get(kTypes[t % 4], buffers[t].data(), i) != want && errors++ < 5) {
          std::fprintf(stderr, "tensor %d element %zu: got %g, want %g\n", t, i,
                       Get(kTypes[t % 4], buffers[t].data(), i), want);
        }
      }
      checksum = Fnv1a(checksum, buffers[t].data(), buffers[t].size());
    }
  }
  absl::Status s = rt.Shutdown();
  if (!s.ok()) {
    std::fprintf(stderr, "kolo: shutdown: %s\n",
                 std::string(s.message()).c_str());
    return 1;
  }
  if (errors) {
    std::printf("FAILED: %d wrong elements\n", errors);
    return 1;
  }
  std::printf(
      "OK rank %d of %d: %d tensors x %d iterations, checksum %016llx\n", rank,
      size, flags.tensors, flags.iterations,
      static_cast<unsigned long long>(checksum));
  return 0;
}
