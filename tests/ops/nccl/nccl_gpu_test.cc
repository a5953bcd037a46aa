// The NCCL backend on a real GPU (cuda:0), world size 1: every collective,
// every dtype and reduce op, scaling, fusion, CPU and CUDA tensors in one
// step, ReadyEvents, ordering after the default stream, and the watchdog.
// Every test skips ("no GPU: ...") where cudaGetDeviceCount fails.
//
// With one GPU a job has one NCCL rank (NCCL refuses two ranks of one
// communicator on one GPU): results are checked against the host's
// computation of post * op(pre * x) over that one rank. Multi-rank NCCL
// reductions are covered by hierarchical_gpu_test (two processes) and by
// multi-GPU machines.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/loop/backend.h"
#include "tests/ops/nccl/gpu_testing.h"
#include "tests/testing/local_job.h"
#include "tests/testing/values.h"

namespace kolo {
namespace {

using testing::Buffer;
using testing::DeviceBuffer;
using ::testing::HasSubstr;

std::vector<ReduceOp> OpsFor(DataType dtype) {
  std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                               ReduceOp::kProduct};
  if (IsFloatingPoint(dtype)) ops.push_back(ReduceOp::kAverage);
  return ops;
}

double Tolerance(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return 2e-3;
    case DataType::kBfloat16:
      return 1.6e-2;
    case DataType::kFloat32:
      return 1e-6;
    case DataType::kFloat64:
      return 1e-12;
    default:
      return 0;
  }
}

// x_i: small values every dtype holds exactly (products of one rank too).
double Input(size_t i) { return static_cast<double>(i % 7) + 1; }

void ExpectNear(const Buffer& got, size_t n, double factor,
                const std::string& what) {
  const double tol = Tolerance(got.dtype);
  for (size_t i = 0; i < n; ++i) {
    const double want = factor * Input(i);
    if (tol == 0) {
      ASSERT_EQ(got.at(i), want) << what << " element " << i;
    } else {
      ASSERT_NEAR(got.at(i), want, tol * std::fabs(want) + 1e-30)
          << what << " element " << i;
    }
  }
}

class NcclGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    job_ = testing::StartJob(1);
    ASSERT_TRUE(job_[0]);
  }
  void TearDown() override {
    if (!job_.empty() && job_[0]) testing::ShutdownJob(job_);
  }
  Runtime& rt() { return *job_[0]; }

  std::vector<std::unique_ptr<Runtime>> job_;
};

TEST_F(NcclGpuTest, AllreduceEveryDtypeOpAndScale) {
  for (DataType dtype : testing::AllDataTypes()) {
    if (dtype == DataType::kInt16) continue;  // No NCCL type: refused.
    for (ReduceOp op : OpsFor(dtype)) {
      // (prescale, postscale): floating point only; negative to swap min/max.
      std::vector<std::pair<double, double>> scales = {{1, 1}};
      if (IsFloatingPoint(dtype))
        scales.insert(scales.end(), {{0.5, 3}, {-0.5, 2}});
      for (auto [pre, post] : scales) {
        for (size_t n : {size_t{0}, size_t{1}, size_t{1000}, size_t{70001}}) {
          const std::string what =
              absl::StrCat(DataTypeName(dtype), " ", ReduceOpName(op), " pre ",
                           pre, " post ", post, " n ", n);
          Buffer host(dtype, n);
          for (size_t i = 0; i < n; ++i) host.set(i, Input(i));
          const size_t bytes = n * DataTypeSize(dtype);
          DeviceBuffer in(bytes), out(bytes);
          ASSERT_TRUE(in.Upload(host.data(), bytes));
          AllreduceRequest req;
          req.name = what;
          req.input = TensorView(in.data(), dtype, {static_cast<int64_t>(n)},
                                 Device::Cuda(0));
          // Out of place for the large one, in place otherwise.
          req.output = req.input;
          if (n == 70001) req.output.data = out.data();
          req.op = op;
          req.prescale = pre;
          req.postscale = post;
          auto work = rt().Allreduce(req);
          ASSERT_TRUE(work.ok()) << what << ": " << work.status();
          absl::Status s = work->Wait(absl::Seconds(60));
          ASSERT_TRUE(s.ok()) << what << ": " << s;
          Buffer got(dtype, n);
          ASSERT_TRUE((n == 70001 ? out : in).Download(got.data(), bytes));
          // One rank: post * op(pre * x) = pre * post * x for every op
          // (average divides by 1).
          ExpectNear(got, n, pre * post, what);
        }
      }
    }
  }
}

