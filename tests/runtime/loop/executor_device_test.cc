// Unit tests of kolo::Executor (see executor_test.cc) on a device backend
// (host_memory() false): Works complete only when the backend reports the
// response done, from another thread; asynchronous failures, FailPending,
// a completion that outlives the executor, the backend's own
// reduce-scatter, and a timed-out entry's data moved to backend memory.
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/loop/executor.h"
#include "tests/runtime/loop/executor_testing.h"

namespace kolo {
namespace {

using ::kolo::executor_testing::DeviceBackend;
using ::kolo::executor_testing::FloatEntry;
using ::kolo::executor_testing::Iota;
using ::kolo::executor_testing::kWait;
using ::kolo::executor_testing::MakeEntry;
using ::kolo::executor_testing::MakeResponse;
using ::kolo::executor_testing::NeverReady;
using ::kolo::executor_testing::Times;
using ::kolo::executor_testing::VectorAllocator;
using ::kolo::executor_testing::WorksOf;
using ::testing::ElementsAre;

// ---- A device backend: completion later, from another thread --------------

TEST(ExecutorDeviceTest, WorksCompleteOnlyWhenTheBackendReportsDone) {
  DeviceBackend backend(0, 2);
  {
    Executor executor(&backend, 0, 2, false, nullptr);
    std::vector<float> a = Iota(3, 1), b = Iota(2, 1);
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
    entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b));
    auto event = std::make_shared<NeverReady>();
    entries[1]->input.ready = event;
    auto works = WorksOf(entries);
    ASSERT_TRUE(
        executor
            .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"}, {3, 2}),
                     entries)
            .ok());
    // The executor asked the backend to order after both producers.
    ASSERT_EQ(backend.ready_events.size(), 1u);
    ASSERT_EQ(backend.ready_events[0].size(), 2u);
    EXPECT_EQ(backend.ready_events[0][0], nullptr);
    EXPECT_EQ(backend.ready_events[0][1], event);
    EXPECT_THAT(backend.calls,
                ElementsAre("WaitReady(2)", "AllreduceScaled(pre=1,post=1)",
                            "Allreduce(5,float32,sum)"));
    // Packing and unpacking went through the backend's Copy.
    EXPECT_EQ(backend.copies, 4);
    // Issued, not done: nothing completed yet.
    EXPECT_EQ(executor.pending(), 2u);
    for (const auto& w : works) EXPECT_FALSE(w->IsCompleted());
    ASSERT_EQ(backend.waiting(), 1u);
    backend.CompleteOnAnotherThread(absl::OkStatus());
    for (const auto& w : works) {
      absl::Status s = w->Wait(kWait);
      EXPECT_TRUE(s.ok()) << s;
    }
    EXPECT_EQ(executor.pending(), 0u);
    EXPECT_EQ(a, Times(Iota(3, 1), 2));
  }
  EXPECT_EQ(backend.live(), 0);
}

TEST(ExecutorDeviceTest, AsyncFailureFailsTheWorksAndIsReported) {
  DeviceBackend backend(1, 2);
  std::mutex mu;
  std::vector<absl::Status> reported;
  Executor executor(&backend, 1, 2, false, nullptr, [&](const absl::Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    reported.push_back(s);
  });
  std::vector<float> a(8, 1);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
  auto work = entries[0]->work;
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"a"}, {8}), entries)
          .ok());
  EXPECT_FALSE(work->IsCompleted());
  backend.CompleteOnAnotherThread(absl::InternalError("the stream faulted"));
  absl::Status s = work->Wait(kWait);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "allreduce \"a\" failed: the stream faulted");
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].message(), "the stream faulted");
  EXPECT_EQ(executor.pending(), 0u);
}

