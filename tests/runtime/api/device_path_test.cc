// The runtime's device path (what CUDA tensors take) without a GPU: a
// stand-in device backend registered for DeviceType::kCuda that behaves like
// a device backend towards the executor — memory only through
// Allocate/Copy, ready events, scaled allreduce and reduce-scatter of its
// own, completion reported later from its own thread — and moves the bytes
// with a real gloo backend. N ranks as threads; CPU tensors go through
// gloo at the same time.
#include <atomic>
#include <cstring>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/loop/backend.h"
#include "tests/testing/fake_device_backend.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using ::testing::HasSubstr;
using testing::OnEachRank;
using testing::ShutdownJob;
using testing::StartJob;

using testing::FakeDeviceBackend;

testing::DeviceStats& Stats() { return testing::FakeDeviceStats(); }

const BackendRegistrar kFakeDevice(
    DeviceType::kCuda, "fakedev",
    [](const BackendContext& c) -> absl::StatusOr<std::unique_ptr<Backend>> {
      auto wire = BackendRegistry::Get().Create(DeviceType::kCpu, "gloo", c);
      if (!wire.ok()) return wire.status();
      return std::unique_ptr<Backend>(std::make_unique<FakeDeviceBackend>(
          std::move(*wire), c.rank, c.op_timeout));
    });

// A ready event the test fires by hand.
class ManualEvent : public ReadyEvent {
 public:
  bool Ready() override { return fired.load(); }
  std::atomic<bool> fired{false};
};

TensorView Cuda(std::vector<float>& v, int index) {
  return TensorView(v.data(), DataType::kFloat32,
                    {static_cast<int64_t>(v.size())}, Device::Cuda(index));
}

TEST(DevicePathTest, CpuAndDeviceTensorsInOneStepWithFusion) {
  constexpr int kSize = 3;
  constexpr int kSmall = 12;
  const int before_created = Stats().created.load();
  auto rts = StartJob(kSize);
  OnEachRank(kSize, [&](int r) {
    // Each rank on its own GPU: only the device type has to match.
    std::vector<float> cpu(1000, r + 1.0f), dev(777, 2.0f * r);
    std::vector<std::vector<float>> small(kSmall, std::vector<float>(5));
    for (int i = 0; i < kSmall; ++i) small[i].assign(5, float(i * (r + 1)));
    std::vector<Work> works;
    AllreduceRequest a;
    a.name = "cpu";
    a.input = a.output = TensorView(cpu.data(), DataType::kFloat32, {1000});
    works.push_back(*rts[r]->Allreduce(a));
    a.name = "dev";
    a.input = a.output = Cuda(dev, r);
    a.op = ReduceOp::kAverage;
    works.push_back(*rts[r]->Allreduce(a));
    a.op = ReduceOp::kSum;
    for (int i = 0; i < kSmall; ++i) {
      a.name = absl::StrCat("small.", i);
      a.input = a.output = Cuda(small[i], r);
      works.push_back(*rts[r]->Allreduce(a));
    }
    for (auto& w : works) ASSERT_TRUE(w.Wait().ok()) << w.Wait();
    EXPECT_EQ(cpu[0], 6.0f);
    EXPECT_EQ(dev[776], 2.0f);  // (0 + 2 + 4) / 3
    for (int i = 0; i < kSmall; ++i) EXPECT_EQ(small[i][4], float(i * 6)) << i;
  });
  // One device backend per rank, created when the first CUDA response ran.
  EXPECT_EQ(Stats().created.load() - before_created, kSize);
  EXPECT_GT(Stats().copies.load(), 0);  // fusion packed through the backend
  EXPECT_GT(Stats().completed_elsewhere.load(), 0);
  ShutdownJob(rts);
  rts.clear();
  EXPECT_EQ(Stats().live_allocations.load(), 0);  // fusion buffers freed
}

TEST(DevicePathTest, EveryCollectiveOnTheDevicePath) {
  constexpr int kSize = 2;
  auto rts = StartJob(kSize);
  OnEachRank(kSize, [&](int r) {
    // Broadcast from rank 1.
    std::vector<float> b(10, float(r * 10 + 1));
    BroadcastRequest br;
    br.name = "b";
    br.tensor = Cuda(b, 0);
    br.root = 1;
    ASSERT_TRUE(rts[r]->Broadcast(br)->Wait().ok());
    EXPECT_EQ(b[9], 11.0f);

    // Allgather with uneven first dimensions.
    std::vector<float> g(r + 1, float(r + 5));
    std::vector<float> gathered;
    AllgatherRequest ag;
    ag.name = "g";
    ag.input = Cuda(g, 0);
    ag.allocator =
        [&](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
      gathered.resize(shape[0]);
      return static_cast<void*>(gathered.data());
    };
    auto w = rts[r]->Allgather(ag);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Wait().ok()) << w->Wait();
    EXPECT_EQ(gathered, (std::vector<float>{5, 6, 6}));

    // Alltoall, equal splits.
    std::vector<float> in = {float(r * 10), float(r * 10 + 1)};
    std::vector<float> out;
    AlltoallRequest at;
    at.name = "t";
    at.input = Cuda(in, 0);
    at.allocator =
        [&](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
      out.resize(shape[0]);
      return static_cast<void*>(out.data());
    };
    w = rts[r]->Alltoall(at);
    ASSERT_TRUE(w.ok());
    ASSERT_TRUE(w->Wait().ok()) << w->Wait();
    EXPECT_EQ(out, (std::vector<float>{float(r), float(10 + r)}));

    // Reduce-scatter, uneven rows, averaged.
    std::vector<float> rs_in = {1, 2, 3};
    for (float& x : rs_in) x *= (r + 1);
    std::vector<float> rs_out(r == 0 ? 2 : 1);
    ReducescatterRequest rs;
    rs.name = "rs";
    rs.input = Cuda(rs_in, 0);
    rs.output = Cuda(rs_out, 0);
    rs.op = ReduceOp::kAverage;
    w = rts[r]->Reducescatter(rs);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Wait().ok()) << w->Wait();
    if (r == 0) {
      EXPECT_EQ(rs_out, (std::vector<float>{1.5f, 3.0f}));
    } else {
      EXPECT_EQ(rs_out, (std::vector<float>{4.5f}));
    }
  });
  ShutdownJob(rts);
}

