// RELIABILITY.md's round two, with real processes through kolorun: 17 (kill
// -9 of the launcher leaves no secret and no process), 18 (start-up
// failures and Shutdown's timeout name the right rank, at once), and the
// survivors' own errors reaching the user. 15 is store_flood_test, 16
// tests/integration:exit_after_error_test. Timing bounds are the promised
// ones (this target runs alone).
#include <dirent.h>
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/reliability/fixture.h"
#include "tests/reliability/job.h"

namespace kolo {
namespace testing {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kStartupBoundNs = 5'000'000'000LL;

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    closedir(d);
  }
  return out;
}

pid_t PidFromFile(const std::string& path) {
  std::ifstream in(path);
  pid_t pid = 0;
  in >> pid;
  return pid;
}

// A start-up failure: kolorun exits non-zero within the bound, and its
// output has every one of `expected`.
void ExpectStartupFailure(Job& job, const std::vector<std::string>& expected,
                          const char* what) {
  const int code = job.Wait(30);
  EXPECT_NE(code, 0) << job.output();
  EXPECT_NE(code, -1) << job.output();
  for (const std::string& text : expected) {
    EXPECT_THAT(job.output(), HasSubstr(text));
  }
  const double took = Seconds(job.exit_ns() - job.start_ns());
  std::printf("%s: kolorun exited %d after %.3f s\n", what, code, took);
  EXPECT_LE(job.exit_ns() - job.start_ns(), kStartupBoundNs) << job.output();
}

// 17. kill -9 of kolorun: no secret on disk at any time, and every process
// of the job ends, the workers' own children included.
TEST_F(Reliability, T17_LauncherKilledLeavesNoSecretAndNoProcess) {
  const std::string tmpdir = dir_ + "/tmp";
  ASSERT_EQ(mkdir(tmpdir.c_str(), 0700), 0);
  const std::string script = absl::StrCat(
      "sleep 300 & echo $! > ", dir_, "/child.$KOLO_RANK; exec \"$0\" \"$@\"");
  auto job = LaunchCommand(4, ThroughShell(script, {"idle"}),
                           {"KOLO_OP_TIMEOUT=60", "TMPDIR=" + tmpdir});
  for (int r = 0; r < 4; ++r) PidOf(*job, r);
  EXPECT_TRUE(Entries(tmpdir).empty()) << "a file in kolorun's TMPDIR";
  std::vector<pid_t> children;
  for (int r = 0; r < 4; ++r) {
    children.push_back(PidFromFile(absl::StrCat(dir_, "/child.", r)));
    ASSERT_GT(children.back(), 0);
  }
  const int64_t killed = NowNs();
  ASSERT_EQ(kill(job->pid(), SIGKILL), 0);
  job->Wait(10);
  for (int r = 0; r < 4; ++r) {
    EXPECT_TRUE(WaitForExit(children[r], 5))
        << "the child of rank " << r << " (pid " << children[r]
        << ") outlived kolorun";
  }
  std::printf("T17: workers and their children gone %.3f s after kill -9\n",
              Seconds(NowNs() - killed));
  EXPECT_TRUE(Entries(tmpdir).empty()) << "the secret was left on disk";
  ExpectNothingLeft(*job);
}

// 18. A worker that exits 0 before joining: reported at once, naming it,
// and kolorun exits non-zero.
TEST_F(Reliability, T18_RankExitsZeroBeforeJoining) {
  auto job = Launch(4, {"early-exit", "--exit-rank", "2", "--exit-code", "0"});
  ExpectStartupFailure(*job,
                       {"kolorun: rank 2 (pid ", "exited with code 0",
                        "before it joined the rendezvous", "waiting for it"},
                       "T18 early exit 0");
  ExpectNothingLeft(*job);
}

TEST_F(Reliability, T18_TwoWorkersClaimOneRank) {
  auto job =
      LaunchCommand(4, ThroughShell("[ $KOLO_RANK = 1 ] && export KOLO_RANK=0; "
                                    "exec \"$0\" \"$@\"",
                                    {"idle"}));
  ExpectStartupFailure(
      *job, {"rank 0 is claimed by two workers: pid ", "and this one (pid "},
      "T18 two workers with rank 0");
  EXPECT_THAT(job->output(), ::testing::Not(HasSubstr("Abort() was called")));
  ExpectNothingLeft(*job);
}

