// kolo's C++ API without LibTorch, as a user's program on kolo::core
// (CMake) or `pkg-config kolo-core` builds it: under kolorun, an allreduce
// over the job's ranks; alone, a one-rank job through an in-memory store.
// Checks its own mappings: no torch or c10 library may be loaded. Prints
// "OK core rank R of N" when every check passes.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "kolo/runtime.h"
#include "kolo/store.h"

namespace {

// The first torch library in this process's mappings, or "".
std::string LoadedTorchLibrary() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    for (const char* name : {"libtorch", "libc10"}) {
      if (line.find(std::string("/") + name) != std::string::npos) {
        return line.substr(line.find('/'));
      }
    }
  }
  return "";
}

}  // namespace

int main() {
  kolo::Options options;
  if (std::getenv("KOLO_RANK") != nullptr) {
    auto from_env = kolo::Runtime::OptionsFromEnvironment();
    if (!from_env.ok()) {
      std::printf("FAILED: %s\n",
                  std::string(from_env.status().message()).c_str());
      return 1;
    }
    options = *from_env;
  } else {
    options.store = kolo::NewInMemoryStore();
    options.secret = "core-consumer-test";
  }
  auto runtime = kolo::Runtime::Create(options);
  if (!runtime.ok()) {
    std::printf("FAILED: %s\n",
                std::string(runtime.status().message()).c_str());
    return 1;
  }
  const int rank = (*runtime)->rank(), size = (*runtime)->size();
  std::vector<float> x = {1, 2, float(rank)};
  kolo::AllreduceRequest request;
  request.name = "x";
  request.op = kolo::ReduceOp::kSum;
  request.input = request.output =
      kolo::TensorView(x.data(), kolo::DataType::kFloat32, {3});
  auto work = (*runtime)->Allreduce(request);
  const float want = size * (size - 1) / 2.0f;
  if (!work.ok() || !work->Wait().ok() || x[0] != size || x[2] != want ||
      !(*runtime)->Shutdown().ok()) {
    std::printf("FAILED rank %d: allreduce\n", rank);
    return 1;
  }
  const std::string torch = LoadedTorchLibrary();
  if (!torch.empty()) {
    std::printf("FAILED rank %d: %s is loaded\n", rank, torch.c_str());
    return 1;
  }
  std::printf("OK core rank %d of %d\n", rank, size);
  return 0;
}