TEST_F(NcclGpuTest, FusedAllreduceOfManySmallTensors) {
  const int kTensors = 300;
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  std::vector<AllreduceRequest> group;
  for (int t = 0; t < kTensors; ++t) {
    const size_t n = 1 + t % 50;
    Buffer host(DataType::kFloat32, n);
    for (size_t i = 0; i < n; ++i) host.set(i, Input(i + t));
    buffers.push_back(std::make_unique<DeviceBuffer>(n * 4));
    ASSERT_TRUE(buffers.back()->Upload(host.data(), n * 4));
    AllreduceRequest req;
    req.name = absl::StrCat("fused.", t);
    req.input = req.output =
        TensorView(buffers.back()->data(), DataType::kFloat32,
                   {static_cast<int64_t>(n)}, Device::Cuda(0));
    req.op = ReduceOp::kAverage;
    req.postscale = 2;
    group.push_back(req);
  }
  const int64_t before = rt().stats().collectives_executed;
  auto work = rt().GroupedAllreduce(group);
  ASSERT_TRUE(work.ok()) << work.status();
  ASSERT_TRUE(work->Wait(absl::Seconds(60)).ok());
  // One group under the fusion threshold: one NCCL allreduce.
  EXPECT_EQ(rt().stats().collectives_executed - before, 1);
  for (int t = 0; t < kTensors; ++t) {
    const size_t n = 1 + t % 50;
    Buffer got(DataType::kFloat32, n);
    ASSERT_TRUE(buffers[t]->Download(got.data(), n * 4));
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(got.at(i), 2 * Input(i + t))
          << "tensor " << t << " element " << i;
    }
  }
}

TEST_F(NcclGpuTest, CpuAndCudaTensorsInOneStep) {
  std::vector<Work> works;
  std::vector<float> cpu(1000);
  for (size_t i = 0; i < cpu.size(); ++i) cpu[i] = Input(i);
  Buffer host(DataType::kFloat32, 1000);
  for (size_t i = 0; i < 1000; ++i) host.set(i, Input(i));
  DeviceBuffer gpu(4000);
  ASSERT_TRUE(gpu.Upload(host.data(), 4000));
  for (int t = 0; t < 2; ++t) {
    AllreduceRequest req;
    req.name = t == 0 ? "mixed.cpu" : "mixed.cuda";
    req.input = req.output =
        t == 0 ? TensorView(cpu.data(), DataType::kFloat32, {1000})
               : TensorView(gpu.data(), DataType::kFloat32, {1000},
                            Device::Cuda(0));
    req.postscale = 3;
    auto work = rt().Allreduce(req);
    ASSERT_TRUE(work.ok()) << work.status();
    works.push_back(*work);
  }
  for (Work& w : works) ASSERT_TRUE(w.Wait(absl::Seconds(60)).ok());
  Buffer got(DataType::kFloat32, 1000);
  ASSERT_TRUE(gpu.Download(got.data(), 4000));
  for (size_t i = 0; i < 1000; ++i) {
    ASSERT_EQ(cpu[i], 3 * Input(i)) << i;
    ASSERT_EQ(got.at(i), 3 * Input(i)) << i;
  }
}