TEST(DevicePathTest, DataIsReadOnlyOnceItsReadyEventFired) {
  constexpr int kSize = 2;
  auto rts = StartJob(kSize);
  OnEachRank(kSize, [&](int r) {
    std::vector<float> v(64, -1.0f);  // not yet "written by the stream"
    auto event = std::make_shared<ManualEvent>();
    AllreduceRequest a;
    a.name = "late";
    a.input = a.output = Cuda(v, 0);
    a.input.ready = event;
    auto w = rts[r]->Allreduce(a);
    ASSERT_TRUE(w.ok());
    // The producer finishes after the submit; the runtime must wait for it.
    // (A blocked wait: the work cannot complete before the event fires.)
    EXPECT_TRUE(absl::IsDeadlineExceeded(w->Wait(absl::Milliseconds(200))));
    std::fill(v.begin(), v.end(), float(r + 1));
    event->fired = true;
    ASSERT_TRUE(w->Wait().ok()) << w->Wait();
    EXPECT_EQ(v[0], 3.0f);
    EXPECT_EQ(v[63], 3.0f);
  });
  ShutdownJob(rts);
}

TEST(DevicePathTest, JoinedRankContributesDeviceZeros) {
  constexpr int kSize = 2;
  auto rts = StartJob(kSize);
  OnEachRank(kSize, [&](int r) {
    if (r == 1) {
      auto last = rts[r]->Join();
      ASSERT_TRUE(last.ok()) << last.status();
      return;
    }
    std::vector<float> v(9, 4.0f);
    AllreduceRequest a;
    a.name = "after_join";
    a.input = a.output = Cuda(v, 0);
    ASSERT_TRUE(rts[r]->Allreduce(a)->Wait().ok());
    EXPECT_EQ(v[8], 4.0f);  // 4 + rank 1's zeros
    ASSERT_TRUE(rts[r]->Join().ok());
  });
  ShutdownJob(rts);
}

TEST(DevicePathTest, CpuOnOneRankAndCudaOnAnotherIsAMismatch) {
  constexpr int kSize = 2;
  auto rts = StartJob(kSize);
  OnEachRank(kSize, [&](int r) {
    std::vector<float> v(4, 1.0f);
    AllreduceRequest a;
    a.name = "where";
    a.input = a.output =
        r == 0 ? TensorView(v.data(), DataType::kFloat32, {4}) : Cuda(v, 0);
    absl::Status s = rts[r]->Allreduce(a)->Wait();
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("device mismatch: rank 0 has cpu; rank 1 has cuda"))
        << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("\"where\""));
  });
  ShutdownJob(rts);
}

TEST(DevicePathTest, OneGpuPerRankAndProcessSet) {
  auto rts = StartJob(1);
  std::vector<float> a0(4, 1.0f), a1(4, 1.0f);
  AllreduceRequest a;
  a.name = "on0";
  a.input = a.output = Cuda(a0, 0);
  ASSERT_TRUE(rts[0]->Allreduce(a)->Wait().ok());
  a.name = "on1";
  a.input = a.output = Cuda(a1, 1);
  auto w = rts[0]->Allreduce(a);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(std::string(w.status().message()),
              HasSubstr("\"on1\": the tensor is on cuda:1 but rank 0 already "
                        "runs process set 0 on cuda:0"));
  ShutdownJob(rts);
}

TEST(DevicePathTest, ADeviceErrorReportedLaterFailsTheWorkAndTheJob) {
  auto rts = StartJob(1);
  std::vector<float> v(4, 1.0f);
  AllreduceRequest a;
  a.name = "faulty";
  a.input = a.output = Cuda(v, 0);
  Stats().fail_finishes = 1;
  absl::Status s = rts[0]->Allreduce(a)->Wait();
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("\"faulty\" failed: fake device error"));
  // The job is failed: later collectives say why at once.
  a.name = "next";
  auto next = rts[0]->Allreduce(a);
  absl::Status later = next.ok() ? next->Wait() : next.status();
  EXPECT_THAT(std::string(later.message()), HasSubstr("fake device error"));
  rts[0]->Abort();
}

}  // namespace
}  // namespace kolo
