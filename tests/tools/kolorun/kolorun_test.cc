// Runs the real kolorun binary with small shell workers.
//
// Every wait is bounded by kHarnessDeadline (a hang fails the test instead of
// blocking it), and waits are for events — kolorun's output and exit, child
// exits — never sleeps.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/tools/kolorun/kolorun_harness.h"
#include "tools/kolorun/process.h"

namespace kolorun_testing {
namespace {

TEST_F(KolorunTest, EveryRankSaysHi) {
  const Result r = Run({"-np", "3", "--", "sh", "-c", "echo hi"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  std::multiset<std::string> lines;
  for (const std::string& line : Lines(r.out)) lines.insert(line);
  EXPECT_EQ(lines, (std::multiset<std::string>{"[0] hi", "[1] hi", "[2] hi"}))
      << r.out;
  EXPECT_EQ(r.err, "");
  EXPECT_TRUE(SecretDirEntries().empty());
}

TEST_F(KolorunTest, CommandStartsAtFirstPositionalArgument) {
  const Result r =
      Run({"-np", "1", "sh", "-c", "echo \"$0 $1\"", "-np", "--x"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[0] -np --x\n");
}

TEST_F(KolorunTest, ForwardsStderrAndPartialLines) {
  const Result r = Run(
      {"-np", "2", "--", "sh", "-c",
       "echo \"to stderr $KOLO_RANK\" >&2; printf 'a\\nb\\n\\nno newline'"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string p = absl::StrCat("[", rank, "] ");
    EXPECT_TRUE(
        absl::StrContains(r.err, absl::StrCat(p, "to stderr ", rank, "\n")))
        << r.err;
    EXPECT_TRUE(absl::StrContains(
        r.out, absl::StrCat(p, "a\n", p, "b\n", p, "\n", p, "no newline\n")))
        << r.out;
  }
  EXPECT_FALSE(absl::StrContains(r.out, "to stderr"));
}

// Note [Live output] in output.h, with real workers. Each worker waits on a
// fifo between steps: the test sees a step on kolorun's output while the
// worker that wrote it is still blocked, then lets it go on.
class LiveOutputTest : public KolorunTest {
 protected:
  void MakeFifos(int steps) {
    for (int step = 1; step < steps; ++step) {
      ASSERT_EQ(mkfifo(Fifo(step).c_str(), 0600), 0) << Fifo(step);
    }
  }
  std::string Fifo(int step) const {
    return absl::StrCat(scratch_, "/step", step);
  }
  // Unblocks a worker waiting in open(Fifo(step), O_RDONLY).
  void Release(int step) {
    const int fd = open(Fifo(step).c_str(), O_WRONLY);
    ASSERT_GE(fd, 0) << Fifo(step);
    close(fd);
  }
  // Runs `args`; each of `shown` must appear on stdout before the worker
  // is let past the following step.
  Result Stepped(const std::vector<std::string>& args,
                 const std::vector<std::string>& shown) {
    MakeFifos(static_cast<int>(shown.size()));
    Kolorun kolorun(args, Environment());
    for (size_t step = 1; step <= shown.size(); ++step) {
      EXPECT_TRUE(kolorun.WaitFor(1, shown[step - 1]))
          << "step " << step << " not shown while the worker waits; stdout:\n"
          << kolorun.Snapshot().out;
      if (step < shown.size()) Release(static_cast<int>(step));
    }
    return kolorun.Wait();
  }
};

TEST_F(LiveOutputTest, ShellProgressWithCarriageReturnsIsShownStepByStep) {
  const Result r =
      Stepped({"-np", "1", "sh", "-c",
               "printf '\\rstep 1/3'; cat \"$SCRATCH/step1\"; "
               "printf '\\rstep 2/3'; cat \"$SCRATCH/step2\"; "
               "printf '\\rstep 3/3\\n'"},
              {"[0] step 1/3\n", "[0] step 2/3\n", "[0] step 3/3\n"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  // Each version once, as its own line; nothing piled up, no '\r' passed on.
  EXPECT_EQ(r.out, "[0] step 1/3\n[0] step 2/3\n[0] step 3/3\n");
}

TEST_F(LiveOutputTest, PromptWithoutNewlineIsShownWhileTheWorkerWaits) {
  const Result r = Stepped({"-np", "2", "sh", "-c",
                            "if [ $KOLO_RANK = 0 ]; then printf 'continue? '; "
                            "cat \"$SCRATCH/step1\"; echo yes; fi"},
                           {"[0] continue? \n", "[0] yes\n"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[0] continue? \n[0] yes\n");
}

TEST_F(LiveOutputTest, PythonWorkerIsUnbufferedUnderKolorun) {
  const Result r = Stepped({"-np", "1", "/usr/bin/python3", "-c",
                            "import os\n"
                            "print('\\rpython step 1', end='')\n"
                            "open(os.environ['SCRATCH'] + '/step1').read()\n"
                            "print('\\rpython step 2')\n"},
                           {"[0] python step 1\n", "[0] python step 2\n"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[0] python step 1\n[0] python step 2\n");
}

TEST_F(LiveOutputTest, CxxWorkerWithUnbufferedStdout) {
  const std::string worker = Runfile("tests/tools/kolorun/progress_worker");
  const Result r = Stepped(
      {"-np", "1", worker, "unbuffered", "3"},
      {"[0] Train step 1/3\n", "[0] Train step 2/3\n", "[0] Train step 3/3\n"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out,
            "[0] Train step 1/3\n[0] Train step 2/3\n[0] Train step 3/3\n");
}

TEST_F(LiveOutputTest, CxxWorkerUnchangedUnderStdbuf) {
  const std::string worker = Runfile("tests/tools/kolorun/progress_worker");
  const Result r = Stepped({"-np", "1", "stdbuf", "-o0", worker, "plain", "2"},
                           {"[0] Train step 1/2\n", "[0] Train step 2/2\n"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "[0] Train step 1/2\n[0] Train step 2/2\n");
}

TEST_F(KolorunTest, LineInProgressIsKeptWhenTheWorkerIsKilled) {
  const Result r =
      Run({"-np", "2", "sh", "-c",
           "echo $$ > \"$SCRATCH/pid.$KOLO_RANK.tmp\"; "
           "mv \"$SCRATCH/pid.$KOLO_RANK.tmp\" \"$SCRATCH/pid.$KOLO_RANK\"; "
           "if [ $KOLO_RANK = 1 ]; then "
           "printf 'done\\n\\rlast words'; kill -KILL $$; fi; "
           "exec sleep 1000"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(absl::StrContains(r.out, "[1] done\n[1] last words\n")) << r.out;
  // Printed before kolorun says how the rank ended.
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("kolorun: rank 1 (pid ", PidFromFile("pid.1"),
                          ") was killed by signal SIGKILL\n")))
      << r.err;
}

TEST_F(KolorunTest, NoTagOutputPrintsLinesAsWritten) {
  const Result r = Run({"-np", "2", "--no-tag-output", "sh", "-c",
                        "echo out $KOLO_RANK; echo err $KOLO_RANK >&2"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  std::sort(lines.begin(), lines.end());
  EXPECT_EQ(lines, (std::vector<std::string>{"out 0", "out 1"})) << r.out;
  EXPECT_TRUE(absl::StrContains(r.err, "err 1\n")) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "[1]")) << r.err;
  // --tag-output (the default) after it wins.
  const Result tagged =
      Run({"-np", "1", "--no-tag-output", "--tag-output", "echo", "hi"});
  EXPECT_EQ(tagged.out, "[0] hi\n");
}

TEST_F(KolorunTest, OutputRanksShowsOnlyThoseRanksButLogsAll) {
  const std::string logs = scratch_ + "/logs";
  const Result r =
      Run({"-np", "4", "--output-ranks", "0,2-3", "--output-filename", logs,
           "sh", "-c", "echo out $KOLO_RANK; echo err $KOLO_RANK >&2"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (int rank : {0, 2, 3}) {
    EXPECT_TRUE(
        absl::StrContains(r.out, absl::StrCat("[", rank, "] out ", rank, "\n")))
        << r.out;
    EXPECT_TRUE(
        absl::StrContains(r.err, absl::StrCat("[", rank, "] err ", rank, "\n")))
        << r.err;
  }
  EXPECT_FALSE(absl::StrContains(r.out, "[1]")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.err, "[1]")) << r.err;
  EXPECT_EQ(ReadFile(logs + "/rank.1.log"), "out 1\nerr 1\n");
}

TEST_F(KolorunTest, HiddenRankThatFailsHasItsLastStderrShown) {
  const Result r = Run({"-np", "2", "--output-ranks", "0", "sh", "-c",
                        "if [ $KOLO_RANK = 1 ]; then echo noise; "
                        "echo 'reason it failed' >&2; exit 3; fi"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(absl::StrContains(
      r.err,
      "kolorun: the last 1 lines rank 1 wrote to stderr (--output-ranks "
      "hides its output):\n[1] reason it failed\n"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "kolorun: rank 1 (pid ")) << r.err;
  EXPECT_FALSE(absl::StrContains(r.out, "noise")) << r.out;
}

constexpr char kPrintEnvironment[] =
    "echo \"rank=$KOLO_RANK size=$KOLO_SIZE local=$KOLO_LOCAL_RANK/"
    "$KOLO_LOCAL_SIZE cross=$KOLO_CROSS_RANK/$KOLO_CROSS_SIZE "
    "addr=$KOLO_RENDEZVOUS_ADDR start=$KOLO_START_TIMEOUT omp=$OMP_NUM_THREADS "
    "secret=${KOLO_SECRET-unset} port=$KOLO_RENDEZVOUS_PORT\"";

// "port=N" from a worker's line; all ranks must agree.
int PortOf(const std::string& line) {
  int port = 0;
  const size_t at = line.find("port=");
  if (at == std::string::npos ||
      !absl::SimpleAtoi(line.substr(at + 5), &port)) {
    return -1;
  }
  return port;
}

TEST_F(KolorunTest, SetsTheJobEnvironmentOfEveryRank) {
  const Result r =
      Run({"-np", "3", "--start-timeout", "123", "sh", "-c", kPrintEnvironment},
          {"KOLO_SECRET=must-not-leak", "KOLO_RANK=77", "KOLO_SIZE=99"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 3u) << r.out;
  const int omp = std::max(1, Cpus() / 3);
  std::set<int> ports;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string prefix = absl::StrCat("[", rank, "] ");
    auto line = std::find_if(
        lines.begin(), lines.end(),
        [&](const std::string& l) { return absl::StartsWith(l, prefix); });
    ASSERT_NE(line, lines.end()) << r.out;
    EXPECT_TRUE(absl::StartsWith(
        *line, absl::StrCat(prefix, "rank=", rank, " size=3 local=", rank,
                            "/3 cross=0/1 addr=127.0.0.1 start=123 omp=", omp,
                            " secret=unset port=")))
        << *line;
    ports.insert(PortOf(*line));
  }
  ASSERT_EQ(ports.size(), 1u) << r.out;
  EXPECT_GT(*ports.begin(), 0);
  EXPECT_FALSE(absl::StrContains(r.out + r.err, "must-not-leak"));
}

TEST_F(KolorunTest, KeepsStartTimeoutAndOmpThreadsTheUserSet) {
  const Result r =
      Run({"-np", "2", "--start-timeout", "123", "sh", "-c", kPrintEnvironment},
          {"KOLO_START_TIMEOUT=9", "OMP_NUM_THREADS=7"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(CountOf(r.out, "start=9 omp=7 "), 2) << r.out;
}

// Each rank's CPUs as the kernel reports them, by rank.
std::map<int, std::string> CpusOfRanks(const std::string& out) {
  std::map<int, std::string> cpus;
  for (const std::string& line : Lines(out)) {
    int rank;
    std::vector<std::string> parts = absl::StrSplit(line, ' ');
    if (parts.size() == 3 && parts[1] == "cpus" &&
        absl::SimpleAtoi(
            absl::StripPrefix(absl::StripSuffix(parts[0], "]"), "["), &rank)) {
      cpus[rank] = parts[2];
    }
  }
  return cpus;
}

constexpr char kPrintCpus[] =
    "echo cpus $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' "
    "/proc/self/status)";

TEST_F(KolorunTest, BindsEachRankToItsShareOfTheCpus) {
  const std::vector<kolo::kolorun::Cpu> allowed = kolo::kolorun::AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  const std::string all =
      kolo::kolorun::FormatCpuList(kolo::kolorun::CpuIds(allowed));
  for (int np : {2, 3}) {
    const Result r = Run({"-np", absl::StrCat(np), "sh", "-c", kPrintCpus});
    ASSERT_EQ(r.exit_code(), 0) << r.err;
    const std::map<int, std::string> cpus = CpusOfRanks(r.out);
    ASSERT_EQ(cpus.size(), static_cast<size_t>(np)) << r.out;
    for (int rank = 0; rank < np; ++rank) {
      const std::vector<int> share = kolo::kolorun::CpuShare(allowed, rank, np);
      // More ranks than CPUs: nothing is bound.
      EXPECT_EQ(cpus.at(rank),
                share.empty() ? all : kolo::kolorun::FormatCpuList(share))
          << "rank " << rank << " of " << np << "\n"
          << r.out;
    }
  }
  const Result unbound =
      Run({"-np", "2", "--bind-to", "none", "sh", "-c", kPrintCpus});
  ASSERT_EQ(unbound.exit_code(), 0) << unbound.err;
  const std::map<int, std::string> cpus = CpusOfRanks(unbound.out);
  ASSERT_EQ(cpus.size(), 2u) << unbound.out;
  for (const auto& [rank, list] : cpus) EXPECT_EQ(list, all) << rank;
}

TEST_F(KolorunTest, SecretIsInAnInheritedMemoryFileAndNeverPrinted) {
  const Result r =
      Run({"--verbose", "-np", "2", "sh", "-c",
           "f=/proc/self/fd/$KOLO_SECRET_FD; s=$(cat \"$f\"); "
           "echo \"target=$(readlink \"$f\")\"; "
           "echo \"secret=$s\"; echo \"in_env=$(env | grep -c -F \"$s\")\"; "
           "echo \"port=$KOLO_RENDEZVOUS_PORT\""});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  // Note [Secret without a file]: nothing on disk at any time.
  EXPECT_EQ(CountOf(r.out, "target=/memfd:kolo-secret (deleted)\n"), 2)
      << r.out;
  EXPECT_EQ(CountOf(r.out, "in_env=0\n"), 2) << r.out;

  std::set<std::string> secrets;
  int port = -1;
  for (const std::string& line : Lines(r.out)) {
    const std::string body = line.substr(line.find("] ") + 2);
    if (absl::StartsWith(body, "secret=")) secrets.insert(body.substr(7));
    if (absl::StartsWith(body, "port=")) port = PortOf(body);
  }
  ASSERT_EQ(secrets.size(), 1u) << r.out;
  const std::string secret = *secrets.begin();
  EXPECT_EQ(secret.size(), 64u) << secret;
  EXPECT_FALSE(absl::StrContains(r.err, secret)) << "the secret is in the log";
  EXPECT_TRUE(SecretDirEntries().empty());

  // --verbose: the command, N, the placement and the port.
  EXPECT_TRUE(absl::StrContains(r.err, "starting 2 workers: sh -c ")) << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.err, "kolorun: host 0 localhost (local): ranks 0-1"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("rendezvous store on 127.0.0.1:", port, " (")))
      << r.err;
}

TEST_F(KolorunTest, EachRunHasAFreshSecret) {
  const std::vector<std::string> args = {"-np", "1", "sh", "-c",
                                         "cat /proc/self/fd/$KOLO_SECRET_FD"};
  const Result first = Run(args);
  const Result second = Run(args);
  ASSERT_EQ(first.exit_code(), 0) << first.err;
  ASSERT_EQ(second.exit_code(), 0) << second.err;
  EXPECT_NE(first.out, second.out);
}

// Ranks 0 and 2 sleep (rank 0 also in a background child); rank 1 exits 3
// once the others have written their pids.
// Whether kolorun's stderr names rank `rank` (`pid`) as having ended `how`.
bool Names(const std::string& err, int rank, pid_t pid,
           const std::string& how) {
  return absl::StrContains(err, absl::StrCat("kolorun: rank ", rank, " (pid ",
                                             pid, ") ", how, "\n"));
}

constexpr char kRankOneFails[] = R"(
echo $$ > "$SCRATCH/pid.$KOLO_RANK.tmp"; mv "$SCRATCH/pid.$KOLO_RANK.tmp" "$SCRATCH/pid.$KOLO_RANK"
case "$KOLO_RANK" in
1) while [ ! -e "$SCRATCH/pid.0" ] || [ ! -e "$SCRATCH/pid.2" ] || [ ! -e "$SCRATCH/child.0" ]; do sleep 0.02; done
   echo failing; exit 3 ;;
0) sleep 1000 & echo $! > "$SCRATCH/child.0.tmp"; mv "$SCRATCH/child.0.tmp" "$SCRATCH/child.0"; wait ;;
*) exec sleep 1000 ;;
esac
)";

TEST_F(KolorunTest, FailingRankIsNamedAndTheOthersAreTornDown) {
  const Result r =
      Run({"-np", "3", "--grace-period", "30", "sh", "-c", kRankOneFails});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(Names(r.err, 1, PidFromFile("pid.1"), "exited with code 3"))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "[1] failing\n")) << r.out;
  // SIGTERM was enough: nothing needed SIGKILL.
  EXPECT_FALSE(absl::StrContains(r.err, "SIGKILL")) << r.err;
  ExpectGone({"pid.0", "pid.1", "pid.2", "child.0"});
  EXPECT_TRUE(SecretDirEntries().empty());
}

// Ranks 1 and 2 ignore SIGTERM and fail on their own, one right after the
// other (either may be reaped first): both are named, the teardown's
// victim (rank 0) is not. Pid files appear whole.
constexpr char kTwoRanksFail[] = R"(
case $KOLO_RANK in
1) trap '' TERM; while [ ! -e "$SCRATCH/pid.2" ]; do sleep 0.02; done
   echo $$ > "$SCRATCH/pid.1.tmp"; mv "$SCRATCH/pid.1.tmp" "$SCRATCH/pid.1"; exit 3 ;;
2) trap '' TERM; echo $$ > "$SCRATCH/pid.2.tmp"; mv "$SCRATCH/pid.2.tmp" "$SCRATCH/pid.2"
   while [ ! -e "$SCRATCH/pid.1" ]; do sleep 0.02; done; exit 4 ;;
*) exec sleep 1000 ;;
esac
)";

TEST_F(KolorunTest, EveryRankThatFailsOnItsOwnIsNamed) {
  const Result r =
      Run({"-np", "3", "--grace-period", "30", "sh", "-c", kTwoRanksFail});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(Names(r.err, 1, PidFromFile("pid.1"), "exited with code 3"))
      << r.err;
  EXPECT_TRUE(Names(r.err, 2, PidFromFile("pid.2"), "exited with code 4"))
      << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "kolorun: rank 0")) << r.err;
}

TEST_F(KolorunTest, RankKilledBySignalIsNamedWithTheSignal) {
  const Result r =
      Run({"-np", "2", "sh", "-c",
           "echo $$ > \"$SCRATCH/pid.$KOLO_RANK.tmp\"; "
           "mv \"$SCRATCH/pid.$KOLO_RANK.tmp\" \"$SCRATCH/pid.$KOLO_RANK\"; "
           "if [ $KOLO_RANK = 1 ]; then kill -KILL $$; fi; exec sleep 1000"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(
      Names(r.err, 1, PidFromFile("pid.1"), "was killed by signal SIGKILL"))
      << r.err;
  // Rank 0 may not have written its pid (tmp file, then mv: never half
  // written) before the teardown killed it.
  if (access((scratch_ + "/pid.0").c_str(), F_OK) == 0) ExpectGone({"pid.0"});
}

TEST_F(KolorunTest, ExecFailureIsReported) {
  const Result r = Run({"-np", "2", "/nonexistent/kolo-no-such-program"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(absl::StrContains(r.err, "kolorun: rank 0 (pid ")) << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err,
      "cannot execute \"/nonexistent/kolo-no-such-program\": No such file"))
      << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "rank 1")) << r.err;
}

constexpr char kReadyThenSleep[] =
    "echo $$ > \"$SCRATCH/pid.$KOLO_RANK.tmp\"; "
    "mv \"$SCRATCH/pid.$KOLO_RANK.tmp\" \"$SCRATCH/pid.$KOLO_RANK\"; "
    "echo ready; exec sleep 1000";

class KolorunSignalTest : public KolorunTest,
                          public ::testing::WithParamInterface<int> {};

TEST_P(KolorunSignalTest, TearsDownAndExitsWith128PlusSignal) {
  const int signo = GetParam();
  Kolorun kolorun(
      {"-np", "3", "--grace-period", "30", "sh", "-c", kReadyThenSleep},
      Environment());
  ASSERT_TRUE(kolorun.WaitFor(1, "] ready\n", 3));
  ASSERT_EQ(kill(kolorun.pid(), signo), 0);
  const Result r = kolorun.Wait();
  EXPECT_EQ(r.exit_code(), 128 + signo) << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err, signo == SIGINT ? "received SIGINT" : "received SIGTERM"))
      << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "SIGKILL")) << r.err;
  ExpectGone({"pid.0", "pid.1", "pid.2"});
  EXPECT_TRUE(SecretDirEntries().empty());
}

INSTANTIATE_TEST_SUITE_P(IntAndTerm, KolorunSignalTest,
                         ::testing::Values(SIGINT, SIGTERM));

constexpr char kIgnoreTermThenSleep[] =
    "trap '' TERM; echo $$ > \"$SCRATCH/pid.$KOLO_RANK.tmp\"; "
    "mv \"$SCRATCH/pid.$KOLO_RANK.tmp\" \"$SCRATCH/pid.$KOLO_RANK\"; "
    "echo ready; exec sleep 1000";

TEST_F(KolorunTest, SigkillFollowsTheGracePeriod) {
  Kolorun kolorun(
      {"-np", "2", "--grace-period", "0.5", "sh", "-c", kIgnoreTermThenSleep},
      Environment());
  ASSERT_TRUE(kolorun.WaitFor(1, "] ready\n", 2));
  ASSERT_EQ(kill(kolorun.pid(), SIGINT), 0);
  const Result r = kolorun.Wait();
  EXPECT_EQ(r.exit_code(), 130) << r.err;
  EXPECT_EQ(CountOf(r.err, "is still running, sending SIGKILL"), 2) << r.err;
  ExpectGone({"pid.0", "pid.1"});
}

TEST_F(KolorunTest, SecondSignalSkipsTheGracePeriod) {
  Kolorun kolorun(
      {"-np", "2", "--grace-period", "1000", "sh", "-c", kIgnoreTermThenSleep},
      Environment());
  ASSERT_TRUE(kolorun.WaitFor(1, "] ready\n", 2));
  ASSERT_EQ(kill(kolorun.pid(), SIGINT), 0);
  ASSERT_TRUE(kolorun.WaitFor(2, "received SIGINT, terminating"));
  ASSERT_EQ(kill(kolorun.pid(), SIGINT), 0);
  const Result r = kolorun.Wait();
  EXPECT_EQ(r.exit_code(), 130) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "received SIGINT again")) << r.err;
  ExpectGone({"pid.0", "pid.1"});
}

