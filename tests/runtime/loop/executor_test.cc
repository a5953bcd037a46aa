// Unit tests of kolo::Executor against recording fake backends
// (executor_testing.h), one rank of a simulated set: responses and entries
// built by hand, as LogExecutor::ExecuteResponse hands them over. This file:
// error, barrier and join responses, and allreduce: the bytes each entry
// ends with, one backend collective per fused response, AllreducePieces
// where offered and packing where it must (small sizes, a prescale,
// tensors whose memory overlaps), scaling and averaging, and a failed
// collective. executor_collectives_test.cc has the other collectives,
// executor_device_test.cc the asynchronous completion of a device backend.
#include "runtime/loop/executor.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/loop/executor_testing.h"

namespace kolo {
namespace {

using ::kolo::executor_testing::FloatEntry;
using ::kolo::executor_testing::Iota;
using ::kolo::executor_testing::MakeEntry;
using ::kolo::executor_testing::MakeResponse;
using ::kolo::executor_testing::RecordingBackend;
using ::kolo::executor_testing::Times;
using ::kolo::executor_testing::WorksOf;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// ---- Responses that move no data -------------------------------------------

TEST(ExecutorTest, ErrorResponseCompletesEveryEntryWithTheError) {
  RecordingBackend backend(0, 2);
  Executor executor(&backend, 0, 2, false, nullptr);
  std::vector<float> a(4, 1), b(2, 1);
  wire::Response r = MakeResponse(wire::RESPONSE_ERROR, {"a", "b"}, {});
  r.set_error(
      "allreduce \"a\": shape mismatch: rank 0 has [4]; rank 1 has [5]");
  r.set_error_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
  entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b));
  auto works = WorksOf(entries);

  ASSERT_TRUE(executor.Execute(r, entries).ok());
  for (const auto& w : works) {
    ASSERT_TRUE(w->IsCompleted());
    EXPECT_EQ(w->status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(w->status().message(), r.error());
  }
  EXPECT_THAT(backend.calls, IsEmpty());
  EXPECT_EQ(a, std::vector<float>(4, 1));  // untouched
}

TEST(ExecutorTest, ErrorResponseWithoutACodeStillFails) {
  RecordingBackend backend(0, 2);
  Executor executor(&backend, 0, 2, false, nullptr);
  std::vector<float> a(4, 1);
  wire::Response r = MakeResponse(wire::RESPONSE_ERROR, {"a"}, {});
  r.set_error("allreduce \"a\": refused");  // error_code left 0 (= OK)
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
  auto works = WorksOf(entries);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  ASSERT_TRUE(works[0]->IsCompleted());
  EXPECT_EQ(works[0]->status().code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(works[0]->status().message(), r.error());
}

TEST(ExecutorTest, BarrierAndJoinCompleteWithoutTheBackend) {
  RecordingBackend backend(1, 3);
  Executor executor(&backend, 1, 3, false, nullptr);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("barrier", wire::RESPONSE_BARRIER, nullptr,
                              nullptr, DataType::kUint8, {0}));
  auto barrier = entries[0]->work;
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_BARRIER, {"barrier"}, {}),
                   entries)
          .ok());
  EXPECT_TRUE(barrier->status().ok()) << barrier->status();

  entries.clear();
  entries.push_back(MakeEntry("join", wire::RESPONSE_JOIN, nullptr, nullptr,
                              DataType::kUint8, {0}));
  auto join = entries[0]->work;
  wire::Response j = MakeResponse(wire::RESPONSE_JOIN, {"join"}, {});
  j.set_last_joined_rank(2);
  ASSERT_TRUE(executor.Execute(j, entries).ok());
  EXPECT_TRUE(join->status().ok()) << join->status();
  EXPECT_EQ(join->value(), 2);
  EXPECT_THAT(backend.calls, IsEmpty());
}

// ---- Allreduce -------------------------------------------------------------

