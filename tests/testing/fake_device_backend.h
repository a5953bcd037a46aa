// FakeDeviceBackend: a stand-in device backend for tests without a GPU.
// It behaves like a device backend towards the executor (host_memory()
// false: memory only through Allocate/Copy, ready events waited for, a
// reduce-scatter of its own, completion reported later from its own
// thread through Finish) and moves the bytes with a real host backend
// (`wire`, e.g. gloo). Its "device memory" is host memory, so a test can
// check results directly. Used by tests/runtime/api/device_path_test.cc (as the
// CUDA backend of a local job) and the backend contract suite.
#ifndef KOLO_TESTS_TESTING_FAKE_DEVICE_BACKEND_H_
#define KOLO_TESTS_TESTING_FAKE_DEVICE_BACKEND_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/loop/backend.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace testing {

// Counters of every FakeDeviceBackend of the process.
struct DeviceStats {
  std::atomic<int> created{0};
  std::atomic<int> live_allocations{0};
  std::atomic<int> copies{0};
  std::atomic<int> finishes{0};
  std::atomic<int> completed_elsewhere{0};  // done() on the completion thread
  std::atomic<int> fail_finishes{0};        // > 0: the next Finish fails
};
DeviceStats& FakeDeviceStats();

class FakeDeviceBackend : public Backend {
 public:
  // `rank`: this rank in the set (for the reduce-scatter's share).
  FakeDeviceBackend(std::unique_ptr<Backend> wire, int rank,
                    absl::Duration op_timeout);
  ~FakeDeviceBackend() override;
  const char* name() const override { return "fakedev"; }
  bool host_memory() const override { return false; }

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* data) override;
  void Copy(void* dst, const void* src, size_t bytes) override;
  absl::Status WaitReady(
      const std::vector<std::shared_ptr<ReadyEvent>>& ready) override;
  absl::Status Allreduce(void* data, size_t count, DataType dtype,
                         ReduceOp op) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status Allgatherv(const void* input, void* output,
                          const std::vector<size_t>& bytes) override;
  absl::Status Alltoallv(const void* input, const std::vector<size_t>& send,
                         void* output,
                         const std::vector<size_t>& recv) override;
  absl::Status Reducescatterv(const void* input, void* output,
                              const std::vector<size_t>& counts, DataType dtype,
                              ReduceOp op, double prescale,
                              double postscale) override;
  void Combine(void* out, const void* in, size_t count, DataType dtype,
               ReduceOp op) override;
  void Scale(void* data, size_t count, DataType dtype, double factor) override;
  void Finish(std::function<void(absl::Status)> done) override;
  void Close() override;

 private:
  void CompletionLoop();

  const std::unique_ptr<Backend> wire_;
  const int rank_;
  const absl::Duration op_timeout_;
  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void(absl::Status)>> queue_ KOLO_GUARDED_BY(mu_);
  bool stop_ KOLO_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_TESTING_FAKE_DEVICE_BACKEND_H_