TEST_F(KolorunTest, WorkersDieWhenKolorunIsKilled) {
  sigset_t chld, previous;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ASSERT_EQ(sigprocmask(SIG_BLOCK, &chld, &previous), 0);
  {
    Kolorun kolorun({"-np", "3", "sh", "-c", kReadyThenSleep}, Environment());
    ASSERT_TRUE(kolorun.WaitFor(1, "] ready\n", 3));
    ASSERT_EQ(kill(kolorun.pid(), SIGKILL), 0);
    const Result r = kolorun.Wait();
    EXPECT_TRUE(WIFSIGNALED(r.wait_status));
  }
  // The orphaned workers are re-parented to this process (a subreaper):
  // wait for their exits, event by event.
  std::set<pid_t> alive = {PidFromFile("pid.0"), PidFromFile("pid.1"),
                           PidFromFile("pid.2")};
  const absl::Time deadline = absl::Now() + kHarnessDeadline;
  while (!alive.empty() && absl::Now() < deadline) {
    for (auto it = alive.begin(); it != alive.end();) {
      it = waitpid(*it, nullptr, WNOHANG) == *it ? alive.erase(it)
                                                 : std::next(it);
    }
    if (alive.empty()) break;
    const struct timespec timeout = absl::ToTimespec(deadline - absl::Now());
    sigtimedwait(&chld, nullptr, &timeout);
  }
  sigprocmask(SIG_SETMASK, &previous, nullptr);
  EXPECT_TRUE(alive.empty()) << alive.size() << " workers outlived kolorun";
}