TEST(ExecutorDeviceTest, FailPendingFailsIssuedResponses) {
  DeviceBackend backend(0, 3);
  Executor executor(&backend, 0, 3, false, nullptr);
  std::vector<uint8_t> g = {1, 2};
  std::vector<uint8_t> out;
  std::vector<int64_t> shape;
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("g", wire::RESPONSE_ALLGATHER, g.data(), nullptr,
                              DataType::kUint8, {2}));
  entries[0]->allocator = VectorAllocator(&out, 1, &shape);
  auto work = entries[0]->work;
  wire::Response r =
      MakeResponse(wire::RESPONSE_ALLGATHER, {"g"}, {1}, DataType::kUint8);
  for (int64_t d : {2, 1, 1}) r.add_first_dims(d);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  EXPECT_EQ(executor.pending(), 1u);
  // E.g. the runtime learnt that a rank is lost while the collective runs.
  executor.FailPending(absl::UnavailableError("rank 2 lost"));
  ASSERT_TRUE(work->IsCompleted());
  EXPECT_EQ(work->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(work->status().message(), "allgather \"g\" failed: rank 2 lost");
  // The backend's later report neither changes the outcome nor leaks.
  backend.CompleteOnAnotherThread(absl::OkStatus());
  EXPECT_EQ(work->status().message(), "allgather \"g\" failed: rank 2 lost");
  EXPECT_EQ(executor.pending(), 0u);
}

TEST(ExecutorDeviceTest, CompletionAfterTheExecutorIsGoneIsNotReported) {
  DeviceBackend backend(0, 2);
  int reports = 0;
  std::shared_ptr<internal::WorkState> work;
  {
    Executor executor(&backend, 0, 2, false, nullptr,
                      [&](const absl::Status&) { ++reports; });
    std::vector<float> a(4, 1);
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
    work = entries[0]->work;
    ASSERT_TRUE(executor
                    .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"a"}, {4}),
                             entries)
                    .ok());
  }
  // The completion outlives the executor: it still completes the Work.
  backend.CompleteOnAnotherThread(absl::AbortedError("backend closed"));
  absl::Status s = work->Wait(kWait);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(s.message(), "allreduce \"a\" failed: backend closed");
  EXPECT_EQ(reports, 0);
}

TEST(ExecutorDeviceTest, ReducescatterUsesTheBackendsOwn) {
  DeviceBackend backend(2, 3);
  Executor executor(&backend, 2, 3, false, nullptr);
  std::vector<float> in(14, 1), out(4, 0);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("rs", wire::RESPONSE_REDUCESCATTER, in.data(),
                              out.data(), DataType::kFloat32, {7, 2}));
  auto work = entries[0]->work;
  wire::Response r = MakeResponse(wire::RESPONSE_REDUCESCATTER, {"rs"}, {2},
                                  DataType::kFloat32, ReduceOp::kAverage);
  r.add_first_dims(7);
  r.set_postscale(1.5);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  // Average: a sum and 1.5 / 3 afterwards; 7 rows of 2 split 3, 2, 2.
  EXPECT_THAT(backend.calls, ElementsAre("WaitReady(1)",
                                         "Reducescatterv(6,4,4,sum,pre=1,"
                                         "post=0.5)"));
  backend.CompleteOnAnotherThread(absl::OkStatus());
  EXPECT_TRUE(work->Wait(kWait).ok());
}

TEST(ExecutorDeviceTest, TimedOutEntryRunsOnBackendMemory) {
  // An entry whose caller gave up (scratch) contributes its zeros from
  // backend memory, freed once the response completes.
  DeviceBackend backend(0, 2);
  Executor executor(&backend, 0, 2, false, nullptr);
  auto e = std::make_unique<TensorEntry>();
  e->request.set_name("late");
  e->request.set_type(wire::ALLREDUCE);
  e->scratch = std::make_shared<std::vector<uint8_t>>(4 * sizeof(float), 0);
  e->input = e->output =
      TensorView(e->scratch->data(), DataType::kFloat32, {4});
  e->work = std::make_shared<internal::WorkState>();
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(std::move(e));
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"late"}, {4}),
                   entries)
          .ok());
  EXPECT_EQ(backend.live(), 1);  // the scratch's stand-in
  backend.CompleteOnAnotherThread(absl::OkStatus());
  EXPECT_EQ(backend.live(), 0);
}

}  // namespace
}  // namespace kolo
