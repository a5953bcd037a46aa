// The NCCL backend's pieces that need no GPU, and how a build with CUDA
// behaves on a machine without one (or with fewer GPUs than asked for): the
// device probe's message, the factory's error, and a Runtime rejecting a
// CUDA tensor at submit. On a GPU machine the "no GPU" tests check the
// other branch (a device ordinal that does not exist) instead, so every
// test asserts something wherever it runs.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/cpu/reduce.h"
#include "ops/nccl/cuda_util.h"
#include "ops/nccl/hierarchical.h"
#include "runtime/loop/backend.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// A device this machine does not have: cuda:0 without a GPU, else cuda:N.
Device MissingDevice() {
  auto count = nccl::CudaDeviceCount();
  return Device::Cuda(count.ok() ? *count : 0);
}

TEST(CudaProbe, NamesWhyTheDeviceIsUnusable) {
  auto count = nccl::CudaDeviceCount();
  absl::Status s = nccl::ProbeCudaDevice(MissingDevice());
  ASSERT_FALSE(s.ok());
  if (!count.ok()) {
    std::printf("no GPU here: %s\n",
                std::string(count.status().message()).c_str());
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(s.message()),
                StartsWith("no CUDA device is visible to this process "
                           "(cudaGetDeviceCount: "));
    // Asked once: the same answer again.
    EXPECT_EQ(nccl::ProbeCudaDevice(Device::Cuda(1)), s);
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(s.message()),
              absl::StrCat("cuda:", *count, " does not exist (", *count,
                           *count == 1 ? " device)" : " devices)"));
    EXPECT_TRUE(nccl::ProbeCudaDevice(Device::Cuda(0)).ok());
  }
}

TEST(CudaProbe, RegisteredWithTheNcclBackend) {
  EXPECT_TRUE(BackendRegistry::Get().Has(DeviceType::kCuda, "nccl"));
  EXPECT_TRUE(BackendRegistry::Get().Has(DeviceType::kCuda));
  EXPECT_EQ(BackendRegistry::Get().CheckDevice(MissingDevice()),
            nccl::ProbeCudaDevice(MissingDevice()));
  EXPECT_TRUE(BackendRegistry::Get().CheckDevice(Device::Cpu()).ok());
}

TEST(NcclFactory, FailsWithTheProbesErrorOnAMissingDevice) {
  BackendContext context;
  context.store = NewInMemoryStore();
  context.device = MissingDevice();
  context.start_timeout = absl::Seconds(5);
  auto backend = BackendRegistry::Get().Create(DeviceType::kCuda, context);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status(), nccl::ProbeCudaDevice(MissingDevice()));
  auto by_name =
      BackendRegistry::Get().Create(DeviceType::kCuda, "nccl", context);
  EXPECT_EQ(by_name.status(), backend.status());
}

TEST(NcclRuntime, RejectsACudaTensorOnAMissingDeviceAtSubmit) {
  auto job = testing::StartJob(1);
  ASSERT_TRUE(job[0]);
  const Device device = MissingDevice();
  // Never dereferenced: the submit is refused before anything runs.
  void* fake = reinterpret_cast<void*>(0x1000);
  AllreduceRequest req;
  req.name = "layer1.weight.grad";
  req.input = req.output = TensorView(fake, DataType::kFloat32, {4, 4}, device);
  auto work = job[0]->Allreduce(req);
  ASSERT_FALSE(work.ok());
  const std::string message(work.status().message());
  EXPECT_THAT(message, HasSubstr("allreduce \"layer1.weight.grad\""));
  EXPECT_THAT(message, HasSubstr(device.ToString()));
  EXPECT_THAT(message,
              HasSubstr(std::string(nccl::ProbeCudaDevice(device).message())));
  // The runtime is still usable for CPU tensors.
  std::vector<float> x(5, 2.0f);
  AllreduceRequest cpu;
  cpu.name = "cpu";
  cpu.input = cpu.output = TensorView(x.data(), DataType::kFloat32, {5});
  auto ok = job[0]->Allreduce(cpu);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->Wait(absl::Seconds(30)).ok());
  EXPECT_EQ(x[4], 2.0f);
  testing::ShutdownJob(job);
}