TEST_F(KolorunTest, LeftoverProcessesAreTerminated) {
  const Result r = Run({"-np", "2", "sh", "-c",
                        "sleep 1000 & echo $! > \"$SCRATCH/child.$KOLO_RANK\"; "
                        "echo done"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.err, "terminating processes the workers left"))
      << r.err;
  ExpectGone({"child.0", "child.1"});
}

TEST_F(KolorunTest, StartTimeoutNamesEveryMissingRank) {
  const Result r =
      Run({"-np", "3", "--start-timeout", "1", "sh", "-c", "exec sleep 1000"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(absl::StrContains(
      r.err,
      "kolorun: ranks [0, 1, 2] did not reach the rendezvous store within 1 "
      "s (start timeout)\n"))
      << r.err;
}

// The ranks that join run set_ready (a TCP connect and handshake): 5 s leaves
// room for a loaded 2-core machine.
TEST_F(KolorunTest, StartTimeoutNamesOnlyTheRanksThatDidNotJoin) {
  const Result r =
      Run({"-np", "4", "--start-timeout", "5", "sh", "-c",
           "case $KOLO_RANK in 2|3) ;; *) \"$SET_READY\" || exit 9 ;; "
           "esac; exec sleep 1000"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(absl::StrContains(
      r.err,
      "kolorun: ranks [2, 3] did not reach the rendezvous store within 5 s "
      "(start timeout); ranks [0, 1] were waiting for them\n"))
      << r.err;
}

TEST_F(KolorunTest, JobWhoseRanksJoinedOutlivesTheStartTimeout) {
  Kolorun kolorun({"--verbose", "-np", "2", "--start-timeout", "5", "sh", "-c",
                   "\"$SET_READY\" || exit 9; exec sleep 1000"},
                  Environment());
  // At the start timeout kolorun finds both keys and lets the job run.
  ASSERT_TRUE(kolorun.WaitFor(2, "all 2 ranks joined"));
  ASSERT_EQ(kill(kolorun.pid(), SIGTERM), 0);
  const Result r = kolorun.Wait();
  EXPECT_EQ(r.exit_code(), 143) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "did not reach")) << r.err;
}

TEST_F(KolorunTest, UsageErrorsExitTwoAndStartNothing) {
  const std::string touch = "touch \"$SCRATCH/started\"";
  const std::string bad_hostfile = scratch_ + "/bad_hostfile";
  std::ofstream(bad_hostfile) << "localhost slots=2\nnode2 slots=-1\n";
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"sh", "-c", touch},
      {"-np", "0", "sh", "-c", touch},
      {"-np", "two", "sh", "-c", touch},
      {"-np", "-1", "sh", "-c", touch},
      {"-np", "2"},
      {"-np", "2", "--"},
      {"-np", "2", "--bogus", "sh", "-c", touch},
      {"-np", "2", "--start-timeout", "soon", "sh", "-c", touch},
      {"-np", "2", "-H", "localhost:1,,x", "sh", "-c", touch},
      {"-np", "2", "-H", "localhost:x", "sh", "-c", touch},
      {"-np", "3", "-H", "localhost:2", "sh", "-c", touch},
      {"-np", "2", "-H", "localhost:1,127.0.0.1:1", "sh", "-c", touch},
      {"-np", "2", "--hostfile", bad_hostfile, "sh", "-c", touch},
      {"-np", "2", "--hostfile", scratch_ + "/none", "sh", "-c", touch},
      {"-np", "2", "--ssh-config", scratch_ + "/none", "sh", "-c", touch},
      {"-np", "2", "-i", scratch_ + "/none", "sh", "-c", touch},
      {"-np", "2", "--network-interface", "nosuchif0", "sh", "-c", touch},
      {"-np", "2", "-x", "2BAD", "sh", "-c", touch},
      {"-np", "2", "--log-level", "chatty", "sh", "-c", touch},
  };
  for (const auto& args : bad) {
    const Result r = Run(args);
    EXPECT_EQ(r.exit_code(), 2) << absl::StrJoin(args, " ") << "\n" << r.err;
    EXPECT_TRUE(absl::StartsWith(r.err, "kolorun: ")) << r.err;
    EXPECT_TRUE(absl::StrContains(r.err, "--help")) << r.err;
    EXPECT_EQ(r.out, "");
  }
  EXPECT_NE(access((scratch_ + "/started").c_str(), F_OK), 0);
  EXPECT_TRUE(SecretDirEntries().empty());
}