TEST(ExecutorTest, LoneAllreduceRunsInPlaceOnTheCallersOutput) {
  RecordingBackend backend(0, 4);
  Executor executor(&backend, 0, 4, false, nullptr);
  std::vector<float> in = Iota(7, 1), out(7, -1);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("x", wire::RESPONSE_ALLREDUCE, in, out));
  auto work = entries[0]->work;
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"x"}, {7}), entries)
          .ok());
  ASSERT_TRUE(work->status().ok()) << work->status();
  EXPECT_EQ(out, Times(Iota(7, 1), 4));
  EXPECT_EQ(in, Iota(7, 1));  // the input is the caller's: not written
  EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=1,post=1)",
                                         "Allreduce(7,float32,sum)"));
  EXPECT_EQ(backend.copies, 1);       // input -> output
  EXPECT_EQ(backend.allocations, 0);  // no fusion buffer
  EXPECT_EQ(executor.buffer_bytes(), 0);

  // In place (input == output): no copy at all.
  std::vector<float> v = Iota(5, 2);
  entries.clear();
  entries.push_back(FloatEntry("y", wire::RESPONSE_ALLREDUCE, v, v));
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"y"}, {5}), entries)
          .ok());
  EXPECT_EQ(v, Times(Iota(5, 2), 4));
  EXPECT_EQ(backend.copies, 1);
}

TEST(ExecutorTest, FusedAllreduceIsOneBackendCallOverThePackedCount) {
  RecordingBackend backend(1, 3);
  int live_after = -1;
  {
    Executor executor(&backend, 1, 3, false, nullptr);
    // 3, 0 and 5 elements: the empty tensor takes part without bytes.
    std::vector<float> a = Iota(3, 1), b, c = Iota(5, 10);
    std::vector<float> a_out(3), b_out, c_out(5);
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a_out));
    entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b_out));
    entries.push_back(FloatEntry("c", wire::RESPONSE_ALLREDUCE, c, c_out));
    auto works = WorksOf(entries);
    ASSERT_TRUE(executor
                    .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE,
                                          {"a", "b", "c"}, {3, 0, 5}),
                             entries)
                    .ok());
    for (const auto& w : works) EXPECT_TRUE(w->status().ok()) << w->status();
    EXPECT_EQ(a_out, Times(Iota(3, 1), 3));
    EXPECT_EQ(c_out, Times(Iota(5, 10), 3));
    EXPECT_EQ(a, Iota(3, 1));
    EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=1,post=1)",
                                           "Allreduce(8,float32,sum)"));
    EXPECT_EQ(backend.allocations, 1);  // the fusion buffer
    EXPECT_EQ(backend.copies, 4);       // 2 tensors with bytes, in and out
    EXPECT_EQ(executor.buffer_bytes(), 8 * sizeof(float));

    // A smaller fused response reuses the buffer; a larger one grows it.
    std::vector<float> d = Iota(2, 0), e = Iota(2, 5);
    entries.clear();
    entries.push_back(FloatEntry("d", wire::RESPONSE_ALLREDUCE, d, d));
    entries.push_back(FloatEntry("e", wire::RESPONSE_ALLREDUCE, e, e));
    ASSERT_TRUE(
        executor
            .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"d", "e"}, {2, 2}),
                     entries)
            .ok());
    EXPECT_EQ(d, Times(Iota(2, 0), 3));
    EXPECT_EQ(e, Times(Iota(2, 5), 3));
    EXPECT_EQ(backend.allocations, 1);
    std::vector<float> f = Iota(10, 0), g = Iota(10, 1);
    entries.clear();
    entries.push_back(FloatEntry("f", wire::RESPONSE_ALLREDUCE, f, f));
    entries.push_back(FloatEntry("g", wire::RESPONSE_ALLREDUCE, g, g));
    ASSERT_TRUE(executor
                    .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"f", "g"},
                                          {10, 10}),
                             entries)
                    .ok());
    EXPECT_EQ(g, Times(Iota(10, 1), 3));
    EXPECT_EQ(backend.allocations, 2);
    EXPECT_EQ(backend.frees, 1);  // the smaller buffer
    EXPECT_EQ(executor.buffer_bytes(), 20 * sizeof(float));
    live_after = backend.live();
  }
  EXPECT_EQ(live_after, 1);
  EXPECT_EQ(backend.live(), 0);  // the executor frees its buffer
}

TEST(ExecutorTest, IntegerFusedAllreduce) {
  RecordingBackend backend(0, 5);
  Executor executor(&backend, 0, 5, false, nullptr);
  std::vector<int32_t> a = {1, -2, 3}, b = {100000, 7};
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("a", wire::RESPONSE_ALLREDUCE, a.data(), a.data(),
                              DataType::kInt32, {3}));
  entries.push_back(MakeEntry("b", wire::RESPONSE_ALLREDUCE, b.data(), b.data(),
                              DataType::kInt32, {2}));
  auto works = WorksOf(entries);
  ASSERT_TRUE(executor
                  .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"},
                                        {3, 2}, DataType::kInt32),
                           entries)
                  .ok());
  for (const auto& w : works) EXPECT_TRUE(w->status().ok()) << w->status();
  EXPECT_EQ(a, (std::vector<int32_t>{5, -10, 15}));
  EXPECT_EQ(b, (std::vector<int32_t>{500000, 35}));
  EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=1,post=1)",
                                         "Allreduce(5,int32,sum)"));
}