TEST(SplitEvenly, OffsetsCoverTheBufferWithTheFirstShardsLarger) {
  struct Case {
    size_t count;
    int parts;
    std::vector<size_t> counts;
  };
  for (const Case& c : std::vector<Case>{{0, 3, {0, 0, 0}},
                                         {1, 3, {1, 0, 0}},
                                         {7, 3, {3, 2, 2}},
                                         {9, 3, {3, 3, 3}},
                                         {10, 4, {3, 3, 2, 2}},
                                         {5, 1, {5}}}) {
    std::vector<Shard> shards = SplitEvenly(c.count, c.parts);
    ASSERT_EQ(shards.size(), c.counts.size());
    size_t offset = 0;
    for (size_t k = 0; k < shards.size(); ++k) {
      EXPECT_EQ(shards[k].offset, offset)
          << c.count << "/" << c.parts << " #" << k;
      EXPECT_EQ(shards[k].count, c.counts[k])
          << c.count << "/" << c.parts << " #" << k;
      offset += shards[k].count;
    }
    EXPECT_EQ(offset, c.count);
  }
  EXPECT_TRUE(SplitEvenly(5, 0).empty());
}

TEST(NcclTypes, EveryKoloDtypeMapsToTheNcclTypeOfTheSameLayout) {
  struct Case {
    DataType kolo;
    ncclDataType_t nccl;
  };
  const std::vector<Case> cases = {
      {DataType::kUint8, ncclUint8},     {DataType::kInt8, ncclInt8},
      {DataType::kInt32, ncclInt32},     {DataType::kInt64, ncclInt64},
      {DataType::kFloat16, ncclFloat16}, {DataType::kBfloat16, ncclBfloat16},
      {DataType::kFloat32, ncclFloat32}, {DataType::kFloat64, ncclFloat64},
      {DataType::kBool, ncclUint8}};
  // int16 has no NCCL type: the runtime refuses int16 CUDA tensors
  // (Runtime.Int16CudaTensorsAreRefused in tests/runtime/api/errors_test.cc).
  ASSERT_EQ(cases.size() + 1, static_cast<size_t>(kNumDataTypes));
  for (const Case& c : cases) {
    EXPECT_EQ(nccl::ToNcclDataType(c.kolo), c.nccl) << DataTypeName(c.kolo);
  }
}

