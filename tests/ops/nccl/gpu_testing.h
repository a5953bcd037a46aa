// Helpers of the GPU tests: skip without a GPU, device buffers, events.
// The tests run under Bazel here (and skip) and as plain executables on a
// GPU machine (tools/device_check.sh carries them there).
#ifndef KOLO_TESTS_OPS_NCCL_GPU_TESTING_H_
#define KOLO_TESTS_OPS_NCCL_GPU_TESTING_H_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "kolo/tensor.h"
#include "ops/nccl/cuda_util.h"

namespace kolo {
namespace testing {

// Empty when cuda:0 is usable, else why not.
inline std::string NoGpuReason() {
  absl::Status s = nccl::ProbeCudaDevice(Device::Cuda(0));
  return s.ok() ? std::string() : std::string(s.message());
}

// GTEST_SKIP()s the current test, with "no GPU: <why>" (also on stdout, so
// that a log of a plain run says what was skipped).
#define KOLO_SKIP_WITHOUT_GPU()                                            \
  do {                                                                     \
    const std::string kolo_no_gpu = ::kolo::testing::NoGpuReason();        \
    if (!kolo_no_gpu.empty()) {                                            \
      std::printf(                                                         \
          "SKIPPED %s: no GPU: %s\n",                                      \
          ::testing::UnitTest::GetInstance()->current_test_info()->name(), \
          kolo_no_gpu.c_str());                                            \
      GTEST_SKIP() << "no GPU: " << kolo_no_gpu;                           \
    }                                                                      \
  } while (0)

#define KOLO_CUDA_OK(call)                             \
  do {                                                 \
    const cudaError_t kolo_err = (call);               \
    ASSERT_EQ(kolo_err, cudaSuccess)                   \
        << #call ": " << cudaGetErrorString(kolo_err); \
  } while (0)

// cudaMalloc'd memory on the current device, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&data_, bytes ? bytes : 1) != cudaSuccess) data_ = nullptr;
  }
  ~DeviceBuffer() {
    if (data_) cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool Upload(const void* host, size_t bytes) {
    return bytes == 0 || cudaMemcpy(data_, host, bytes,
                                    cudaMemcpyHostToDevice) == cudaSuccess;
  }
  bool Download(void* host, size_t bytes) const {
    return bytes == 0 || cudaMemcpy(host, data_, bytes,
                                    cudaMemcpyDeviceToHost) == cudaSuccess;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

// A ReadyEvent the test turns ready.
class FlagReadyEvent : public ReadyEvent {
 public:
  bool Ready() override { return ready_.load(); }
  void Set() { ready_ = true; }

 private:
  std::atomic<bool> ready_{false};
};

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_OPS_NCCL_GPU_TESTING_H_
