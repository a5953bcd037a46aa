#include "ops/nccl/completion_queue.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/nccl/communicator.h"
#include "ops/nccl/cuda_util.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace nccl {

CompletionQueue::CompletionQueue(int device, Hooks hooks)
    : device_(device), hooks_(std::move(hooks)) {
  thread_ = std::thread([this] { Loop(); });
}

CompletionQueue::~CompletionQueue() {
  Stop();
  // Whatever is left was failed by the owner or is dropped unanswered.
  for (Entry& e : pending_) cudaEventDestroy(e.event);
}

void CompletionQueue::Stop() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.NotifyAll();
  if (thread_.joinable()) thread_.join();
}

void CompletionQueue::Add(cudaEvent_t event,
                          std::function<void(absl::Status)> done,
                          absl::Duration timeout, std::string what) {
  absl::Status failed;
  {
    MutexLock lock(&mu_);
    failed = failure_;
    if (failed.ok()) {
      pending_.push_back(Entry{next_id_++, event, std::move(done),
                               absl::Now() + timeout, timeout,
                               std::move(what)});
    }
  }
  if (!failed.ok()) {
    cudaEventDestroy(event);
    done(failed);
    return;
  }
  cv_.NotifyOne();
}

void CompletionQueue::FailAll(const absl::Status& status) {
  std::deque<Entry> failed;
  absl::Status reason;
  {
    MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = status;
    reason = failure_;
    failed.swap(pending_);
  }
  for (Entry& e : failed) {
    // Destroying a pending event is allowed: CUDA frees it once it
    // completes.
    cudaEventDestroy(e.event);
    e.done(reason);
  }
}

absl::Status CompletionQueue::failure() const {
  MutexLock lock(&mu_);
  return failure_;
}

size_t CompletionQueue::pending() const {
  MutexLock lock(&mu_);
  return pending_.size();
}

void CompletionQueue::Fail(const absl::Status& status) {
  if (hooks_.abort) hooks_.abort(status);
  FailAll(status);
}

void CompletionQueue::Loop() {
  const absl::Status device_set =
      CudaStatus(cudaSetDevice(device_), "cudaSetDevice (completion thread)");
  Backoff backoff;
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && pending_.empty()) cv_.Wait(&mu_);
    if (stop_) return;
    const uint64_t id = pending_.front().id;
    const cudaEvent_t event = pending_.front().event;
    const absl::Time deadline = pending_.front().deadline;
    const absl::Duration timeout = pending_.front().timeout;
    const std::string what = pending_.front().what;
    lock.Unlock();

    absl::Status failure = device_set;
    cudaError_t query = cudaSuccess;
    if (failure.ok()) {
      query = cudaEventQuery(event);
      if (query != cudaSuccess && query != cudaErrorNotReady) {
        failure = CudaStatus(
            query, absl::StrCat("NCCL ", what, ": cudaEventQuery").c_str());
      }
    }
    if (failure.ok() && query == cudaSuccess) {
      std::function<void(absl::Status)> done;
      lock.Lock();
      if (!pending_.empty() && pending_.front().id == id) {
        done = std::move(pending_.front().done);
        pending_.pop_front();
      }
      lock.Unlock();
      if (done) {
        cudaEventDestroy(event);
        done(absl::OkStatus());
      }
      backoff.Reset();
      lock.Lock();
      continue;
    }
    if (failure.ok() && hooks_.check) {
      absl::Status async = hooks_.check();
      if (!async.ok()) {
        failure = absl::Status(
            async.code(),
            absl::StrCat("NCCL ", what, " failed: ", async.message(),
                         "; communicator aborted"));
      }
    }
    if (failure.ok() && absl::Now() > deadline) {
      failure = absl::DeadlineExceededError(
          absl::StrCat("NCCL ", what, " did not complete within ",
                       absl::ToDoubleSeconds(timeout),
                       " s (KOLO_OP_TIMEOUT); communicator aborted"));
    }
    if (!failure.ok()) {
      Fail(failure);
      lock.Lock();
      continue;
    }
    // Not done yet: spin a little, then sleep (woken early by stop).
    const absl::Duration sleep = backoff.next();
    lock.Lock();
    if (sleep == absl::ZeroDuration()) {
      lock.Unlock();
      backoff.Pause();
      lock.Lock();
    } else {
      backoff.Tick();  // the wait below is the sleep
      const absl::Time until = absl::Now() + sleep;
      while (!stop_ && cv_.WaitUntil(&mu_, until)) {
      }
    }
  }
}

}  // namespace nccl
}  // namespace kolo