TEST_F(Reliability, T18_SettingsThatDifferAreNamed) {
  for (const auto& [variable, value, message] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"KOLO_SIZE", "5", "KOLO_SIZE is 5 on rank 3 but 4 on rank 0"},
           {"KOLO_SHM", "0", "KOLO_SHM is 0 on rank 3 but 1 on rank 0"},
           {"KOLO_CACHE_CAPACITY", "7",
            "KOLO_CACHE_CAPACITY is 7 on rank 3 but 1024 on rank 0"}}) {
    SCOPED_TRACE(variable);
    auto job = LaunchCommand(
        4, ThroughShell(absl::StrCat("[ $KOLO_RANK = 3 ] && export ", variable,
                                     "=", value, "; exec \"$0\" \"$@\""),
                        {"idle"}));
    ExpectStartupFailure(*job, {message, "kolorun: rank 3 (pid "},
                         "T18 differing setting");
    ExpectNothingLeft(*job);
  }
}

TEST_F(Reliability, T18_WrongStoreAddressIsNamed) {
  auto job = LaunchCommand(
      4, ThroughShell("[ $KOLO_RANK = 1 ] && export KOLO_RENDEZVOUS_PORT=1; "
                      "exec \"$0\" \"$@\"",
                      {"idle"}));
  ExpectStartupFailure(
      *job,
      {"rank 1: cannot reach the rendezvous store at 127.0.0.1:1",
       "do not name it", "kolorun: rank 1 (pid "},
      "T18 wrong store port");
  ExpectNothingLeft(*job);
}

// 18. Shutdown's timeout names the rank that never shut down.
TEST_F(Reliability, T18_ShutdownTimeoutNamesTheRankThatNeverShutDown) {
  auto job =
      Launch(4, {"shutdown", "--exit-rank", "2", "--shutdown-timeout", "2"},
             {"KOLO_OP_TIMEOUT=60"});
  const int code = job->Wait(30);
  EXPECT_NE(code, 0);
  // The coordinator's own timeout; each other rank's, or (when the
  // coordinator left first) its report of what the coordinator waited for.
  EXPECT_THAT(job->output(),
              HasSubstr("ERROR rank 0 code=DEADLINE_EXCEEDED msg=Shutdown "
                        "timed out after 2 s waiting for rank 2 (which never "
                        "called Shutdown)"));
  for (int r : {1, 3}) {
    EXPECT_THAT(job->output(),
                ::testing::ContainsRegex(absl::StrCat(
                    "ERROR rank ", r,
                    " code=DEADLINE_EXCEEDED msg=Shutdown (timed out after 2 s|"
                    "failed: the coordinator \\(rank 0\\) stopped) waiting "
                    "for rank 2 \\(which never called Shutdown\\)")))
        << job->output();
  }
  ExpectNothingLeft(*job);
}

// 13.6: a survivor's own error reaches the user before the teardown.
TEST_F(Reliability, SurvivorsReportBeforeTheTeardown) {
  auto job = Launch(4, {"report", "--exit-rank", "2", "--exit-code", "5"},
                    {"KOLO_OP_TIMEOUT=60"});
  const int code = job->Wait(30);
  EXPECT_EQ(code, 1) << job->output();
  EXPECT_THAT(job->output(), HasSubstr("kolorun: rank 2 (pid "));
  EXPECT_THAT(job->output(), HasSubstr("exited with code 5"));
  for (int r : {0, 1, 3}) {
    EXPECT_THAT(job->output(),
                HasSubstr(absl::StrCat("ERROR rank ", r, " code=UNAVAILABLE")));
    EXPECT_THAT(job->output(), HasSubstr("rank 2 lost"));
  }
  // Ranks ended by their own program's exit say nothing of an Abort().
  EXPECT_THAT(job->output(), ::testing::Not(HasSubstr("Abort() was called")));
  // The first failure is the one named first.
  EXPECT_LT(job->output().find("kolorun: rank 2"),
            job->output().find("kolorun: rank ",
                               job->output().find("kolorun: rank 2") + 1));
  ExpectNothingLeft(*job);
}

}  // namespace
}  // namespace testing
}  // namespace kolo

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s KOLORUN WORKER\n", argv[0]);
    return 2;
  }
  kolo::testing::g_kolorun = argv[1];
  kolo::testing::g_worker = argv[2];
  return RUN_ALL_TESTS();
}
