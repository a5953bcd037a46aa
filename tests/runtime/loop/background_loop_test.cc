// BackgroundLoop on its own (runtime/loop/background_loop.h), in a job of
// one rank over a real gloo backend, with the coordinator's exchange: the
// loop's thread takes submissions, negotiates them with rank 0's
// coordinator and executes the lists; a name seen before goes as a cache
// id; a caller that queued quietly and tried a turn gets its collective;
// a shutdown request ends the loop with the job's final list, a failed job
// ends it at once.
#include "runtime/loop/background_loop.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "runtime/loop/coordinator_exchange.h"

namespace kolo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);

class BackgroundLoopTest : public ::testing::Test {
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
    loop_ = std::make_unique<BackgroundLoop>(BackgroundLoop::Context{
        &options_, &logger_, &timeline_, &queue_, sets_.get(), &job_,
        log_.get(), [this](const absl::Status& s) { Fail(s); }});
    loop_->Wire(nullptr,
                std::make_unique<CoordinatorExchange>(nullptr, log_.get()),
                nullptr, nullptr);
  }
  void TearDown() override {
    if (thread_.joinable()) {
      Fail(absl::AbortedError("the test ended"));
      thread_.join();
    }
  }
  // What RuntimeImpl::Fatal does that the loop relies on: the job's error,
  // the queue closed, the loop rung.
  void Fail(const absl::Status& s) {
    if (!job_.Fail(s)) return;
    queue_.Close(s);
    if (loop_) loop_->Notify();
  }
  void StartLoop() {
    loop_->Open();
    thread_ = std::thread([this] { loop_->Run(); });
  }

  // A float32 sum allreduce of `data` (in place) named `name`.
  std::unique_ptr<TensorEntry> Allreduce(const std::string& name,
                                         std::vector<float>* data) {
    auto e = std::make_unique<TensorEntry>();
    e->request.set_type(wire::ALLREDUCE);
    e->request.set_name(name);
    e->request.set_process_set(kGlobalProcessSet);
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
    e->work->SetWaitPolicy(options_.spin_time, loop_->waiters());
    return e;
  }
  std::map<std::string, int64_t> Counters() const {
    std::map<std::string, int64_t> c;
    loop_->AddCounters(&c);
    return c;
  }

  Options options_;
  Logger logger_{LogLevel::kError, 0};
  Timeline timeline_;
  TensorQueue queue_{[this] {
    if (loop_) loop_->Notify();
  }};
  JobState job_;
  std::unique_ptr<ProcessSets> sets_;
  std::unique_ptr<LogExecutor> log_;
  std::unique_ptr<BackgroundLoop> loop_;
  std::thread thread_;
};

TEST_F(BackgroundLoopTest,
       SubmissionsAreNegotiatedAndRunAndANameSeenBeforeGoesAsItsId) {
  StartLoop();
  std::vector<float> a = {1, 2, 3};
  for (int step = 0; step < 2; ++step) {
    auto e = Allreduce("grad.a", &a);
    auto work = e->work;
    ASSERT_TRUE(queue_.Add(std::move(e)).ok());
    ASSERT_TRUE(work->Wait(kWait).ok()) << work->Wait(kWait);
  }
  EXPECT_THAT(a, ElementsAre(1, 2, 3));  // the sum over one rank
  const auto c = Counters();
  EXPECT_EQ(c.at("negotiation.requests_sent"), 1);
  EXPECT_EQ(c.at("negotiation.cache_hits_sent"), 1);
  EXPECT_EQ(c.at("negotiation.request_lists_sent"), 2);
  EXPECT_EQ(loop_->messages_sent(), 2);
  EXPECT_EQ(log_->counters().collectives_executed, 2);
  EXPECT_FALSE(job_.failed());
}

TEST_F(BackgroundLoopTest, AQuietSubmissionRunsOnceItsCallerTriesATurn) {
  StartLoop();
  std::vector<float> a = {4};
  auto e = Allreduce("quiet", &a);
  auto work = e->work;
  ASSERT_TRUE(queue_.AddQuietly(std::move(e)).ok());
  // The coordinator's exchange has no log a caller polls: the caller rings
  // the thread instead of taking a turn.
  loop_->TryTurn(*work);
  ASSERT_TRUE(work->Wait(kWait).ok());
  EXPECT_EQ(Counters().at("loop.caller_turns"), 0);
}

TEST_F(BackgroundLoopTest, AShutdownRequestEndsTheLoopWithTheFinalList) {
  StartLoop();
  loop_->RequestShutdown();
  ASSERT_TRUE(job_.WaitLoopEnded(absl::Now() + kWait));
  thread_.join();
  EXPECT_FALSE(job_.failed());
  EXPECT_EQ(sets_->global().executed_seq, 1);  // the final list
  EXPECT_EQ(log_->counters().response_lists_received, 1);
}

TEST_F(BackgroundLoopTest, AFailedJobEndsTheLoopAndFailsWhatIsQueued) {
  StartLoop();
  std::vector<float> a = {1};
  Fail(absl::UnavailableError("rank 3 was lost"));
  ASSERT_TRUE(job_.WaitLoopEnded(absl::Now() + kWait));
  thread_.join();
  // Nothing is taken after the job failed.
  absl::Status refused = queue_.Add(Allreduce("late", &a));
  EXPECT_THAT(refused.message(), HasSubstr("rank 3 was lost"));
}

}  // namespace
}  // namespace kolo
