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

extern char** environ;

namespace {

constexpr absl::Duration kHarnessDeadline = absl::Seconds(60);

std::string Runfile(const std::string& path) {
  const char* srcdir = getenv("TEST_SRCDIR");
  const char* workspace = getenv("TEST_WORKSPACE");
  if (srcdir && workspace)
    return absl::StrCat(srcdir, "/", workspace, "/", path);
  return path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  return lines;
}

bool ProcessExists(pid_t pid) { return kill(pid, 0) == 0 || errno != ESRCH; }

int CountOf(const std::string& haystack, const std::string& needle) {
  int count = 0;
  for (size_t pos = haystack.find(needle); pos != std::string::npos;
       pos = haystack.find(needle, pos + needle.size())) {
    ++count;
  }
  return count;
}

struct Result {
  int wait_status = -1;
  std::string out;
  std::string err;
  int exit_code() const {
    return WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  }
};

// One kolorun process with its stdout and stderr on pipes.
class Kolorun {
 public:
  Kolorun(const std::vector<std::string>& args,
          const std::vector<std::string>& env) {
    int out[2], err[2];
    EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
    std::vector<std::string> argv = {Runfile("tools/kolorun/kolorun")};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> c_argv, c_env;
    for (std::string& a : argv) c_argv.push_back(a.data());
    c_argv.push_back(nullptr);
    std::vector<std::string> env_copy = env;
    for (std::string& e : env_copy) c_env.push_back(e.data());
    c_env.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(c_argv[0], c_argv.data(), c_env.data());
      _exit(126);
    }
    close(out[1]);
    close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
    deadline_ = absl::Now() + kHarnessDeadline;
  }

  ~Kolorun() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_fd_ >= 0) close(out_fd_);
    if (err_fd_ >= 0) close(err_fd_);
  }

  pid_t pid() const { return pid_; }

  // Reads output until `stream` (1 = stdout, 2 = stderr) holds `count`
  // occurrences of `needle`. False at EOF or at the harness deadline.
  bool WaitFor(int stream, const std::string& needle, int count = 1) {
    for (;;) {
      const std::string& text = stream == 1 ? out_ : err_;
      if (CountOf(text, needle) >= count) return true;
      if (!ReadSome()) return false;
    }
  }

  // Reads both streams to EOF and reaps kolorun.
  Result Wait() {
    while (ReadSome()) {
    }
    Result result;
    if (out_fd_ >= 0 || err_fd_ >= 0) {
      ADD_FAILURE() << "kolorun did not exit within the harness deadline\n"
                    << "stdout:\n"
                    << out_ << "stderr:\n"
                    << err_;
      kill(pid_, SIGKILL);
    }
    waitpid(pid_, &result.wait_status, 0);
    reaped_ = true;
    result.out = out_;
    result.err = err_;
    return result;
  }

 private:
  // One poll round; false once both streams are at EOF or the deadline
  // passed.
  bool ReadSome() {
    struct pollfd fds[2];
    int* owners[2];
    std::string* sinks[2];
    nfds_t n = 0;
    if (out_fd_ >= 0) {
      fds[n] = {out_fd_, POLLIN, 0};
      owners[n] = &out_fd_;
      sinks[n++] = &out_;
    }
    if (err_fd_ >= 0) {
      fds[n] = {err_fd_, POLLIN, 0};
      owners[n] = &err_fd_;
      sinks[n++] = &err_;
    }
    if (n == 0) return false;
    const absl::Duration left = deadline_ - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    const int ready = poll(fds, n, absl::ToInt64Milliseconds(left) + 1);
    if (ready < 0 && errno == EINTR) return true;
    if (ready <= 0) return ready == 0 ? absl::Now() < deadline_ : false;
    for (nfds_t i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      char buffer[4096];
      const ssize_t got = read(fds[i].fd, buffer, sizeof(buffer));
      if (got > 0) {
        sinks[i]->append(buffer, got);
      } else if (got == 0 || errno != EINTR) {
        close(*owners[i]);
        *owners[i] = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  bool reaped_ = false;
  std::string out_;
  std::string err_;
  absl::Time deadline_;
};

class KolorunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Processes kolorun leaves behind (or orphans after kill -9) come back to
    // this process, so that the tests can see and reap them.
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    const char* tmp = getenv("TEST_TMPDIR");
    std::string templ =
        absl::StrCat(tmp ? tmp : "/tmp", "/kolorun_test.XXXXXX");
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    scratch_ = templ;
    secret_dir_ = scratch_ + "/tmp";
    ASSERT_EQ(mkdir(secret_dir_.c_str(), 0700), 0);
  }

  // The test's environment without KOLO_* and OMP_NUM_THREADS, with TMPDIR
  // (where the secret file goes), SCRATCH and SET_READY for the workers.
  std::vector<std::string> Environment(
      const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string entry = *e;
      if (absl::StartsWith(entry, "KOLO_") ||
          absl::StartsWith(entry, "OMP_NUM_THREADS=") ||
          absl::StartsWith(entry, "TMPDIR=")) {
        continue;
      }
      env.push_back(entry);
    }
    env.push_back("TMPDIR=" + secret_dir_);
    env.push_back("SCRATCH=" + scratch_);
    env.push_back("SET_READY=" + Runfile("tests/tools/kolorun/set_ready"));
    env.insert(env.end(), extra.begin(), extra.end());
    return env;
  }

  Result Run(const std::vector<std::string>& args,
             const std::vector<std::string>& extra_env = {}) {
    Kolorun kolorun(args, Environment(extra_env));
    return kolorun.Wait();
  }

  // Pid written by a worker into $SCRATCH/<name>.
  pid_t PidFromFile(const std::string& name) const {
    int pid = 0;
    const std::string text = ReadFile(scratch_ + "/" + name);
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &pid))
        << name << ": \"" << text << "\"";
    return pid;
  }

  void ExpectGone(const std::vector<std::string>& pid_files) const {
    for (const std::string& name : pid_files) {
      const pid_t pid = PidFromFile(name);
      ASSERT_GT(pid, 0) << name;
      EXPECT_FALSE(ProcessExists(pid))
          << name << ": pid " << pid << " is still alive";
    }
  }

  std::vector<std::string> SecretDirEntries() const {
    std::vector<std::string> names;
    DIR* dir = opendir(secret_dir_.c_str());
    if (!dir) return names;
    while (struct dirent* entry = readdir(dir)) {
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(dir);
    return names;
  }

  std::string scratch_;
  std::string secret_dir_;
};

int Cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
}

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

TEST_F(KolorunTest, SecretFileIsPrivateAndRemovedAndNeverPrinted) {
  const Result r =
      Run({"--verbose", "-np", "2", "sh", "-c",
           "f=\"$KOLO_SECRET_FILE\"; s=$(cat \"$f\"); "
           "echo \"mode=$(stat -c %a \"$f\") dir=$(dirname \"$f\")\"; "
           "echo \"secret=$s\"; echo \"in_env=$(env | grep -c -F \"$s\")\"; "
           "echo \"path=$f\"; echo \"port=$KOLO_RENDEZVOUS_PORT\""});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(CountOf(r.out, absl::StrCat("mode=600 dir=", secret_dir_, "\n")), 2)
      << r.out;
  EXPECT_EQ(CountOf(r.out, "in_env=0\n"), 2) << r.out;

  std::set<std::string> secrets, paths;
  int port = -1;
  for (const std::string& line : Lines(r.out)) {
    const std::string body = line.substr(line.find("] ") + 2);
    if (absl::StartsWith(body, "secret=")) secrets.insert(body.substr(7));
    if (absl::StartsWith(body, "path=")) paths.insert(body.substr(5));
    if (absl::StartsWith(body, "port=")) port = PortOf(body);
  }
  ASSERT_EQ(secrets.size(), 1u) << r.out;
  const std::string secret = *secrets.begin();
  EXPECT_EQ(secret.size(), 64u) << secret;
  EXPECT_FALSE(absl::StrContains(r.err, secret)) << "the secret is in the log";
  ASSERT_EQ(paths.size(), 1u) << r.out;
  struct stat st;
  EXPECT_NE(stat(paths.begin()->c_str(), &st), 0) << "secret file left behind";
  EXPECT_TRUE(SecretDirEntries().empty());

  // --verbose: the command, N and the port.
  EXPECT_TRUE(absl::StrContains(r.err, "starting 2 workers: sh -c ")) << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("rendezvous store on 127.0.0.1:", port, ",")))
      << r.err;
}

TEST_F(KolorunTest, EachRunHasAFreshSecret) {
  const std::vector<std::string> args = {"-np", "1", "sh", "-c",
                                         "cat \"$KOLO_SECRET_FILE\""};
  const Result first = Run(args);
  const Result second = Run(args);
  ASSERT_EQ(first.exit_code(), 0) << first.err;
  ASSERT_EQ(second.exit_code(), 0) << second.err;
  EXPECT_NE(first.out, second.out);
}

// Ranks 0 and 2 sleep (rank 0 also in a background child); rank 1 exits 3
// once the others have written their pids.
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
  const pid_t failed = PidFromFile("pid.1");
  EXPECT_TRUE(absl::StrContains(
      r.err,
      absl::StrCat("kolorun: rank 1 (pid ", failed, ") exited with code 3\n")))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "[1] failing\n")) << r.out;
  // SIGTERM was enough: nothing needed SIGKILL.
  EXPECT_FALSE(absl::StrContains(r.err, "SIGKILL")) << r.err;
  ExpectGone({"pid.0", "pid.1", "pid.2", "child.0"});
  EXPECT_TRUE(SecretDirEntries().empty());
}

TEST_F(KolorunTest, RankKilledBySignalIsNamedWithTheSignal) {
  const Result r =
      Run({"-np", "2", "sh", "-c",
           "echo $$ > \"$SCRATCH/pid.$KOLO_RANK\"; "
           "if [ $KOLO_RANK = 1 ]; then kill -KILL $$; fi; exec sleep 1000"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("kolorun: rank 1 (pid ", PidFromFile("pid.1"),
                          ") was killed by signal SIGKILL\n")))
      << r.err;
  // Rank 0 may not have written its pid before the teardown killed it.
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
      "kolorun: ranks [0, 1, 2] did not join within 1 s (start timeout)\n"))
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
      r.err, "kolorun: ranks [2, 3] did not join within 5 s (start timeout)\n"))
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
  EXPECT_FALSE(absl::StrContains(r.err, "did not join")) << r.err;
}

TEST_F(KolorunTest, UsageErrorsExitTwoAndStartNothing) {
  const std::string touch = "touch \"$SCRATCH/started\"";
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

TEST_F(KolorunTest, HelpListsTheOptions) {
  const Result r = Run({"--help"});
  EXPECT_EQ(r.exit_code(), 0);
  for (const char* option : {"-np N", "--num-proc", "--start-timeout",
                             "--grace-period", "--verbose", "--help"}) {
    EXPECT_TRUE(absl::StrContains(r.out, option)) << option;
  }
}

}  // namespace
