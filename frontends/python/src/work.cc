// KoloWork and Completer: see work.h (Note [Futures of a process group]).
#include "frontends/python/src/work.h"

#include <ATen/core/ivalue.h>
#include <Python.h>
#include <c10/util/Exception.h>

#include <stdexcept>
#include <utility>

namespace kolo {
namespace torch {
namespace {

std::exception_ptr AsException(const std::exception& e) {
  // kolo's errors keep their type (kolo._C.KoloInternalError in Python).
  if (const auto* kolo_error = dynamic_cast<const Error*>(&e)) {
    return std::make_exception_ptr(*kolo_error);
  }
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return std::make_exception_ptr(
        std::runtime_error(c10_error->what_without_backtrace()));
  }
  return std::make_exception_ptr(std::runtime_error(e.what()));
}

}  // namespace

// ---- KoloWork -----------------------------------------------------------

KoloWork::KoloWork(int rank, c10d::OpType type, std::string name,
                   std::vector<Handle> handles,
                   std::function<std::vector<at::Tensor>()> finish,
                   std::weak_ptr<Completer> completer)
    : c10d::Work(rank, type),
      name_(std::move(name)),
      handles_(std::move(handles)),
      completer_(std::move(completer)),
      finish_(std::move(finish)) {}

KoloWork::~KoloWork() = default;

bool KoloWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  for (const Handle& h : handles_) {
    if (!h.poll()) return false;
  }
  TryFinish();  // quick now: the handles are done
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool KoloWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr KoloWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

std::vector<at::Tensor> KoloWork::result() {
  std::lock_guard<std::mutex> lock(mutex_);
  return outputs_;
}

bool KoloWork::wait(std::chrono::milliseconds timeout) {
  // Note [Futures of a process group]: finish on this thread unless
  // another did (an unbounded wait only: the finish step waits for kolo).
  if (timeout == kNoTimeout) TryFinish();
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [&] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
    TORCH_CHECK(false,
                "kolo's torch.distributed backend: Work.wait(timeout) "
                "on \"",
                name_, "\" timed out after ", timeout.count(),
                " ms; the collective is still pending");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void KoloWork::BlockQuietly() const {
  for (const Handle& h : handles_) h.block();
}

bool KoloWork::TryFinish() {
  if (claimed_.exchange(true)) return false;
  std::vector<at::Tensor> outputs;
  std::exception_ptr error;
  try {
    outputs = finish_();
  } catch (const std::exception& e) {
    error = AsException(e);
  }
  finish_ = nullptr;  // drops the tensors it holds
  Complete(std::move(outputs), error);
  return true;
}

namespace {

void MarkFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future,
                const std::vector<at::Tensor>& outputs,
                std::exception_ptr error) {
  if (error) {
    future->setError(error);
  } else {
    future->markCompleted(c10::IValue(outputs));
  }
}

}  // namespace

void KoloWork::Complete(std::vector<at::Tensor> outputs,
                        std::exception_ptr error) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = true;
    exception_ = error;
    if (!error) outputs_ = outputs;
    future = future_;
  }
  cv_.notify_all();
  // A Future asked for before completion is completed here, outside the
  // lock (its callbacks run now); one asked for later, in getFuture().
  if (future) MarkFuture(future, outputs, error);
}

c10::intrusive_ptr<c10::ivalue::Future> KoloWork::getFuture() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  bool completed;
  std::vector<at::Tensor> outputs;
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (future_) return future_;
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()));
    future = future_;
    completed = completed_;
    outputs = outputs_;
    error = exception_;
  }
  if (completed) {
    MarkFuture(future, outputs, error);
  } else if (std::shared_ptr<Completer> completer = completer_.lock()) {
    completer->Add(c10::intrusive_ptr<KoloWork>::reclaim_copy(this));
  } else {
    TryFinish();  // the group is gone: finish here, blocking
  }
  return future;
}

// ---- Completer ----------------------------------------------------------

Completer::Completer() : thread_([this] { Run(); }) {}

void JoinWithoutGil(std::thread& thread) {
  if (Py_IsInitialized() && PyGILState_Check()) {
    PyThreadState* state = PyEval_SaveThread();
    thread.join();
    PyEval_RestoreThread(state);
  } else {
    thread.join();
  }
}

Completer::~Completer() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyAll();
  JoinWithoutGil(thread_);
}

void Completer::Add(c10::intrusive_ptr<KoloWork> work) {
  {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(work));
  }
  cv_.NotifyOne();
}

void Completer::Run() {
  for (;;) {
    c10::intrusive_ptr<KoloWork> next;
    {
      MutexLock lock(&mu_);
      // At destruction the Works already queued still finish (each is
      // bounded by KOLO_OP_TIMEOUT, or fails at once at shutdown).
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      if (queue_.empty()) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    next->BlockQuietly();
    next->TryFinish();  // unless a caller of wait() did
  }
}

}  // namespace torch
}  // namespace kolo
