// A job of one rank over a real gloo backend, with the parts that
// RuntimeImpl wires built the same way (the options, the queue, the job's
// state, the process sets, started, and the log executor), for the tests of
// one part of the loop: log_executor_test, background_loop_test.
#ifndef KOLO_TESTS_RUNTIME_LOOP_JOB_OF_ONE_H_
#define KOLO_TESTS_RUNTIME_LOOP_JOB_OF_ONE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kolo/store.h"
#include "runtime/api/work_state.h"
#include "runtime/loop/job_state.h"
#include "runtime/loop/log_executor.h"
#include "runtime/loop/process_sets.h"
#include "runtime/loop/tensor_queue.h"
#include "runtime/negotiation/timeline.h"

namespace kolo {
namespace testing {

class JobOfOne : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.rank = 0;
    options_.size = 1;
    options_.shm = false;
    ProcessSets::Context context;
    context.options = &options_;
    context.logger = &logger_;
    context.timeline = &timeline_;
    context.explain_failure = [](const absl::Status& s) { return s; };
    context.fatal = [this](const absl::Status& s) { Fail(s); };
    sets_ = std::make_unique<ProcessSets>(std::move(context));
    ASSERT_TRUE(sets_->Start(NewInMemoryStore()).ok());
    log_ = std::make_unique<LogExecutor>(
        options_, sets_.get(), &queue_, &job_,
        [this](const absl::Status& s) { Fail(s); },
        [](const absl::Status& s) { return s; });
  }

  // What RuntimeImpl::Fatal does that the parts rely on: the job's first
  // error, the queue closed. A test adds what its part needs.
  virtual void Fail(const absl::Status& s) {
    if (job_.Fail(s)) queue_.Close(s);
  }
  // The queue took an entry (RuntimeImpl rings the loop).
  virtual void Added() {}

  // A float32 sum allreduce of `data` (in place) named `name`, with a Work.
  static std::unique_ptr<TensorEntry> AllreduceEntry(
      const std::string& name, std::vector<float>* data,
      int set = kGlobalProcessSet) {
    auto e = std::make_unique<TensorEntry>();
    e->request.set_type(wire::ALLREDUCE);
    e->request.set_name(name);
    e->request.set_process_set(set);
    e->request.set_rank(0);
    e->request.set_dtype(static_cast<int>(DataType::kFloat32));
    e->request.add_shape(static_cast<int64_t>(data->size()));
    e->request.set_op(static_cast<int>(ReduceOp::kSum));
    e->request.set_prescale(1);
    e->request.set_postscale(1);
    e->input = e->output =
        TensorView(data->data(), DataType::kFloat32,
                   {static_cast<int64_t>(data->size())}, Device());
    e->work = std::make_shared<internal::WorkState>();
    return e;
  }

  Options options_;
  Logger logger_{LogLevel::kError, 0};
  Timeline timeline_;
  TensorQueue queue_{[this] { Added(); }};
  JobState job_;
  std::unique_ptr<ProcessSets> sets_;
  std::unique_ptr<LogExecutor> log_;
};

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_RUNTIME_LOOP_JOB_OF_ONE_H_