TEST(ExecutorTest, FusedAllreduceUsesPiecesWhenTheBackendOffersThem) {
  RecordingBackend backend(0, 2);
  backend.pieces_from = 0;
  Executor executor(&backend, 0, 2, false, nullptr);
  std::vector<float> a = Iota(3, 1), b = Iota(4, 20), b_out(4);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
  entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b_out));
  auto works = WorksOf(entries);
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"}, {3, 4}),
                   entries)
          .ok());
  for (const auto& w : works) EXPECT_TRUE(w->status().ok()) << w->status();
  EXPECT_EQ(a, Times(Iota(3, 1), 2));
  EXPECT_EQ(b_out, Times(Iota(4, 20), 2));
  EXPECT_EQ(b, Iota(4, 20));
  EXPECT_THAT(backend.calls, ElementsAre("AllreducePieces(7,float32,sum)"));
  ASSERT_EQ(backend.pieces_calls.size(), 1u);
  const auto& p = backend.pieces_calls[0].pieces;
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].input, a.data());
  EXPECT_EQ(p[0].output, a.data());
  EXPECT_EQ(p[0].count, 3u);
  EXPECT_EQ(p[1].input, b.data());
  EXPECT_EQ(p[1].output, b_out.data());
  EXPECT_EQ(p[1].count, 4u);
  EXPECT_THAT(backend.supports_queries,
              ElementsAre(std::make_pair(size_t{7}, DataType::kFloat32)));
  // No packing: no buffer, no copies.
  EXPECT_EQ(backend.allocations, 0);
  EXPECT_EQ(backend.copies, 0);
  EXPECT_EQ(executor.buffer_bytes(), 0);
}

TEST(ExecutorTest, PiecesOnlyForTheSizesTheBackendOffersAndNeverForOne) {
  RecordingBackend backend(0, 2);
  backend.pieces_from = 10;  // e.g. shm: small lists are packed
  Executor executor(&backend, 0, 2, false, nullptr);
  std::vector<float> a = Iota(4, 1), b = Iota(5, 1);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
  entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b));
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"}, {4, 5}),
                   entries)
          .ok());
  EXPECT_EQ(a, Times(Iota(4, 1), 2));
  EXPECT_EQ(b, Times(Iota(5, 1), 2));
  EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=1,post=1)",
                                         "Allreduce(9,float32,sum)"));

  // 10 elements: offered.
  backend.calls.clear();
  std::vector<float> c = Iota(4, 1), d = Iota(6, 1);
  entries.clear();
  entries.push_back(FloatEntry("c", wire::RESPONSE_ALLREDUCE, c, c));
  entries.push_back(FloatEntry("d", wire::RESPONSE_ALLREDUCE, d, d));
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"c", "d"}, {4, 6}),
                   entries)
          .ok());
  EXPECT_EQ(d, Times(Iota(6, 1), 2));
  EXPECT_THAT(backend.calls, ElementsAre("AllreducePieces(10,float32,sum)"));

  // A lone tensor runs in place with Allreduce, whatever its size.
  backend.calls.clear();
  std::vector<float> e = Iota(50, 1);
  entries.clear();
  entries.push_back(FloatEntry("e", wire::RESPONSE_ALLREDUCE, e, e));
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"e"}, {50}), entries)
          .ok());
  EXPECT_EQ(e, Times(Iota(50, 1), 2));
  EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=1,post=1)",
                                         "Allreduce(50,float32,sum)"));
}

