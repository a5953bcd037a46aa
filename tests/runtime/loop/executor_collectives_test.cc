// Unit tests of kolo::Executor (see executor_test.cc): broadcast,
// allgather, alltoall and reduce-scatter on a host-memory backend — fused
// layouts, uneven rows and splits, the received splits, and an output
// allocator that fails (that entry's Work fails, the rank still takes part,
// the others are unaffected).
#include <cstring>
#include <memory>
#include <stdexcept>
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

using ::kolo::executor_testing::Iota;
using ::kolo::executor_testing::MakeEntry;
using ::kolo::executor_testing::MakeResponse;
using ::kolo::executor_testing::PeerByte;
using ::kolo::executor_testing::RecordingBackend;
using ::kolo::executor_testing::VectorAllocator;
using ::kolo::executor_testing::WorksOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// ---- Broadcast -------------------------------------------------------------

TEST(ExecutorTest, BroadcastLoneAndFusedFromRootAndToOthers) {
  // Rank 1 of 3 receives from root 2.
  RecordingBackend backend(1, 3);
  Executor executor(&backend, 1, 3, false, nullptr);
  std::vector<uint8_t> lone(10, 0);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("lone", wire::RESPONSE_BROADCAST, lone.data(),
                              lone.data(), DataType::kUint8, {10}));
  wire::Response r =
      MakeResponse(wire::RESPONSE_BROADCAST, {"lone"}, {10}, DataType::kUint8);
  r.set_root(2);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  for (size_t i = 0; i < lone.size(); ++i) EXPECT_EQ(lone[i], PeerByte(2, i));
  EXPECT_THAT(backend.calls, ElementsAre("Broadcast(10,root=2)"));
  EXPECT_EQ(backend.allocations, 0);

  // Fused: int32 tensors of 3 and 2 elements in one broadcast of 20 bytes.
  backend.calls.clear();
  std::vector<int32_t> a(3, -1), b(2, -1);
  entries.clear();
  entries.push_back(MakeEntry("a", wire::RESPONSE_BROADCAST, a.data(), a.data(),
                              DataType::kInt32, {3}));
  entries.push_back(MakeEntry("b", wire::RESPONSE_BROADCAST, b.data(), b.data(),
                              DataType::kInt32, {2}));
  auto works = WorksOf(entries);
  r = MakeResponse(wire::RESPONSE_BROADCAST, {"a", "b"}, {3, 2},
                   DataType::kInt32);
  r.set_root(2);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  for (const auto& w : works) EXPECT_TRUE(w->status().ok()) << w->status();
  EXPECT_THAT(backend.calls, ElementsAre("Broadcast(20,root=2)"));
  const uint8_t* got_a = reinterpret_cast<const uint8_t*>(a.data());
  const uint8_t* got_b = reinterpret_cast<const uint8_t*>(b.data());
  for (size_t i = 0; i < 12; ++i) EXPECT_EQ(got_a[i], PeerByte(2, i)) << i;
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(got_b[i], PeerByte(2, 12 + i)) << i;
}

