// Integration tests through the real launcher: real processes, real TCP
// store, control plane and gloo. Each run has a harness deadline, so a hang
// fails the test instead of blocking it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/run_command.h"

namespace {

using ::testing::HasSubstr;

std::string g_kolorun, g_demo, g_fault_worker, g_parity_worker;

using Result = kolo::testing::CommandResult;
using kolo::testing::RunCommand;

std::string MakeTempDir() {
  std::string tmpl =
      std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
      "/kolo_pids_XXXXXX";
  return mkdtemp(tmpl.data());
}

// Every pid recorded under `dir` is gone (no orphan workers).
void ExpectNoWorkerLeft(const std::string& dir, int np) {
  for (int r = 0; r < np; ++r) {
    std::ifstream in(dir + "/" + std::to_string(r));
    pid_t pid = 0;
    if (!(in >> pid)) continue;  // never started far enough to record
    EXPECT_NE(kill(pid, 0), 0)
        << "worker rank " << r << " (pid " << pid << ") is still alive";
  }
}

TEST(KolorunJob, FourRanks500TensorsExactAndBitwiseIdentical) {
  Result r = RunCommand({g_kolorun, "-np", "4", g_demo, "--tensors", "500",
                         "--iterations", "2", "--max-elements", "65536"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::regex ok_line(R"(\[(\d)\] OK rank (\d) of 4: .* checksum ([0-9a-f]+))");
  std::set<std::string> ranks, checksums;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), ok_line), end;
       it != end; ++it) {
    EXPECT_EQ((*it)[1], (*it)[2]) << "output prefix must be the rank";
    ranks.insert((*it)[1]);
    checksums.insert((*it)[3]);
  }
  EXPECT_EQ(ranks.size(), 4u) << r.output;
  EXPECT_EQ(checksums.size(), 1u) << "results differ between ranks:\n"
                                  << r.output;
}

TEST(KolorunJob, WorkerExitingWithThreeFailsTheJobAndLeavesNothing) {
  const std::string dir = MakeTempDir();
  Result r = RunCommand({g_kolorun, "-np", "4", g_fault_worker, "--pid-dir",
                         dir, "--fault-rank", "2", "--fault", "exit3"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "kolorun hung:\n" << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 2"));
  EXPECT_THAT(r.output, HasSubstr("code 3"));
  ExpectNoWorkerLeft(dir, 4);
}

TEST(KolorunJob, SigkilledWorkerIsNamedByEverySurvivor) {
  const std::string dir = MakeTempDir();
  Result r = RunCommand({g_kolorun, "-np", "4", "--grace-period", "20",
                         g_fault_worker, "--pid-dir", dir, "--fault-rank", "1",
                         "--fault", "sigkill", "--block-sigterm"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "kolorun hung:\n" << r.output;
  // The launcher names the first failure...
  EXPECT_THAT(r.output, HasSubstr("rank 1"));
  EXPECT_THAT(r.output, HasSubstr("SIGKILL"));
  // ...and every survivor's pending allreduce failed naming rank 1.
  for (int rank : {0, 2, 3}) {
    EXPECT_THAT(r.output, HasSubstr("[" + std::to_string(rank) + "] rank " +
                                    std::to_string(rank) + " error: "))
        << r.output;
  }
  std::regex lost(R"(\[\d\] rank \d error: [^\n]*rank 1 lost)");
  EXPECT_EQ(std::distance(
                std::sregex_iterator(r.output.begin(), r.output.end(), lost),
                std::sregex_iterator()),
            3)
      << r.output;
  ExpectNoWorkerLeft(dir, 4);
}

TEST(KolorunJob, KilledCoordinatorIsReportedAsLostCoordinator) {
  const std::string dir = MakeTempDir();
  Result r = RunCommand({g_kolorun, "-np", "3", "--grace-period", "20",
                         g_fault_worker, "--pid-dir", dir, "--fault-rank", "0",
                         "--fault", "sigkill", "--block-sigterm"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "kolorun hung:\n" << r.output;
  std::regex lost(R"(\[\d\] rank \d error: [^\n]*lost coordinator \(rank 0\))");
  EXPECT_EQ(std::distance(
                std::sregex_iterator(r.output.begin(), r.output.end(), lost),
                std::sregex_iterator()),
            2)
      << r.output;
  ExpectNoWorkerLeft(dir, 3);
}

TEST(KolorunJob, StalledRankIsNamedThenTheJobFails) {
  const std::string dir = MakeTempDir();
  Result r = RunCommand({"/usr/bin/env", "KOLO_STALL_CHECK_TIME=1",
                         "KOLO_STALL_SHUTDOWN_TIME=3", g_kolorun, "-np", "3",
                         g_fault_worker, "--pid-dir", dir, "--fault-rank", "1",
                         "--fault", "stall"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, -1) << "kolorun hung:\n" << r.output;
  // Rank 0's stall inspector names the rank and the tensor it holds back...
  EXPECT_THAT(r.output, HasSubstr("rank 1: [fault/victim]")) << r.output;
  // ...and then every rank fails with the stall, naming rank 1.
  std::regex stalled(R"(\[\d\] rank \d error: [^\n]*stalled[^\n]*rank 1)");
  EXPECT_GE(std::distance(
                std::sregex_iterator(r.output.begin(), r.output.end(), stalled),
                std::sregex_iterator()),
            2)
      << r.output;
  ExpectNoWorkerLeft(dir, 3);
}

TEST(KolorunJob, HorovodParityCollectivesInRealProcesses) {
  const std::string timeline = MakeTempDir() + "/timeline.json";
  Result r = RunCommand({"/usr/bin/env", "KOLO_TIMELINE=" + timeline,
                         "KOLO_TIMELINE_MARK_CYCLES=1", g_kolorun, "-np", "4",
                         g_parity_worker});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::regex ok_line(R"(\[(\d)\] PARITY OK rank \d join last (\d))");
  std::set<std::string> ranks, lasts;
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), ok_line), end;
       it != end; ++it) {
    ranks.insert((*it)[1]);
    lasts.insert((*it)[2]);
  }
  EXPECT_EQ(ranks.size(), 4u) << r.output;
  EXPECT_EQ(lasts.size(), 1u) << "Join returned different ranks:\n" << r.output;
  // Rank 0 wrote the timeline of the whole run, as valid JSON.
  Result json = RunCommand({"/usr/bin/python3", "-c",
                            "import json,sys; t=json.load(open(sys.argv[1])); "
                            "print(sorted({e['name'] for e in t}))",
                            timeline});
  EXPECT_EQ(json.exit_code, 0) << json.output;
  // The collective phases are named after the backend (GLOO_ or SHM_).
  for (const char* phase : {"NEGOTIATE", "_ALLREDUCE", "_ALLTOALL",
                            "_REDUCESCATTER", "CYCLE_START"}) {
    EXPECT_THAT(json.output, HasSubstr(phase));
  }
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s KOLORUN DEMO FAULT_WORKER PARITY_WORKER\n",
                 argv[0]);
    return 2;
  }
  g_kolorun = argv[1];
  g_demo = argv[2];
  g_fault_worker = argv[3];
  g_parity_worker = argv[4];
  return RUN_ALL_TESTS();
}