TEST_F(NcclGpuTest, BroadcastAllgatherAlltoallReducescatter) {
  const int64_t rows = 33, cols = 5;
  const size_t n = rows * cols;
  Buffer host(DataType::kFloat32, n);
  for (size_t i = 0; i < n; ++i) host.set(i, Input(i));
  DeviceBuffer a(n * 4), b(n * 4), c(n * 4), d(n * 4), out(n * 4);
  for (DeviceBuffer* buf : {&a, &b, &c, &d})
    ASSERT_TRUE(buf->Upload(host.data(), n * 4));
  const Device gpu = Device::Cuda(0);

  BroadcastRequest bc;
  bc.name = "bcast";
  bc.tensor = TensorView(a.data(), DataType::kFloat32, {rows, cols}, gpu);
  auto w1 = rt().Broadcast(bc);
  ASSERT_TRUE(w1.ok()) << w1.status();

  std::vector<std::unique_ptr<DeviceBuffer>> outputs;
  auto allocate =
      [&](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    outputs.push_back(std::make_unique<DeviceBuffer>(count * 4));
    if (!outputs.back()->data())
      return absl::ResourceExhaustedError("cudaMalloc");
    return outputs.back()->data();
  };
  AllgatherRequest ag;
  ag.name = "gather";
  ag.input = TensorView(b.data(), DataType::kFloat32, {rows, cols}, gpu);
  ag.allocator = allocate;
  auto w2 = rt().Allgather(ag);
  ASSERT_TRUE(w2.ok()) << w2.status();
  ASSERT_TRUE(w2->Wait(absl::Seconds(60)).ok());  // allocator order

  AlltoallRequest aa;
  aa.name = "alltoall";
  aa.input = TensorView(c.data(), DataType::kFloat32, {rows, cols}, gpu);
  aa.allocator = allocate;
  auto w3 = rt().Alltoall(aa);
  ASSERT_TRUE(w3.ok()) << w3.status();

  ReducescatterRequest rs;
  rs.name = "reducescatter";
  rs.input = TensorView(d.data(), DataType::kFloat32, {rows, cols}, gpu);
  rs.output = TensorView(out.data(), DataType::kFloat32,
                         ReducescatterShape({rows, cols}, 1, 0), gpu);
  rs.prescale = 0.5;
  rs.postscale = 4;
  auto w4 = rt().Reducescatter(rs);
  ASSERT_TRUE(w4.ok()) << w4.status();
  for (auto* w : {&*w1, &*w3, &*w4})
    ASSERT_TRUE(w->Wait(absl::Seconds(60)).ok());
  EXPECT_EQ(w2->received_splits(), std::vector<int64_t>{rows});
  EXPECT_EQ(w3->received_splits(), std::vector<int64_t>{rows});
  ASSERT_EQ(outputs.size(), 2u);
  Buffer got(DataType::kFloat32, n);
  ASSERT_TRUE(a.Download(got.data(), n * 4));
  ExpectNear(got, n, 1, "broadcast");
  ASSERT_TRUE(outputs[0]->Download(got.data(), n * 4));
  ExpectNear(got, n, 1, "allgather");
  ASSERT_TRUE(outputs[1]->Download(got.data(), n * 4));
  ExpectNear(got, n, 1, "alltoall");
  ASSERT_TRUE(out.Download(got.data(), n * 4));
  ExpectNear(got, n, 2, "reducescatter");
}

TEST_F(NcclGpuTest, WaitsForAReadyEventThatTurnsReadyLater) {
  const size_t n = 4096;
  Buffer stale(DataType::kFloat32, n), fresh(DataType::kFloat32, n);
  for (size_t i = 0; i < n; ++i) {
    stale.set(i, 99);
    fresh.set(i, Input(i));
  }
  DeviceBuffer buf(n * 4);
  ASSERT_TRUE(buf.Upload(stale.data(), n * 4));
  auto ready = std::make_shared<testing::FlagReadyEvent>();
  AllreduceRequest req;
  req.name = "late";
  req.input = req.output =
      TensorView(buf.data(), DataType::kFloat32, {static_cast<int64_t>(n)},
                 Device::Cuda(0));
  req.input.ready = req.output.ready = ready;
  req.postscale = 2;
  auto work = rt().Allreduce(req);
  ASSERT_TRUE(work.ok()) << work.status();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(work->IsCompleted()) << "completed before its input was ready";
  ASSERT_TRUE(buf.Upload(fresh.data(), n * 4));
  ready->Set();
  ASSERT_TRUE(work->Wait(absl::Seconds(60)).ok());
  Buffer got(DataType::kFloat32, n);
  ASSERT_TRUE(buf.Download(got.data(), n * 4));
  ExpectNear(got, n, 2, "late tensor");
}