TEST_F(KolorunTest, HostfileThatIsADirectoryIsNamedSo) {
  const Result r = Run({"-np", "2", "--hostfile", scratch_, "true"});
  EXPECT_EQ(r.exit_code(), 2) << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("--hostfile ", scratch_, ": is a directory")))
      << r.err;
}

// More workers than this machine lets kolorun start (the descriptor limit
// alone refuses 100,000): refused before any starts.
TEST_F(KolorunTest, RefusesAJobTheMachineCannotStart) {
  const std::string touch = "touch \"$SCRATCH/started\"";
  const Result r = Run({"-np", "100000", "sh", "-c", touch});
  EXPECT_EQ(r.exit_code(), 2) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.err, "kolorun: -np 100000: ")) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "start fewer workers")) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NE(access((scratch_ + "/started").c_str(), F_OK), 0);
}

TEST_F(KolorunTest, HostfileWithThisMachineOnly) {
  const std::string hostfile = scratch_ + "/hostfile";
  std::ofstream(hostfile) << "# just here\nlocalhost slots=3  # all of it\n";
  const Result r =
      Run({"-np", "2", "--hostfile", hostfile, "sh", "-c", kPrintEnvironment});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(CountOf(r.out, "/2 cross=0/1 addr=127.0.0.1 "), 2) << r.out;
}

