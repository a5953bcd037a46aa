// Hierarchical allreduce (KOLO_HIERARCHICAL_ALLREDUCE=1) in two real
// processes on the one GPU, each its own "host" (KOLO_CROSS_RANK 0 and 1,
// one local rank each): NCCL within each host, gloo between them. Both
// ranks must get results equal to the host's computation and bitwise equal
// to each other. (Two ranks of one NCCL communicator cannot share a GPU, so
// the flat path could not have produced them.)
//
// Self-contained: the test starts this same executable twice with
// --worker (rank 0 hosts the store), so it runs the same under Bazel and
// copied alone to a GPU machine. Skips with "no GPU: ..." without one.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kolo/runtime.h"
#include "tests/ops/nccl/gpu_testing.h"
#include "tests/testing/run_command.h"
#include "tests/testing/values.h"

namespace kolo {
namespace {

using testing::Buffer;
using testing::DeviceBuffer;

std::string g_self;  // this executable

// Rank r's element i: small integers, so sums and halves are exact.
double Value(int rank, size_t i) {
  return static_cast<double>((i + 3 * rank) % 11) - 3;
}

struct Case {
  DataType dtype;
  ReduceOp op;
  size_t n;
  double postscale;
};

std::vector<Case> Cases() {
  return {{DataType::kFloat32, ReduceOp::kSum, 0, 1},
          {DataType::kFloat32, ReduceOp::kSum, 1, 1},
          {DataType::kFloat32, ReduceOp::kSum, 1000003, 1},
          {DataType::kFloat32, ReduceOp::kAverage, 4097, 1},
          {DataType::kFloat64, ReduceOp::kSum, 777, 0.5},
          {DataType::kFloat16, ReduceOp::kSum, 3001, 1},
          {DataType::kBfloat16, ReduceOp::kAverage, 3001, 1},
          {DataType::kInt32, ReduceOp::kSum, 5000, 1},
          {DataType::kInt64, ReduceOp::kMax, 999, 1},
          {DataType::kInt8, ReduceOp::kMin, 999, 1},
          {DataType::kFloat32, ReduceOp::kMax, 1000, -2},
          {DataType::kFloat32, ReduceOp::kProduct, 1000, 1}};
}

double Expected(const Case& c, size_t i) {
  const double a = Value(0, i), b = Value(1, i);
  double r = 0;
  switch (c.op) {
    case ReduceOp::kSum:
      r = a + b;
      break;
    case ReduceOp::kAverage:
      r = (a + b) / 2;
      break;
    case ReduceOp::kMin:
      r = std::min(a, b);
      break;
    case ReduceOp::kMax:
      r = std::max(a, b);
      break;
    case ReduceOp::kProduct:
      r = a * b;
      break;
  }
  return r * c.postscale;
}

// FNV-1a over the result bytes.
uint64_t Hash(const void* data, size_t bytes, uint64_t h) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

int Worker() {
  auto options = Runtime::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "options: %s\n", options.status().ToString().c_str());
    return 2;
  }
  auto runtime = Runtime::Create(*options);
  if (!runtime.ok()) {
    std::fprintf(stderr, "create: %s\n", runtime.status().ToString().c_str());
    return 2;
  }
  Runtime& rt = **runtime;
  const int me = rt.rank();
  if (cudaSetDevice(rt.local_rank()) != cudaSuccess) return 2;
  uint64_t hash = 1469598103934665603ull;
  int failures = 0;
  for (int round = 0; round < 2; ++round) {
    std::vector<Case> cases = Cases();
    std::vector<std::unique_ptr<DeviceBuffer>> buffers;
    std::vector<Work> works;
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      Buffer host(c.dtype, c.n);
      for (size_t i = 0; i < c.n; ++i) host.set(i, Value(me, i));
      const size_t bytes = c.n * DataTypeSize(c.dtype);
      buffers.push_back(std::make_unique<DeviceBuffer>(bytes));
      if (!buffers.back()->Upload(host.data(), bytes)) return 2;
      AllreduceRequest req;
      req.name = absl::StrCat("case", k);
      req.input = req.output = TensorView(buffers.back()->data(), c.dtype,
                                          {static_cast<int64_t>(c.n)},
                                          Device::Cuda(rt.local_rank()));
      req.op = c.op;
      req.postscale = c.postscale;
      auto work = rt.Allreduce(req);
      if (!work.ok()) {
        std::fprintf(stderr, "submit: %s\n", work.status().ToString().c_str());
        return 2;
      }
      works.push_back(*work);
    }
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      absl::Status s = works[k].Wait(absl::Seconds(120));
      if (!s.ok()) {
        std::fprintf(stderr, "case %zu: %s\n", k, s.ToString().c_str());
        return 3;
      }
      const size_t bytes = c.n * DataTypeSize(c.dtype);
      Buffer got(c.dtype, c.n);
      if (!buffers[k]->Download(got.data(), bytes)) return 2;
      for (size_t i = 0; i < c.n; ++i) {
        Buffer want(c.dtype, 1);
        want.set(0, Expected(c, i));  // exact in every dtype used here
        if (got.at(i) != want.at(0)) {
          if (++failures < 10) {
            std::fprintf(
                stderr,
                "rank %d case %zu (%s %s) element %zu: got %g, want %g\n", me,
                k, DataTypeName(c.dtype), ReduceOpName(c.op), i, got.at(i),
                want.at(0));
          }
          break;
        }
      }
      hash = Hash(got.data(), bytes, hash);
    }
  }
  absl::Status s = rt.Shutdown(absl::Seconds(60));
  std::printf("rank %d: %d failures, checksum %016llx, shutdown %s\n", me,
              failures, static_cast<unsigned long long>(hash),
              s.ok() ? "ok" : s.ToString().c_str());
  return failures == 0 && s.ok() ? 0 : 1;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