TEST(ExecutorTest, FusedBroadcastAtTheRootSendsItsTensorsPacked) {
  // A backend whose Broadcast checks what the root sends.
  class CheckingBackend : public RecordingBackend {
   public:
    using RecordingBackend::RecordingBackend;
    absl::Status Broadcast(void* data, size_t bytes, int root) override {
      sent.assign(static_cast<uint8_t*>(data),
                  static_cast<uint8_t*>(data) + bytes);
      return RecordingBackend::Broadcast(data, bytes, root);
    }
    std::vector<uint8_t> sent;
  };
  CheckingBackend backend(0, 2);
  Executor executor(&backend, 0, 2, false, nullptr);
  std::vector<uint8_t> a = {1, 2, 3}, b = {4, 5};
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("a", wire::RESPONSE_BROADCAST, a.data(), a.data(),
                              DataType::kUint8, {3}));
  entries.push_back(MakeEntry("b", wire::RESPONSE_BROADCAST, b.data(), b.data(),
                              DataType::kUint8, {2}));
  wire::Response r = MakeResponse(wire::RESPONSE_BROADCAST, {"a", "b"}, {3, 2},
                                  DataType::kUint8);
  r.set_root(0);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  EXPECT_EQ(backend.sent, (std::vector<uint8_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(a, (std::vector<uint8_t>{1, 2, 3}));  // the root keeps its data
  EXPECT_EQ(b, (std::vector<uint8_t>{4, 5}));
}

// ---- Allgather -------------------------------------------------------------

// Rank 1 of 3; tensor i has first_dims[i * 3 + k] rows on rank k.
TEST(ExecutorTest, FusedAllgatherWithUnevenRows) {
  constexpr int kSize = 3, kRank = 1;
  RecordingBackend backend(kRank, kSize);
  Executor executor(&backend, kRank, kSize, false, nullptr);
  // "a": rows of 2 uint8, 1/2/0 rows; "b": rows of 3 uint8, 2/1/3 rows.
  std::vector<uint8_t> a_in = {10, 11, 12, 13}, b_in = {20, 21, 22};
  std::vector<uint8_t> a_out, b_out;
  std::vector<int64_t> a_shape, b_shape;
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("a", wire::RESPONSE_ALLGATHER, a_in.data(),
                              nullptr, DataType::kUint8, {2, 2}));
  entries[0]->allocator = VectorAllocator(&a_out, 1, &a_shape);
  entries.push_back(MakeEntry("b", wire::RESPONSE_ALLGATHER, b_in.data(),
                              nullptr, DataType::kUint8, {1, 3}));
  entries[1]->allocator = VectorAllocator(&b_out, 1, &b_shape);
  auto works = WorksOf(entries);
  wire::Response r = MakeResponse(wire::RESPONSE_ALLGATHER, {"a", "b"}, {2, 3},
                                  DataType::kUint8);
  for (int64_t d : {1, 2, 0, 2, 1, 3}) r.add_first_dims(d);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  for (const auto& w : works) ASSERT_TRUE(w->status().ok()) << w->status();
  EXPECT_EQ(a_shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(b_shape, (std::vector<int64_t>{6, 3}));
  // Block k = rank k's rows of "a", then of "b".
  EXPECT_THAT(backend.calls, ElementsAre("Allgatherv(8,7,9)"));
  EXPECT_EQ(works[0]->splits(), (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(works[1]->splits(), (std::vector<int64_t>{2, 1, 3}));
  // "a": rank 0's 2 bytes at block 0 offset 0, this rank's 4, none of 2.
  std::vector<uint8_t> want_a = {
      PeerByte(0, 0), PeerByte(0, 1), 10, 11, 12, 13};
  EXPECT_EQ(std::vector<uint8_t>(a_out.begin(), a_out.begin() + 6), want_a);
  // "b": rank 0's 6 bytes after its 2 of "a", this rank's 3, rank 2's 9.
  std::vector<uint8_t> want_b;
  for (size_t i = 0; i < 6; ++i) want_b.push_back(PeerByte(0, 2 + i));
  for (uint8_t x : b_in) want_b.push_back(x);
  for (size_t i = 0; i < 9; ++i) want_b.push_back(PeerByte(2, 0 + i));
  EXPECT_EQ(std::vector<uint8_t>(b_out.begin(), b_out.begin() + 18), want_b);
}

TEST(ExecutorTest, AllgatherAllocatorFailureFailsOnlyThatEntry) {
  constexpr int kSize = 2, kRank = 0;
  RecordingBackend backend(kRank, kSize);
  {
    Executor executor(&backend, kRank, kSize, false, nullptr);
    std::vector<float> a = {1, 2}, b = {3, 4}, c = {5, 6};
    std::vector<uint8_t> a_out, c_out;
    std::vector<int64_t> a_shape, c_shape;
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(MakeEntry("a", wire::RESPONSE_ALLGATHER, a.data(),
                                nullptr, DataType::kFloat32, {2}));
    entries[0]->allocator = VectorAllocator(&a_out, 4, &a_shape);
    entries.push_back(MakeEntry("b", wire::RESPONSE_ALLGATHER, b.data(),
                                nullptr, DataType::kFloat32, {2}));
    entries[1]->allocator =
        [](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
      return absl::ResourceExhaustedError("out of host memory");
    };
    entries.push_back(MakeEntry("c", wire::RESPONSE_ALLGATHER, c.data(),
                                nullptr, DataType::kFloat32, {2}));
    entries[2]->allocator = VectorAllocator(&c_out, 4, &c_shape);
    auto works = WorksOf(entries);
    wire::Response r =
        MakeResponse(wire::RESPONSE_ALLGATHER, {"a", "b", "c"}, {1, 1, 1});
    for (int64_t d : {2, 1, 2, 1, 2, 1}) r.add_first_dims(d);
    ASSERT_TRUE(executor.Execute(r, entries).ok());
    EXPECT_TRUE(works[0]->status().ok()) << works[0]->status();
    EXPECT_TRUE(works[2]->status().ok()) << works[2]->status();
    EXPECT_EQ(works[1]->status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(works[1]->status().message(),
                HasSubstr("allgather \"b\": output allocator failed: out of "
                          "host memory"));
    // This rank still took part with all three tensors' rows.
    EXPECT_THAT(backend.calls, ElementsAre("Allgatherv(24,12)"));
    // "c" is at offset 16 of this rank's block, 8 of rank 1's.
    float c_got[3];
    std::memcpy(c_got, c_out.data(), 12);
    EXPECT_EQ(c_got[0], 5.0f);
    EXPECT_EQ(c_got[1], 6.0f);
    uint8_t peer[4];
    std::memcpy(peer, c_out.data() + 8, 4);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(peer[i], PeerByte(1, 8 + i)) << i;
    float a_got[2];
    std::memcpy(a_got, a_out.data(), 8);
    EXPECT_EQ(a_got[0], 1.0f);
    EXPECT_EQ(a_got[1], 2.0f);
    EXPECT_EQ(c_shape, (std::vector<int64_t>{3}));
  }
  // The stand-in output of "b" was freed with the fusion buffers.
  EXPECT_EQ(backend.live(), 0);
}

TEST(ExecutorTest, AllgatherAllocatorReturningNullFailsThatEntry) {
  RecordingBackend backend(1, 2);
  {
    Executor executor(&backend, 1, 2, false, nullptr);
    std::vector<int32_t> in = {7, 8, 9};
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(MakeEntry("g", wire::RESPONSE_ALLGATHER, in.data(),
                                nullptr, DataType::kInt32, {3}));
    entries[0]->allocator =
        [](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
      return nullptr;
    };
    auto work = entries[0]->work;
    wire::Response r =
        MakeResponse(wire::RESPONSE_ALLGATHER, {"g"}, {1}, DataType::kInt32);
    r.add_first_dims(2);
    r.add_first_dims(3);
    ASSERT_TRUE(executor.Execute(r, entries).ok());
    EXPECT_EQ(work->status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(work->status().message(),
                HasSubstr("allgather \"g\": output allocator failed: "
                          "allocator returned null"));
    EXPECT_THAT(backend.calls, ElementsAre("Allgatherv(8,12)"));
  }
  EXPECT_EQ(backend.live(), 0);
}

TEST(ExecutorTest, AllgatherAllocatorThatThrowsFailsThatEntry) {
  // A program's allocator (a frontend's at::empty) may throw: the
  // exception stops in the executor, whichever thread runs it.
  RecordingBackend backend(0, 2);
  {
    Executor executor(&backend, 0, 2, false, nullptr);
    std::vector<int32_t> in = {7, 8};
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(MakeEntry("t", wire::RESPONSE_ALLGATHER, in.data(),
                                nullptr, DataType::kInt32, {2}));
    entries[0]->allocator =
        [](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
      throw std::runtime_error("CUDA out of memory");
    };
    auto work = entries[0]->work;
    wire::Response r =
        MakeResponse(wire::RESPONSE_ALLGATHER, {"t"}, {1}, DataType::kInt32);
    r.add_first_dims(2);
    r.add_first_dims(1);
    ASSERT_TRUE(executor.Execute(r, entries).ok());
    EXPECT_EQ(work->status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(work->status().message(),
                HasSubstr("allgather \"t\": output allocator failed: it "
                          "threw: CUDA out of memory"));
    // It still took part (its 2 rows, rank 1's 1).
    EXPECT_THAT(backend.calls, ElementsAre("Allgatherv(8,4)"));
  }
  EXPECT_EQ(backend.live(), 0);
}

// ---- Alltoall --------------------------------------------------------------

TEST(ExecutorTest, AlltoallWithUnevenSplits) {
  constexpr int kSize = 3, kRank = 2;
  RecordingBackend backend(kRank, kSize);
  Executor executor(&backend, kRank, kSize, false, nullptr);
  // Rows of 2 int16 (4 bytes). first_dims[k * 3 + j]: rows k sends to j.
  //   rank 0 sends 1, 0, 2; rank 1 sends 0, 3, 1; rank 2 sends 2, 0, 1.
  std::vector<int16_t> in = {1, 2, 3, 4, 5, 6};  // 3 rows
  std::vector<uint8_t> out;
  std::vector<int64_t> shape;
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("t", wire::RESPONSE_ALLTOALL, in.data(), nullptr,
                              DataType::kInt16, {3, 2}));
  entries[0]->allocator = VectorAllocator(&out, 2, &shape);
  auto work = entries[0]->work;
  wire::Response r =
      MakeResponse(wire::RESPONSE_ALLTOALL, {"t"}, {2}, DataType::kInt16);
  for (int64_t d : {1, 0, 2, 0, 3, 1, 2, 0, 1}) r.add_first_dims(d);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  ASSERT_TRUE(work->status().ok()) << work->status();
  // Sends 2 rows to 0, none to 1, 1 to itself; receives 2, 1 and 1 rows.
  EXPECT_THAT(backend.calls, ElementsAre("Alltoallv(8,0,4;8,4,4)"));
  EXPECT_EQ(shape, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(work->splits(), (std::vector<int64_t>{2, 1, 1}));
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(out[i], PeerByte(0, i)) << i;
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(out[8 + i], PeerByte(1, i)) << i;
  int16_t mine[2];
  std::memcpy(mine, out.data() + 12, 4);
  EXPECT_EQ(mine[0], 5);  // its own last row
  EXPECT_EQ(mine[1], 6);
}

TEST(ExecutorTest, AlltoallAllocatorFailureFailsTheWorkButTakesPart) {
  RecordingBackend backend(0, 2);
  {
    Executor executor(&backend, 0, 2, false, nullptr);
    std::vector<float> in = {1, 2, 3, 4};
    std::vector<std::unique_ptr<TensorEntry>> entries;
    entries.push_back(MakeEntry("t", wire::RESPONSE_ALLTOALL, in.data(),
                                nullptr, DataType::kFloat32, {4}));
    entries[0]->allocator =
        [](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
      return absl::InvalidArgumentError("no output for you");
    };
    auto work = entries[0]->work;
    wire::Response r = MakeResponse(wire::RESPONSE_ALLTOALL, {"t"}, {1});
    for (int64_t d : {1, 3, 2, 2}) r.add_first_dims(d);
    ASSERT_TRUE(executor.Execute(r, entries).ok());
    EXPECT_EQ(work->status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(work->status().message(),
                HasSubstr("alltoall \"t\": output allocator failed: no "
                          "output for you"));
    EXPECT_THAT(backend.calls, ElementsAre("Alltoallv(4,12;4,8)"));
  }
  EXPECT_EQ(backend.live(), 0);
}

// ---- Reduce-scatter --------------------------------------------------------

TEST(ExecutorTest, ReducescatterOnTheHostCombinesInRankOrderAndAverages) {
  constexpr int kSize = 3, kRank = 1;
  RecordingBackend backend(kRank, kSize);
  backend.peers_mirror_me = true;  // every rank has this input
  Executor executor(&backend, kRank, kSize, false, nullptr);
  // 7 rows of 2: rank 0 owns rows 0-2, rank 1 rows 3-4, rank 2 rows 5-6.
  std::vector<float> in = Iota(14, 1), out(4, -1);
  std::vector<std::unique_ptr<TensorEntry>> entries;
  entries.push_back(MakeEntry("rs", wire::RESPONSE_REDUCESCATTER, in.data(),
                              out.data(), DataType::kFloat32, {7, 2}));
  auto work = entries[0]->work;
  wire::Response r = MakeResponse(wire::RESPONSE_REDUCESCATTER, {"rs"}, {2},
                                  DataType::kFloat32, ReduceOp::kAverage);
  r.add_first_dims(7);
  r.set_prescale(2);
  ASSERT_TRUE(executor.Execute(r, entries).ok());
  ASSERT_TRUE(work->status().ok()) << work->status();
  EXPECT_THAT(backend.calls, ElementsAre("Alltoallv(24,16,16;16,16,16)",
                                         "Combine(4)", "Combine(4)"));
  EXPECT_THAT(backend.scale_factors, ElementsAre(2, 1.0 / 3));
  // Rows 3-4 = elements 7..10, x2 prescale, sum of 3, / 3.
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(out[i], (7.0f + i) * 2) << i;
  }
  EXPECT_EQ(in, Iota(14, 1));  // prescaled on a copy
}

}  // namespace
}  // namespace kolo