TEST(NcclTypes, ReduceOps) {
  EXPECT_EQ(nccl::ToNcclRedOp(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(nccl::ToNcclRedOp(ReduceOp::kMin), ncclMin);
  EXPECT_EQ(nccl::ToNcclRedOp(ReduceOp::kMax), ncclMax);
  EXPECT_EQ(nccl::ToNcclRedOp(ReduceOp::kProduct), ncclProd);
  EXPECT_EQ(nccl::ToNcclRedOp(ReduceOp::kAverage), ncclAvg);
}

TEST(NcclTypes, PreMulSumScalarsAreEncodedInTheTensorsDtype) {
  uint16_t h, b;
  float f;
  double d;
  nccl::Scalar s = nccl::ScalarOf(DataType::kFloat16, 0.5);
  std::memcpy(&h, s.bytes, 2);
  EXPECT_EQ(h, 0x3800);
  s = nccl::ScalarOf(DataType::kBfloat16, 0.5);
  std::memcpy(&b, s.bytes, 2);
  EXPECT_EQ(b, 0x3F00);
  s = nccl::ScalarOf(DataType::kFloat32, 0.25);
  std::memcpy(&f, s.bytes, 4);
  EXPECT_EQ(f, 0.25f);
  s = nccl::ScalarOf(DataType::kFloat64, 1.0 / 3);
  std::memcpy(&d, s.bytes, 8);
  EXPECT_EQ(d, 1.0 / 3);
  // 1/3 in half precision: the nearest half, as NCCL will multiply by it.
  s = nccl::ScalarOf(DataType::kFloat16, 1.0 / 3);
  std::memcpy(&h, s.bytes, 2);
  EXPECT_EQ(h, cpu::FloatToHalf(1.0f / 3));
}

TEST(NcclTypes, ScaledReductionsBecomeAPreMulSumOrAPostscale) {
  nccl::ScaledReduction p =
      nccl::PlanScaledReduction(ReduceOp::kSum, 0.5, 4, 3);
  EXPECT_EQ(p.op, ReduceOp::kSum);
  EXPECT_EQ(p.premul, 2.0);
  EXPECT_EQ(p.postscale, 1.0);
  p = nccl::PlanScaledReduction(ReduceOp::kMin, 2, 3, 3);
  EXPECT_EQ(p.op, ReduceOp::kMin);
  EXPECT_EQ(p.premul, 1.0);
  EXPECT_EQ(p.postscale, 6.0);
  // min(-x) = -max(x).
  p = nccl::PlanScaledReduction(ReduceOp::kMin, -2, 1, 3);
  EXPECT_EQ(p.op, ReduceOp::kMax);
  EXPECT_EQ(p.postscale, -2.0);
  p = nccl::PlanScaledReduction(ReduceOp::kMax, -1, 1, 3);
  EXPECT_EQ(p.op, ReduceOp::kMin);
  // prod(2 x_r) over 3 ranks = 8 prod(x_r).
  p = nccl::PlanScaledReduction(ReduceOp::kProduct, 2, 0.5, 3);
  EXPECT_EQ(p.op, ReduceOp::kProduct);
  EXPECT_EQ(p.premul, 1.0);
  EXPECT_EQ(p.postscale, 4.0);
  // No scaling: plain ops.
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
    p = nccl::PlanScaledReduction(op, 1, 1, 5);
    EXPECT_EQ(p.op, op);
    EXPECT_EQ(p.premul, 1.0);
    EXPECT_EQ(p.postscale, 1.0);
  }
}

TEST(NcclStatus, CodesFollowWhatTheCallerShouldDo) {
  absl::Status s = nccl::NcclStatus(ncclRemoteError, "ncclAllReduce");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), StartsWith("ncclAllReduce: "));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(ncclGetErrorString(ncclRemoteError)));
  EXPECT_EQ(nccl::NcclStatus(ncclInvalidArgument, "x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(nccl::NcclStatus(ncclInternalError, "x").code(),
            absl::StatusCode::kInternal);
  EXPECT_TRUE(nccl::NcclStatus(ncclSuccess, "x").ok());
  s = nccl::CudaStatus(cudaErrorInsufficientDriver, "cudaSetDevice");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(cudaGetErrorString(cudaErrorInsufficientDriver)));
  EXPECT_EQ(nccl::CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(nccl::CudaStatus(cudaSuccess, "x").ok());
}

TEST(HostPlan, SplitsTheSetByHost) {
  // Two hosts, two ranks each, interleaved set ranks.
  const std::vector<std::string> hosts = {"0@a", "1@b", "0@a", "1@b"};
  nccl::HostPlan p = nccl::MakeHostPlan(hosts, 3);
  EXPECT_TRUE(p.usable) << p.why_not;
  EXPECT_EQ(p.host_count, 2);
  EXPECT_EQ(p.host_index, 1);
  EXPECT_EQ(p.local_size, 2);
  EXPECT_EQ(p.local_rank, 1);
  EXPECT_EQ(p.local_ranks, (std::vector<int>{1, 3}));
  p = nccl::MakeHostPlan(hosts, 0);
  EXPECT_EQ(p.host_index, 0);
  EXPECT_EQ(p.local_rank, 0);
  EXPECT_EQ(p.local_ranks, (std::vector<int>{0, 2}));
  // One rank per host (the hierarchical GPU test's layout).
  p = nccl::MakeHostPlan({"0@h", "1@h"}, 1);
  EXPECT_TRUE(p.usable);
  EXPECT_EQ(p.host_index, 1);
  EXPECT_EQ(p.local_size, 1);
  EXPECT_EQ(p.local_rank, 0);
}

TEST(HostPlan, FallsBackToFlatForOneHostOrUnevenHosts) {
  nccl::HostPlan p = nccl::MakeHostPlan({"0@a", "0@a", "0@a"}, 1);
  EXPECT_FALSE(p.usable);
  EXPECT_EQ(p.host_count, 1);
  EXPECT_THAT(p.why_not, HasSubstr("one host"));
  p = nccl::MakeHostPlan({"0@a", "0@a", "1@b"}, 2);
  EXPECT_FALSE(p.usable);
  EXPECT_EQ(p.host_count, 2);
  EXPECT_THAT(p.why_not, HasSubstr("different numbers of ranks (2, 1)"));
  p = nccl::MakeHostPlan({}, 0);
  EXPECT_FALSE(p.usable);
}

}  // namespace
}  // namespace kolo
