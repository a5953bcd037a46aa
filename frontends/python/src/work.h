// The Work of a ProcessGroupKolo collective and the group's completer
// thread (process_group.h).
//
// Note [Futures of a process group]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A Work knows kolo's handles and its finish step (wait for the handles,
// copy the results into the caller's output tensors where torch's layout
// differs from kolo's). Whoever comes first claims the finish step, and it
// runs once:
//   * wait() runs it on the caller's thread: kolo's handle spins briefly
//     before it sleeps (Note [Spin then block]), so a blocking collective
//     costs no thread hand-off;
//   * isCompleted() runs it once the handles are done (polling);
//   * getFuture(): DDP's reducer and its communication hooks wait on the
//     Future, not on wait(), so it must complete with nobody waiting. The
//     group's completer thread takes such Works in the order their Futures
//     were asked for, blocks on the handles without spinning (it must not
//     take CPU from the backward pass it overlaps: Work::WaitQuietly),
//     finishes them and completes their Futures (running the Futures'
//     callbacks, e.g. a comm hook's decompression, on that thread).
// A Work nobody asks about is never touched by that thread.
//
// Threads: every method may be called from any thread (torch calls them
// with the GIL released).
#ifndef KOLO_FRONTENDS_PYTHON_SRC_WORK_H_
#define KOLO_FRONTENDS_PYTHON_SRC_WORK_H_

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "kolo/torch/context.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace torch {

// One collective of a ProcessGroupKolo (Note [Futures of a process group]).
class Completer;

class KoloWork : public c10d::Work {
 public:
  KoloWork(int rank, c10d::OpType type, std::string name,
           std::vector<Handle> handles,
           std::function<std::vector<at::Tensor>()> finish,
           std::weak_ptr<Completer> completer);
  ~KoloWork() override;

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  // Waits for completion (up to `timeout`, if not kNoTimeout) and throws
  // the collective's error. Returns true.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Blocks until kolo's handles are done, without spinning (errors are
  // left to the finish step).
  void BlockQuietly() const;
  // Runs the finish step and completes the Work, unless another thread
  // claimed it first. Whether this call ran it.
  bool TryFinish();

  const std::string& name() const { return name_; }

 private:
  void Complete(std::vector<at::Tensor> outputs, std::exception_ptr error);

  const std::string name_;
  // Fixed after construction (the completer reads them while a caller may
  // run the finish step).
  const std::vector<Handle> handles_;
  const std::weak_ptr<Completer> completer_;
  std::function<std::vector<at::Tensor>()> finish_;  // the claimer's
  std::atomic<bool> claimed_{false};
  // outputs_ and future_ (made by the first getFuture()) are read and
  // written under c10d::Work's mutex_ with c10d::Work's own state
  // (completed_, exception_); that mutex is LibTorch's std::mutex, which the
  // thread-safety analysis cannot name (Note [Annotated locks]).
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Joins `thread`, with the GIL released while it waits if this thread holds
// it. A group's threads may need the GIL to end (the completer runs
// Futures' Python callbacks), and torch destroys a group under the GIL
// (pybind's dealloc of the backend): joining them with the GIL held would
// wait forever.
void JoinWithoutGil(std::thread& thread);

// The completer thread of a group (Note [Futures of a process group]).
class Completer {
 public:
  Completer();
  ~Completer();  // finishes the Works queued, then joins
  void Add(c10::intrusive_ptr<KoloWork> work);

 private:
  void Run();
  Mutex mu_;
  CondVar cv_;
  std::deque<c10::intrusive_ptr<KoloWork>> queue_ KOLO_GUARDED_BY(mu_);
  bool stopping_ KOLO_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_FRONTENDS_PYTHON_SRC_WORK_H_