// Blocks the legacy default stream until `release` (or 20 s).
void CUDART_CB BlockStream(void* flag) {
  auto* release = static_cast<std::atomic<bool>*>(flag);
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!release->load() && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST_F(NcclGpuTest, WithoutReadyEventOrdersAfterTheDefaultStream) {
  const size_t n = 1 << 16;
  Buffer fresh(DataType::kFloat32, n);
  for (size_t i = 0; i < n; ++i) fresh.set(i, Input(i));
  void* pinned = nullptr;
  KOLO_CUDA_OK(cudaMallocHost(&pinned, n * 4));
  std::memcpy(pinned, fresh.data(), n * 4);
  DeviceBuffer buf(n * 4);
  KOLO_CUDA_OK(cudaMemset(buf.data(), 0, n * 4));
  // The producer: a copy on the default stream, held back for a while.
  std::atomic<bool> release{false};
  KOLO_CUDA_OK(cudaLaunchHostFunc(cudaStreamLegacy, BlockStream, &release));
  KOLO_CUDA_OK(cudaMemcpyAsync(buf.data(), pinned, n * 4,
                               cudaMemcpyHostToDevice, cudaStreamLegacy));
  AllreduceRequest req;
  req.name = "default-stream";
  req.input = req.output =
      TensorView(buf.data(), DataType::kFloat32, {static_cast<int64_t>(n)},
                 Device::Cuda(0));
  req.postscale = 2;
  auto work = rt().Allreduce(req);
  ASSERT_TRUE(work.ok()) << work.status();
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(work->IsCompleted()) << "ran before the default stream's copy";
  release = true;
  ASSERT_TRUE(work->Wait(absl::Seconds(60)).ok());
  Buffer got(DataType::kFloat32, n);
  ASSERT_TRUE(buf.Download(got.data(), n * 4));
  ExpectNear(got, n, 2, "default-stream tensor");
  cudaFreeHost(pinned);
}

// The backend alone (no runtime), so that the error is the backend's own.
std::unique_ptr<Backend> MakeBackend(absl::Duration op_timeout) {
  BackendContext context;
  context.store = NewInMemoryStore();
  context.device = Device::Cuda(0);
  context.op_timeout = op_timeout;
  context.start_timeout = absl::Seconds(30);
  auto backend =
      BackendRegistry::Get().Create(DeviceType::kCuda, "nccl", context);
  EXPECT_TRUE(backend.ok()) << backend.status();
  return backend.ok() ? std::move(*backend) : nullptr;
}

TEST(NcclGpuBackend, WatchdogAbortsACollectiveThatExceedsTheOpTimeout) {
  KOLO_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto backend = MakeBackend(absl::Seconds(2));
  ASSERT_TRUE(backend);
  EXPECT_STREQ(backend->name(), "nccl");
  EXPECT_FALSE(backend->host_memory());
  auto mem = backend->Allocate(4096);
  ASSERT_TRUE(mem.ok()) << mem.status();
  // The collective waits for the default stream, which a host function
  // holds for up to 20 s: it cannot finish within the 2 s op timeout.
  std::atomic<bool> release{false};
  KOLO_CUDA_OK(cudaLaunchHostFunc(cudaStreamLegacy, BlockStream, &release));
  ASSERT_TRUE(backend->WaitReady({nullptr}).ok());
  ASSERT_TRUE(
      backend->Allreduce(*mem, 1024, DataType::kFloat32, ReduceOp::kSum).ok());
  std::promise<absl::Status> done;
  const auto start = std::chrono::steady_clock::now();
  backend->Finish([&](absl::Status s) { done.set_value(s); });
  auto result = done.get_future();
  // Let go of the stream if the watchdog never fires (or if aborting
  // waits for the stream), so the test ends either way.
  std::thread releaser([&] {
    for (int i = 0; i < 150 && !release.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    release = true;
  });
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)),
            std::future_status::ready);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  release = true;
  releaser.join();
  absl::Status s = result.get();
  std::printf("watchdog fired after %.2f s: %s\n", seconds,
              s.ToString().c_str());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("NCCL allreduce did not complete within 2 s "
                        "(KOLO_OP_TIMEOUT); communicator aborted"));
  EXPECT_GE(seconds, 1.9);
  // Broken from now on, with the first error.
  absl::Status later =
      backend->Allreduce(*mem, 1024, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_THAT(std::string(later.message()), HasSubstr("did not complete"));
  std::promise<absl::Status> done2;
  backend->Finish([&](absl::Status s2) { done2.set_value(s2); });
  EXPECT_FALSE(done2.get_future().get().ok());
  backend->Free(*mem);
  backend.reset();
}

TEST(NcclGpuBackend, ReadyEventThatNeverTurnsReadyTimesOut) {
  KOLO_SKIP_WITHOUT_GPU();
  auto backend = MakeBackend(absl::Seconds(1));
  ASSERT_TRUE(backend);
  auto never = std::make_shared<testing::FlagReadyEvent>();
  absl::Status s = backend->WaitReady({never});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("was not ready"));
}

TEST(NcclGpuBackend, CloseFailsPendingAndLaterWork) {
  KOLO_SKIP_WITHOUT_GPU();
  auto backend = MakeBackend(absl::Seconds(30));
  ASSERT_TRUE(backend);
  auto mem = backend->Allocate(0);  // never null, even for 0 bytes
  ASSERT_TRUE(mem.ok()) << mem.status();
  EXPECT_NE(*mem, nullptr);
  backend->Close();
  backend->Close();  // idempotent
  absl::Status s = backend->Broadcast(*mem, 16, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  std::promise<absl::Status> done;
  backend->Finish([&](absl::Status st) { done.set_value(st); });
  EXPECT_EQ(done.get_future().get().code(), absl::StatusCode::kAborted);
  backend->Free(*mem);
}

}  // namespace
}  // namespace kolo
