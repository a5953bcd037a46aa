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
#include "runtime/loop/coordinator_exchange.h"
#include "tests/runtime/loop/job_of_one.h"

namespace kolo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kWait = absl::Seconds(30);

class BackgroundLoopTest : public testing::JobOfOne {
 protected:
  void SetUp() override {
    JobOfOne::SetUp();
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
  // The loop is rung as RuntimeImpl rings it.
  void Fail(const absl::Status& s) override {
    JobOfOne::Fail(s);
    if (loop_) loop_->Notify();
  }
  void Added() override {
    if (loop_) loop_->Notify();
  }
  void StartLoop() {
    loop_->Open();
    thread_ = std::thread([this] { loop_->Run(); });
  }

  // A float32 sum allreduce of `data` (in place) named `name`, whose
  // caller's wait counts as the loop's waiter.
  std::unique_ptr<TensorEntry> Allreduce(const std::string& name,
                                         std::vector<float>* data) {
    std::unique_ptr<TensorEntry> e = AllreduceEntry(name, data);
    e->work->SetWaitPolicy(options_.spin_time, loop_->waiters());
    return e;
  }
  // Until the thread has gone to sleep `n` times (then, unrung, it holds
  // no turn: a caller's TryTurn takes it).
  void AwaitSleepingThread(int64_t n = 1) {
    const absl::Time deadline = absl::Now() + kWait;
    while (Counters().at("loop.sleeps") < n) {
      ASSERT_LT(absl::Now(), deadline) << "the loop never went to sleep";
      std::this_thread::yield();
    }
  }
  std::map<std::string, int64_t> Counters() const {
    std::map<std::string, int64_t> c;
    loop_->AddCounters(&c);
    return c;
  }

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
  AwaitSleepingThread();
  std::vector<float> a = {4};
  auto e = Allreduce("quiet", &a);
  auto work = e->work;
  ASSERT_TRUE(queue_.AddQuietly(std::move(e)).ok());
  // Rank 0 over the coordinator: the caller's turn sends the list to its
  // coordinator, runs the coordinator's step and executes the list it
  // made (Note [Caller turns]), all on the calling thread.
  loop_->TryTurn(*work);
  EXPECT_TRUE(work->IsCompleted());
  ASSERT_TRUE(work->Wait(kWait).ok());
  EXPECT_EQ(Counters().at("loop.caller_turns"), 1);
  EXPECT_EQ(Counters().at("loop.caller_turns_completed"), 1);
  EXPECT_EQ(log_->counters().collectives_executed, 1);
}

TEST_F(BackgroundLoopTest, AListTheCallerMayNotRunIsLeftToTheThread) {
  StartLoop();
  AwaitSleepingThread();
  // A join's list is the thread's (Runner::CallerMayRun): the caller's
  // turn makes and sends it, then hands it back unexecuted.
  auto join = std::make_unique<TensorEntry>();
  join->request.set_type(wire::JOIN);
  join->request.set_name("__kolo_join__");
  join->work = std::make_shared<internal::WorkState>();
  auto joined = join->work;
  ASSERT_TRUE(queue_.AddQuietly(std::move(join)).ok());
  loop_->TryTurn(*joined);
  EXPECT_EQ(Counters().at("loop.caller_turns"), 1);
  EXPECT_EQ(Counters().at("loop.caller_turns_completed"), 0);
  ASSERT_TRUE(joined->Wait(kWait).ok()) << joined->Wait(kWait);
  // Once the thread ran it, callers take turns again, in order.
  AwaitSleepingThread(2);
  std::vector<float> a = {5};
  auto e = Allreduce("after", &a);
  auto work = e->work;
  ASSERT_TRUE(queue_.AddQuietly(std::move(e)).ok());
  loop_->TryTurn(*work);
  ASSERT_TRUE(work->Wait(kWait).ok()) << work->Wait(kWait);
  EXPECT_EQ(Counters().at("loop.caller_turns"), 2);
  EXPECT_EQ(Counters().at("loop.caller_turns_completed"), 1);
  EXPECT_THAT(a, ElementsAre(5));
  EXPECT_FALSE(job_.failed());
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