TEST_F(KolorunTest, OutputFilesAndTimestamps) {
  const std::string logs = scratch_ + "/logs";
  const Result r =
      Run({"-np", "2", "--output-filename", logs, "--prefix-timestamp", "sh",
           "-c", "echo out $KOLO_RANK; echo err $KOLO_RANK >&2"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    // Console: "<time> [rank] line"; the rank's file: "<time> line".
    EXPECT_TRUE(absl::StrContains(
        r.out, absl::StrCat("Z [", rank, "] out ", rank, "\n")))
        << r.out;
    EXPECT_TRUE(absl::StrContains(
        r.err, absl::StrCat("Z [", rank, "] err ", rank, "\n")))
        << r.err;
    const std::string log =
        ReadFile(absl::StrCat(logs, "/rank.", rank, ".log"));
    const std::vector<std::string> lines = Lines(log);
    ASSERT_EQ(lines.size(), 2u) << log;
    std::multiset<std::string> bodies;
    for (const std::string& line : lines) {
      ASSERT_GE(line.size(), 25u) << line;
      EXPECT_EQ(line[4], '-') << line;
      EXPECT_EQ(line[10], 'T') << line;
      EXPECT_EQ(line.substr(23, 2), "Z ") << line;
      bodies.insert(line.substr(25));
    }
    EXPECT_EQ(bodies, (std::multiset<std::string>{absl::StrCat("out ", rank),
                                                  absl::StrCat("err ", rank)}));
  }
  for (const std::string& line : Lines(r.out)) {
    EXPECT_EQ(line.substr(23, 2), "Z ") << line;
  }
}

TEST_F(KolorunTest, HelpListsTheOptions) {
  const Result r = Run({"--help"});
  EXPECT_EQ(r.exit_code(), 0);
  for (const char* option :
       {"-np N", "--num-proc", "--start-timeout", "--grace-period", "--verbose",
        "--help", "--tag-output", "--no-tag-output", "--output-ranks LIST",
        "setvbuf(stdout, NULL, _IONBF, 0)"}) {
    EXPECT_TRUE(absl::StrContains(r.out, option)) << option;
  }
}

}  // namespace
}  // namespace kolorun_testing
