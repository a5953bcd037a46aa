// The shm path in real processes, through the real launcher: the demo gives
// the same checksums with KOLO_SHM=1 and 0, and a worker SIGKILLed in the
// middle of shared-memory collectives is reported by every survivor and
// leaves no /dev/shm entry and no process behind.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/run_command.h"

namespace {

using ::testing::HasSubstr;

std::string g_kolorun, g_demo, g_worker;

using Result = kolo::testing::CommandResult;
using kolo::testing::RunCommand;

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos;
       at = haystack.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

std::set<std::string> Checksums(const std::string& output, int np) {
  std::regex ok_line(R"(\[(\d)\] OK rank \d of (\d): .* checksum ([0-9a-f]+))");
  std::set<std::string> ranks, sums;
  for (std::sregex_iterator it(output.begin(), output.end(), ok_line), end;
       it != end; ++it) {
    ranks.insert((*it)[1]);
    sums.insert((*it)[3]);
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(np)) << output;
  return sums;
}

TEST(ShmKolorun, DemoChecksumsAreTheSameWithShmOnAndOff) {
  // Tensors up to 300k elements: several 1 MiB chunks in the larger ones.
  const std::vector<std::string> demo = {
      g_demo, "--tensors",      "120",   "--iterations",
      "2",    "--max-elements", "300000"};
  std::vector<std::string> on = {
      "/usr/bin/env", "KOLO_SHM=1", "KOLO_LOG_LEVEL=info",
      g_kolorun,      "-np",        "4"};
  std::vector<std::string> off = on;
  off[1] = "KOLO_SHM=0";
  on.insert(on.end(), demo.begin(), demo.end());
  off.insert(off.end(), demo.begin(), demo.end());
  Result with_shm = RunCommand(on);
  Result with_gloo = RunCommand(off);
  ASSERT_EQ(with_shm.exit_code, 0) << with_shm.output;
  ASSERT_EQ(with_gloo.exit_code, 0) << with_gloo.output;
  // Each run used the path it was asked for...
  EXPECT_EQ(Count(with_shm.output, "process set 0: 4 ranks over shm"), 4)
      << "is //ops/shm linked into //:kolo?\n"
      << with_shm.output;
  EXPECT_EQ(Count(with_gloo.output, "process set 0: 4 ranks over gloo"), 4)
      << with_gloo.output;
  // ...and every rank of both runs got the same bits.
  std::set<std::string> sums = Checksums(with_shm.output, 4);
  const std::set<std::string> gloo_sums = Checksums(with_gloo.output, 4);
  sums.insert(gloo_sums.begin(), gloo_sums.end());
  EXPECT_EQ(sums.size(), 1u) << with_shm.output << with_gloo.output;
}

std::vector<pid_t> RecordedPids(const std::string& dir, int np) {
  std::vector<pid_t> pids;
  for (int r = 0; r < np; ++r) {
    std::ifstream in(dir + "/" + std::to_string(r));
    pid_t pid = 0;
    if (in >> pid) pids.push_back(pid);
  }
  return pids;
}

// Entries of /dev/shm that a worker created: "kolo-<pid>-...".
std::vector<std::string> SegmentsOf(const std::vector<pid_t>& pids) {
  std::vector<std::string> found;
  DIR* dir = opendir("/dev/shm");
  if (!dir) return found;
  while (dirent* e = readdir(dir)) {
    for (pid_t pid : pids) {
      if (std::string(e->d_name).rfind("kolo-" + std::to_string(pid) + "-",
                                       0) == 0) {
        found.push_back(e->d_name);
      }
    }
  }
  closedir(dir);
  return found;
}

TEST(ShmKolorun, SigkilledWorkerIsNamedAndLeavesNoSharedMemory) {
  std::string tmpl =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/kolo_shm_pids_XXXXXX";
  const std::string dir = mkdtemp(tmpl.data());
  Result r = RunCommand({"/usr/bin/env", "KOLO_SHM=1", "KOLO_LOG_LEVEL=info",
                         g_kolorun, "-np", "4", "--grace-period", "20",
                         g_worker, "--pid-dir", dir, "--fault-rank", "1"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "kolorun hung:\n" << r.output;
  EXPECT_EQ(Count(r.output, "process set 0: 4 ranks over shm"), 4) << r.output;
  EXPECT_THAT(r.output, HasSubstr("SIGKILL"));
  // Every survivor's allreduce failed, naming rank 1.
  std::regex named(R"(\[\d\] rank \d error: [^\n]*rank 1)");
  EXPECT_EQ(std::distance(
                std::sregex_iterator(r.output.begin(), r.output.end(), named),
                std::sregex_iterator()),
            3)
      << r.output;
  const std::vector<pid_t> pids = RecordedPids(dir, 4);
  EXPECT_EQ(pids.size(), 4u);
  for (pid_t pid : pids)
    EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " still alive";
  EXPECT_THAT(SegmentsOf(pids), ::testing::IsEmpty());
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s KOLORUN DEMO SHM_WORKER\n", argv[0]);
    return 2;
  }
  g_kolorun = argv[1];
  g_demo = argv[2];
  g_worker = argv[3];
  return RUN_ALL_TESTS();
}