TEST(ExecutorTest, OverlappingTensorsArePackedEvenWhenPiecesAreOffered) {
  RecordingBackend backend(0, 2);
  backend.pieces_from = 0;
  Executor executor(&backend, 0, 2, false, nullptr);
  // "a" is [0, 4) and "b" is [2, 6) of one allocation, both in place.
  std::vector<float> mem = Iota(6, 1);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("a", wire::RESPONSE_ALLREDUCE, mem.data(),
                              mem.data(), DataType::kFloat32, {4}));
  entries.push_back(MakeEntry("b", wire::RESPONSE_ALLREDUCE, mem.data() + 2,
                              mem.data() + 2, DataType::kFloat32, {4}));
  auto works = WorksOf(entries);
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"}, {4, 4}),
                   entries)
          .ok());
  for (const auto& w : works) EXPECT_TRUE(w->status().ok()) << w->status();
  EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=1,post=1)",
                                         "Allreduce(8,float32,sum)"));
  // Packed semantics: both read before either is written, "b" unpacked last.
  EXPECT_EQ(mem, Times(Iota(6, 1), 2));

  // One tensor's output over another's input overlaps too.
  backend.calls.clear();
  std::vector<float> x = Iota(4, 1), y = Iota(4, 100);
  entries.clear();
  entries.push_back(MakeEntry("x", wire::RESPONSE_ALLREDUCE, x.data(), y.data(),
                              DataType::kFloat32, {4}));
  entries.push_back(MakeEntry("y", wire::RESPONSE_ALLREDUCE, y.data(), y.data(),
                              DataType::kFloat32, {4}));
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"x", "y"}, {4, 4}),
                   entries)
          .ok());
  EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=1,post=1)",
                                         "Allreduce(8,float32,sum)"));
  EXPECT_EQ(y, Times(Iota(4, 100), 2));  // "y"'s result, unpacked last

  // Adjacent tensors of one allocation touch but do not overlap: pieces.
  backend.calls.clear();
  std::vector<float> adjacent = Iota(7, 1);
  entries.clear();
  entries.push_back(MakeEntry("p", wire::RESPONSE_ALLREDUCE, adjacent.data(),
                              adjacent.data(), DataType::kFloat32, {3}));
  entries.push_back(MakeEntry("q", wire::RESPONSE_ALLREDUCE,
                              adjacent.data() + 3, adjacent.data() + 3,
                              DataType::kFloat32, {4}));
  ASSERT_TRUE(
      executor
          .Execute(MakeResponse(wire::RESPONSE_ALLREDUCE, {"p", "q"}, {3, 4}),
                   entries)
          .ok());
  EXPECT_THAT(backend.calls, ElementsAre("AllreducePieces(7,float32,sum)"));
  EXPECT_EQ(adjacent, Times(Iota(7, 1), 2));
}

TEST(ExecutorTest, PrescaleIsAppliedBeforeTheReductionAndForcesPacking) {
  RecordingBackend backend(0, 2);
  backend.pieces_from = 0;
  Executor executor(&backend, 0, 2, false, nullptr);
  std::vector<float> a = Iota(3, 1), b = Iota(2, 1);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
  entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b));
  wire::Response r = MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"}, {3, 2});
  r.set_prescale(4);
  r.set_postscale(0.5);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=4,post=0.5)",
                                         "Allreduce(5,float32,sum)"));
  EXPECT_THAT(backend.scale_factors, ElementsAre(4, 0.5));
  EXPECT_EQ(a, Times(Iota(3, 1), 4 * 2 * 0.5f));
  EXPECT_EQ(b, Times(Iota(2, 1), 4));
}

TEST(ExecutorTest, PostscaleOnPiecesScalesEachOutput) {
  RecordingBackend backend(0, 2);
  backend.pieces_from = 0;
  Executor executor(&backend, 0, 2, false, nullptr);
  std::vector<float> a = Iota(3, 1), b = Iota(2, 1);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
  entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b));
  wire::Response r = MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"}, {3, 2});
  r.set_postscale(0.25);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  EXPECT_THAT(backend.calls, ElementsAre("AllreducePieces(5,float32,sum)"));
  EXPECT_THAT(backend.scale_factors, ElementsAre(0.25, 0.25));
  EXPECT_EQ(a, Times(Iota(3, 1), 0.5f));
  EXPECT_EQ(b, Times(Iota(2, 1), 0.5f));
}

// Average is a sum and a postscale by 1/n; n is the set size, or the ranks
// that contribute while some have joined (unless configured otherwise).
struct AverageCase {
  int contributors;  // 0: every rank
  bool average_over_set_size;
  double expected_postscale;
};

class ExecutorAverageTest : public ::testing::TestWithParam<AverageCase> {};

