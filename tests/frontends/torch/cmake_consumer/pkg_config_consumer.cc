// Built with `pkg-config --cflags --libs kolo` only: kolo's C++ API on its
// own, a one-rank job through an in-memory store.
#include <cstdio>
#include <vector>

#include "kolo/runtime.h"
#include "kolo/store.h"

int main() {
  kolo::Options options;
  options.store = kolo::NewInMemoryStore();
  options.secret = "pkg-config-test";
  auto runtime = kolo::Runtime::Create(options);
  if (!runtime.ok()) {
    std::printf("FAILED: %s\n",
                std::string(runtime.status().message()).c_str());
    return 1;
  }
  std::vector<float> x = {1, 2, 3};
  kolo::AllreduceRequest request;
  request.name = "x";
  request.input = request.output =
      kolo::TensorView(x.data(), kolo::DataType::kFloat32, {3});
  auto work = (*runtime)->Allreduce(request);
  if (!work.ok() || !work->Wait().ok() || x[2] != 3 ||
      !(*runtime)->Shutdown().ok()) {
    std::printf("FAILED: allreduce on one rank\n");
    return 1;
  }
  std::printf("OK pkg-config\n");
  return 0;
}
