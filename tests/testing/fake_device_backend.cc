#include "tests/testing/fake_device_backend.h"

#include <cstring>
#include <numeric>

namespace kolo {
namespace testing {

DeviceStats& FakeDeviceStats() {
  static DeviceStats* stats = new DeviceStats;
  return *stats;
}

FakeDeviceBackend::FakeDeviceBackend(std::unique_ptr<Backend> wire, int rank,
                                     absl::Duration op_timeout)
    : wire_(std::move(wire)),
      rank_(rank),
      op_timeout_(op_timeout),
      thread_([this] { CompletionLoop(); }) {
  ++FakeDeviceStats().created;
}

FakeDeviceBackend::~FakeDeviceBackend() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  thread_.join();
}

// Device memory is host memory here, but only the backend touches it.
absl::StatusOr<void*> FakeDeviceBackend::Allocate(size_t bytes) {
  ++FakeDeviceStats().live_allocations;
  return Backend::Allocate(bytes);
}

void FakeDeviceBackend::Free(void* data) {
  --FakeDeviceStats().live_allocations;
  Backend::Free(data);
}

void FakeDeviceBackend::Copy(void* dst, const void* src, size_t bytes) {
  ++FakeDeviceStats().copies;
  Backend::Copy(dst, src, bytes);
}

absl::Status FakeDeviceBackend::WaitReady(
    const std::vector<std::shared_ptr<ReadyEvent>>& ready) {
  const absl::Time deadline = absl::Now() + op_timeout_;
  for (const auto& event : ready) {
    while (event && !event->Ready()) {
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("ready event never fired");
      }
      std::this_thread::yield();
    }
  }
  return absl::OkStatus();
}

absl::Status FakeDeviceBackend::Allreduce(void* data, size_t count,
                                          DataType dtype, ReduceOp op) {
  return wire_->Allreduce(data, count, dtype, op);
}

absl::Status FakeDeviceBackend::Broadcast(void* data, size_t bytes, int root) {
  return wire_->Broadcast(data, bytes, root);
}

absl::Status FakeDeviceBackend::Allgatherv(const void* input, void* output,
                                           const std::vector<size_t>& bytes) {
  return wire_->Allgatherv(input, output, bytes);
}

absl::Status FakeDeviceBackend::Alltoallv(const void* input,
                                          const std::vector<size_t>& send,
                                          void* output,
                                          const std::vector<size_t>& recv) {
  return wire_->Alltoallv(input, send, output, recv);
}

absl::Status FakeDeviceBackend::Reducescatterv(
    const void* input, void* output, const std::vector<size_t>& counts,
    DataType dtype, ReduceOp op, double prescale, double postscale) {
  const size_t elem = DataTypeSize(dtype);
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
  std::vector<uint8_t> all(total * elem);
  if (total) std::memcpy(all.data(), input, total * elem);
  absl::Status s =
      AllreduceScaled(all.data(), total, dtype, op, prescale, postscale);
  if (!s.ok()) return s;
  size_t offset = 0;
  for (int r = 0; r < rank_; ++r) offset += counts[r];
  if (counts[rank_]) {
    std::memcpy(output, all.data() + offset * elem, counts[rank_] * elem);
  }
  return absl::OkStatus();
}

void FakeDeviceBackend::Combine(void* out, const void* in, size_t count,
                                DataType dtype, ReduceOp op) {
  wire_->Combine(out, in, count, dtype, op);
}

void FakeDeviceBackend::Scale(void* data, size_t count, DataType dtype,
                              double factor) {
  wire_->Scale(data, count, dtype, factor);
}

void FakeDeviceBackend::Finish(std::function<void(absl::Status)> done) {
  ++FakeDeviceStats().finishes;
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(done));
  }
  cv_.NotifyAll();
}

void FakeDeviceBackend::Close() { wire_->Close(); }

void FakeDeviceBackend::CompletionLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && queue_.empty()) cv_.Wait(&mu_);
    if (queue_.empty()) return;
    auto done = std::move(queue_.front());
    queue_.pop_front();
    lock.Unlock();
    ++FakeDeviceStats().completed_elsewhere;
    if (FakeDeviceStats().fail_finishes.load() > 0) {
      --FakeDeviceStats().fail_finishes;
      done(absl::InternalError("fake device error: the stream faulted"));
    } else {
      done(absl::OkStatus());
    }
    lock.Lock();
  }
}

}  // namespace testing
}  // namespace kolo
