// When the shm backend cannot start (here: a stand-in registered as "shm"
// that fails like a too-small /dev/shm), every rank falls back to gloo, the
// set's rank 0 logs one warning saying why, and the job works.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/loop/backend.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

const BackendRegistrar kFailingShm(
    DeviceType::kCpu, "shm",
    [](const BackendContext&) -> absl::StatusOr<std::unique_ptr<Backend>> {
      return absl::ResourceExhaustedError(
          "cannot reserve 6144 KiB of shared memory: No space left on device "
          "(/dev/shm has 1.0 MiB free)");
    },
    BackendSelection::kByNameOnly);

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

TEST(ShmFallback, EveryRankFallsBackToGlooWithOneWarning) {
  ::testing::internal::CaptureStderr();
  auto job = testing::StartJob(3);  // KOLO_SHM is on by default
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(Count(log, "WARNING: process set 0: shared memory unavailable"), 1)
      << log;
  EXPECT_THAT(log,
              ::testing::HasSubstr("(/dev/shm has 1.0 MiB free)); using gloo"));
  testing::OnEachRank(3, [&](int r) {
    std::vector<float> v(1000, static_cast<float>(r));
    AllreduceRequest req;
    req.name = "after_fallback";
    req.input = req.output = TensorView(v.data(), DataType::kFloat32, {1000});
    ASSERT_TRUE(job[r]->Allreduce(req)->Wait().ok());
    EXPECT_EQ(v[999], 3.0f);
  });
  testing::ShutdownJob(job);
}

}  // namespace
}  // namespace kolo