TEST(HierarchicalGpu, TwoHostsOneGpuBitwiseIdenticalAndExact) {
  KOLO_SKIP_WITHOUT_GPU();
  const int port = FreePort();
  ASSERT_GT(port, 0);
  std::vector<std::string> env_common = {
      "KOLO_SIZE=2",
      "KOLO_LOCAL_RANK=0",
      "KOLO_LOCAL_SIZE=1",
      "KOLO_CROSS_SIZE=2",
      "KOLO_HIERARCHICAL_ALLREDUCE=1",
      "KOLO_SHM=0",
      "KOLO_HOST_STORE=1",
      "KOLO_RENDEZVOUS_ADDR=127.0.0.1",
      absl::StrCat("KOLO_RENDEZVOUS_PORT=", port),
      "KOLO_SECRET=hierarchical-gpu-test-secret-0123456789",
      "KOLO_OP_TIMEOUT=120",
      "KOLO_START_TIMEOUT=60",
      "KOLO_LOG_LEVEL=info",
  };
  std::vector<kolo::testing::CommandResult> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      std::vector<std::string> args = {"/usr/bin/env",
                                       absl::StrCat("KOLO_RANK=", r),
                                       absl::StrCat("KOLO_CROSS_RANK=", r)};
      args.insert(args.end(), env_common.begin(), env_common.end());
      args.push_back(g_self);
      args.push_back("--worker");
      results[r] = kolo::testing::RunCommand(args, 240);
    });
  }
  for (auto& t : ranks) t.join();
  std::set<std::string> sums;
  std::regex line(
      R"(rank (\d): 0 failures, checksum ([0-9a-f]+), shutdown ok)");
  for (int r = 0; r < 2; ++r) {
    std::printf("---- rank %d (exit %d) ----\n%s", r, results[r].exit_code,
                results[r].output.c_str());
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ":\n"
                                       << results[r].output;
    std::smatch m;
    if (std::regex_search(results[r].output, m, line)) sums.insert(m[2]);
  }
  EXPECT_EQ(sums.size(), 1u) << "ranks got different bits";
}

}  // namespace
}  // namespace kolo

int main(int argc, char** argv) {
  // /proc/self/exe: the path works wherever the binary was copied to.
  char self[4096] = {};
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  kolo::g_self = n > 0 ? std::string(self, n) : std::string(argv[0]);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--worker") == 0) return kolo::Worker();
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