TEST_P(ExecutorAverageTest, DividesByTheRightCount) {
  const AverageCase c = GetParam();
  constexpr int kSize = 4;
  for (bool pieces : {false, true}) {
    SCOPED_TRACE(pieces ? "pieces" : "packed");
    RecordingBackend backend(2, kSize);
    backend.pieces_from = pieces ? 0 : -1;
    Executor executor(&backend, 2, kSize, c.average_over_set_size, nullptr);
    std::vector<float> a = Iota(3, 1), b = Iota(2, 7);
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
    entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b));
    auto works = WorksOf(entries);
    wire::Response r =
        MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"}, {3, 2},
                     DataType::kFloat32, ReduceOp::kAverage);
    r.set_contributors(c.contributors);
    ASSERT_TRUE(executor.Execute(r, entries).ok());
    for (const auto& w : works) EXPECT_TRUE(w->status().ok()) << w->status();
    // The backend never sees kAverage.
    if (pieces) {
      EXPECT_THAT(backend.calls, ElementsAre("AllreducePieces(5,float32,sum)"));
      EXPECT_THAT(backend.scale_factors,
                  ElementsAre(c.expected_postscale, c.expected_postscale));
    } else {
      EXPECT_THAT(backend.calls,
                  ElementsAre(absl::StrCat("AllreduceScaled(pre=1,post=",
                                           c.expected_postscale, ")"),
                              "Allreduce(5,float32,sum)"));
      EXPECT_THAT(backend.scale_factors, ElementsAre(c.expected_postscale));
    }
    // The fake's sum is 4 x the input; then the postscale, in float.
    const float f = static_cast<float>(c.expected_postscale);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i], (1.0f + i) * 4.0f * f) << i;
    }
    for (size_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(b[i], (7.0f + i) * 4.0f * f) << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Counts, ExecutorAverageTest,
    ::testing::Values(AverageCase{0, false, 0.25},
                      AverageCase{3, false, 1.0 / 3},
                      AverageCase{3, true, 0.25}, AverageCase{4, false, 0.25}),
    [](const auto& info) {
      return absl::StrCat("contributors", info.param.contributors,
                          info.param.average_over_set_size ? "_over_set" : "");
    });

TEST(ExecutorTest, AverageOfALoneTensorDividesBySetSize) {
  RecordingBackend backend(0, 8);
  Executor executor(&backend, 0, 8, false, nullptr);
  std::vector<float> v = Iota(9, -4);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("v", wire::RESPONSE_ALLREDUCE, v, v));
  wire::Response r = MakeResponse(wire::RESPONSE_ALLREDUCE, {"v"}, {9},
                                  DataType::kFloat32, ReduceOp::kAverage);
  r.set_postscale(2);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  EXPECT_THAT(backend.calls, ElementsAre("AllreduceScaled(pre=1,post=0.25)",
                                         "Allreduce(9,float32,sum)"));
  EXPECT_EQ(v, Times(Iota(9, -4), 2));  // sum of 8 equal inputs / 8 * 2
}

TEST(ExecutorTest, FailedCollectiveFailsEveryEntryAndIsReturned) {
  RecordingBackend backend(1, 2);
  Executor executor(&backend, 1, 2, false, nullptr);
  std::vector<float> a(4, 1), b(4, 1);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(FloatEntry("a", wire::RESPONSE_ALLREDUCE, a, a));
  entries.push_back(FloatEntry("b", wire::RESPONSE_ALLREDUCE, b, b));
  auto works = WorksOf(entries);
  backend.fail_next = absl::UnavailableError("link down");
  absl::Status s = executor.Execute(
      MakeResponse(wire::RESPONSE_ALLREDUCE, {"a", "b"}, {4, 4}), entries);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(),
            "allreduce of 2 fused tensors (\"a\", ...) on rank 1: link down");
  for (const auto& w : works) {
    ASSERT_TRUE(w->IsCompleted());
    EXPECT_EQ(w->status(), s);
  }
  EXPECT_EQ(a, std::vector<float>(4, 1));  // nothing unpacked
}

TEST(ExecutorTest, FailedCollectiveCompletesWithTheExplainedCause) {
  RecordingBackend backend(0, 4);
  absl::Status seen;
  Executor executor(&backend, 0, 4, false, nullptr, {},
                    [&](const absl::Status& s) {
                      seen = s;
                      return absl::UnavailableError("rank 3 lost: closed");
                    });
  std::vector<uint8_t> data(16, 7);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("w", wire::RESPONSE_BROADCAST, data.data(),
                              data.data(), DataType::kUint8, {16}));
  auto work = entries[0]->work;
  backend.fail_next = absl::UnavailableError("gloo broadcast failed");
  wire::Response r =
      MakeResponse(wire::RESPONSE_BROADCAST, {"w"}, {16}, DataType::kUint8);
  r.set_root(2);
  absl::Status s = executor.Execute(r, entries);
  EXPECT_EQ(s.message(), "broadcast of \"w\" on rank 0: gloo broadcast failed");
  EXPECT_EQ(seen, s);
  EXPECT_EQ(work->status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(work->status().message(),
            "broadcast \"w\" failed: rank 3 lost: closed");
}

}  // namespace
}  // namespace kolo
