// kolorun with remote ranks, through fake_ssh.sh (a stand-in for ssh that
// runs the remote command on this machine in a clean environment, as sshd
// would). Remote hosts are TEST-NET-3 addresses (203.0.113.x), numeric so
// never looked up, and never contacted: fake ssh connects nowhere and
// --network-interface lo keeps the store on loopback. The real thing, with
// sshd in network namespaces, is tests/multihost.
//
// Every wait is for an event (output, an exit, a pidfd) with the harness
// deadline.
#include <poll.h>
#include <sys/syscall.h>

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "runtime/api/config.h"
#include "runtime/net/hosts.h"
#include "tests/tools/kolorun/kolorun_harness.h"
#include "tools/kolorun/process.h"

namespace kolorun_testing {
namespace {

using ::kolo::IsLocalAddress;

class KolorunRemoteTest : public KolorunTest {
 protected:
  void SetUp() override {
    KolorunTest::SetUp();
    for (const char* host : {"203.0.113.1", "203.0.113.2"}) {
      ASSERT_FALSE(IsLocalAddress(host))
          << host << " is an address of this machine: these tests need it "
          << "to be remote";
    }
    const std::string bin = scratch_ + "/bin";
    ASSERT_EQ(mkdir(bin.c_str(), 0755), 0);
    ASSERT_EQ(symlink(Runfile("tests/tools/kolorun/fake_ssh.sh").c_str(),
                      (bin + "/ssh").c_str()),
              0);
    const char* path = getenv("PATH");
    path_ = bin + ":" + (path ? path : "/usr/bin:/bin");
    ssh_config_ = scratch_ + "/ssh_config";
    identity_ = scratch_ + "/id_test";
    for (const std::string& file : {ssh_config_, identity_}) {
      std::ofstream(file) << "# test\n";
    }
  }

  // The environment with fake ssh first in PATH and its argument log.
  std::vector<std::string> RemoteEnvironment(
      std::vector<std::string> extra = {}) const {
    extra.push_back("PATH=" + path_);
    extra.push_back("FAKE_SSH_LOG=" + scratch_ + "/ssh-args");
    return Environment(extra);
  }

  Result RunRemote(const std::vector<std::string>& args,
                   const std::vector<std::string>& extra_env = {}) {
    Kolorun kolorun(args, RemoteEnvironment(extra_env));
    return kolorun.Wait();
  }

  // The argument lists fake ssh was started with, one per invocation.
  std::vector<std::vector<std::string>> SshInvocations() const {
    std::vector<std::vector<std::string>> calls;
    DIR* dir = opendir(scratch_.c_str());
    while (struct dirent* entry = dir ? readdir(dir) : nullptr) {
      if (absl::StartsWith(entry->d_name, "ssh-args.")) {
        calls.push_back(absl::StrSplit(ReadFile(scratch_ + "/" + entry->d_name),
                                       '\n', absl::SkipEmpty()));
      }
    }
    if (dir) closedir(dir);
    return calls;
  }

  // The value after "key=" in `line`, up to the next space.
  static std::string Field(const std::string& line, const std::string& key) {
    const size_t at = line.find(" " + key + "=");
    if (at == std::string::npos) return "<missing>";
    const size_t start = at + key.size() + 2;
    return line.substr(start, line.find(' ', start) - start);
  }

  std::string path_;
  std::string ssh_config_;
  std::string identity_;
};

constexpr char kReport[] =
    "echo \"[ rank=$KOLO_RANK local=$KOLO_LOCAL_RANK/$KOLO_LOCAL_SIZE "
    "cross=$KOLO_CROSS_RANK/$KOLO_CROSS_SIZE addr=$KOLO_RENDEZVOUS_ADDR "
    "iface=${KOLO_IFACE-unset} level=${KOLO_LOG_LEVEL-unset} "
    "start=$KOLO_START_TIMEOUT foo=${FOO-unset} keep=${KEEP-unset} "
    "other=${OTHER-unset} user=${USER-unset} omp=$OMP_NUM_THREADS "
    "pwd=$(pwd) target=$(readlink /proc/self/fd/$KOLO_SECRET_FD | tr ' ' _) "
    "secret=$(cat /proc/self/fd/$KOLO_SECRET_FD) "
    "env_secret=${KOLO_SECRET-unset} env_file=${KOLO_SECRET_FILE-unset} ]\"";

TEST_F(KolorunRemoteTest, RemoteRanksGetPlacementAndTheForwardedEnvironment) {
  const Result r = RunRemote(
      {"-np",
       "4",
       "-H",
       "203.0.113.1:2,203.0.113.2:2",
       "--network-interface",
       "lo",
       "--ssh-config",
       ssh_config_,
       "-p",
       "2222",
       "-i",
       identity_,
       "--log-level",
       "debug",
       "--start-timeout",
       "30",
       "-x",
       "FOO=bar",
       "-x",
       "KEEP",
       "-x",
       "TMPDIR=" + secret_dir_,
       "sh",
       "-c",
       kReport},
      {"KEEP=kept", "OTHER=not forwarded", "KOLO_SECRET=not-for-workers"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 4u) << r.out;
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  std::set<std::string> secrets;
  for (const std::string& line : lines) {
    int rank = -1;
    ASSERT_TRUE(absl::SimpleAtoi(Field(line, "rank"), &rank)) << line;
    EXPECT_TRUE(absl::StartsWith(line, absl::StrCat("[", rank, "] "))) << line;
    EXPECT_EQ(Field(line, "local"), absl::StrCat(rank % 2, "/2")) << line;
    EXPECT_EQ(Field(line, "cross"), absl::StrCat(rank / 2, "/2")) << line;
    EXPECT_EQ(Field(line, "addr"), "127.0.0.1") << line;
    EXPECT_EQ(Field(line, "iface"), "lo") << line;
    EXPECT_EQ(Field(line, "level"), "debug") << line;
    EXPECT_EQ(Field(line, "start"), "30") << line;
    EXPECT_EQ(Field(line, "foo"), "bar") << line;
    EXPECT_EQ(Field(line, "keep"), "kept") << line;
    // The rest comes from the (fake) login environment, not from kolorun.
    EXPECT_EQ(Field(line, "other"), "unset") << line;
    EXPECT_EQ(Field(line, "user"), "fake") << line;
    EXPECT_EQ(Field(line, "omp"), absl::StrCat(std::max(1, Cpus() / 2)))
        << line;
    EXPECT_EQ(Field(line, "pwd"), cwd) << line;
    // Each guard puts the secret in a memory file of its own (Note [Secret
    // without a file]): nothing on the remote host's disk either.
    EXPECT_EQ(Field(line, "target"), "/memfd:kolo-secret_(deleted)") << line;
    EXPECT_EQ(Field(line, "env_secret"), "unset") << line;
    EXPECT_EQ(Field(line, "env_file"), "unset") << line;
    secrets.insert(Field(line, "secret"));
  }
  ASSERT_EQ(secrets.size(), 1u) << r.out;
  const std::string secret = *secrets.begin();
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_TRUE(SecretDirEntries().empty()) << "secret files on disk";

  const auto calls = SshInvocations();
  ASSERT_EQ(calls.size(), 4u);
  std::multiset<std::string> hosts;
  for (const std::vector<std::string>& argv : calls) {
    const std::string joined = absl::StrJoin(argv, " ");
    EXPECT_TRUE(absl::StrContains(
        joined,
        absl::StrCat("-o BatchMode=yes -F ", ssh_config_, " -p 2222 -i ",
                     identity_, " -o ConnectTimeout=30 -T 203.0.113.")))
        << joined;
    EXPECT_TRUE(absl::StartsWith(argv.back(), "exec ")) << joined;
    EXPECT_TRUE(absl::StrContains(argv.back(), "/kolo_rank_guard --rank "))
        << joined;
    EXPECT_FALSE(absl::StrContains(joined, secret)) << "secret in ssh argv";
    EXPECT_FALSE(absl::StrContains(joined, "StrictHostKeyChecking")) << joined;
    hosts.insert(argv[argv.size() - 2]);
  }
  EXPECT_EQ(hosts, (std::multiset<std::string>{"203.0.113.1", "203.0.113.1",
                                               "203.0.113.2", "203.0.113.2"}));
}

TEST_F(KolorunRemoteTest, LocalHostRanksStartWithoutSsh) {
  const Result r =
      RunRemote({"-np", "3", "-H", "localhost:1,203.0.113.1:2",
                 "--network-interface", "lo", "sh", "-c", kReport});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(SshInvocations().size(), 2u);
  for (const std::string& line : Lines(r.out)) {
    const bool local = absl::StartsWith(line, "[0] ");
    // Local ranks inherit kolorun's environment (USER, OTHER); remote ones
    // the login environment.
    EXPECT_EQ(Field(line, "user") == "fake", !local) << line;
    EXPECT_EQ(Field(line, "cross"), local ? "0/2" : "1/2") << line;
  }
}

// The guard binds each remote rank to its share of its host's CPUs (Note
// [Binding]); --bind-to none reaches it too.
TEST_F(KolorunRemoteTest, GuardBindsRemoteRanksToTheirShare) {
  const std::vector<kolo::kolorun::Cpu> allowed = kolo::kolorun::AllowedCpus();
  ASSERT_FALSE(allowed.empty());
  constexpr char kPrint[] =
      "echo \"[ rank=$KOLO_RANK local=$KOLO_LOCAL_RANK cpus=$(sed -n "
      "'s/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status) ]\"";
  for (const bool bind : {true, false}) {
    const Result r = RunRemote({"-np", "4", "-H", "203.0.113.1:2,203.0.113.2:2",
                                "--network-interface", "lo", "--bind-to",
                                bind ? "core" : "none", "sh", "-c", kPrint});
    ASSERT_EQ(r.exit_code(), 0) << r.err;
    int seen = 0;
    for (const std::string& line : Lines(r.out)) {
      int local = -1;
      if (!absl::SimpleAtoi(Field(line, "local"), &local)) continue;
      ++seen;
      const std::vector<int> share = kolo::kolorun::CpuShare(allowed, local, 2);
      EXPECT_EQ(
          Field(line, "cpus"),
          kolo::kolorun::FormatCpuList(
              bind && !share.empty() ? share : kolo::kolorun::CpuIds(allowed)))
          << line;
    }
    EXPECT_EQ(seen, 4) << r.out;
  }
}

// Ranks write their pids; rank 2 fails once every other pid is there.
constexpr char kRankTwoFails[] = R"(
echo $$ > "$SCRATCH/pid.$KOLO_RANK.tmp"; mv "$SCRATCH/pid.$KOLO_RANK.tmp" "$SCRATCH/pid.$KOLO_RANK"
if [ "$KOLO_RANK" = 2 ]; then
  while [ ! -e "$SCRATCH/pid.0" ] || [ ! -e "$SCRATCH/pid.1" ]; do sleep 0.02; done
  echo failing; exit 3
fi
exec sleep 1000
)";

TEST_F(KolorunRemoteTest, RemoteFailureNamesHostRankAndStatus) {
  const Result r = RunRemote({"-np", "3", "-H", "203.0.113.1:1,203.0.113.2:2",
                              "--network-interface", "lo", "--grace-period",
                              "30", "-x", "SCRATCH", "sh", "-c", kRankTwoFails},
                             {"SCRATCH=" + scratch_});
  EXPECT_EQ(r.exit_code(), 1) << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err, absl::StrCat("kolorun: rank 2 on 203.0.113.2 (pid ",
                          PidFromFile("pid.2"), ") exited with code 3\n")))
      << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "[2] failing\n")) << r.out;
  // The guards' status lines are kolorun's, not output.
  EXPECT_FALSE(absl::StrContains(r.out + r.err, "kolo_rank_guard[")) << r.err;
  // Closing the guards' standard input was enough: no SIGKILL.
  EXPECT_FALSE(absl::StrContains(r.err, "SIGKILL")) << r.err;
  ExpectGone({"pid.0", "pid.1", "pid.2"});
}

TEST_F(KolorunRemoteTest, RemoteRankKilledBySignalIsNamed) {
  const Result r = RunRemote(
      {"-np", "2", "-H", "203.0.113.1:2", "--network-interface", "lo", "-x",
       "SCRATCH", "sh", "-c",
       "echo $$ > \"$SCRATCH/pid.$KOLO_RANK.tmp\"; "
       "mv \"$SCRATCH/pid.$KOLO_RANK.tmp\" \"$SCRATCH/pid.$KOLO_RANK\"; "
       "if [ $KOLO_RANK = 1 ]; then kill -KILL $$; fi; exec sleep 1000"},
      {"SCRATCH=" + scratch_});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(absl::StrContains(
      r.err,
      absl::StrCat("kolorun: rank 1 on 203.0.113.1 (pid ", PidFromFile("pid.1"),
                   ") was killed by signal SIGKILL\n")))
      << r.err;
}

TEST_F(KolorunRemoteTest, SshFailureIsNamed) {
  const Result r =
      RunRemote({"-np", "3", "-H", "203.0.113.1:1,203.0.113.2:2",
                 "--network-interface", "lo", "sh", "-c", "exec sleep 1000"},
                {"FAKE_SSH_FAIL=203.0.113.2"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(absl::StrContains(
      r.err,
      "] ssh: connect to host 203.0.113.2 port 22: Connection refused\n"))
      << r.err;
  EXPECT_TRUE(
      absl::StrContains(r.err, "on 203.0.113.2: ssh to 203.0.113.2 (pid "))
      << r.err;
  EXPECT_TRUE(absl::StrContains(
      r.err, ") failed with exit status 255; see its message above\n"))
      << r.err;
}

TEST_F(KolorunRemoteTest, StartTimeoutNamesRemoteRanksWithTheirHosts) {
  const Result r = RunRemote({"-np", "2", "-H", "localhost:1,203.0.113.1:1",
                              "--network-interface", "lo", "--start-timeout",
                              "1", "sh", "-c", "exec sleep 1000"});
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_TRUE(absl::StrContains(
      r.err,
      "kolorun: ranks [0 on localhost, 1 on 203.0.113.1] did not reach the "
      "rendezvous store within 1 s (start timeout)\n"))
      << r.err;
}

constexpr char kReadyIgnoringTerm[] =
    "trap '' TERM; echo $$ > \"$SCRATCH/pid.$KOLO_RANK.tmp\"; "
    "mv \"$SCRATCH/pid.$KOLO_RANK.tmp\" \"$SCRATCH/pid.$KOLO_RANK\"; "
    "cat /proc/self/fd/$KOLO_SECRET_FD; echo; echo ready; exec sleep 1000";

TEST_F(KolorunRemoteTest, SigintEndsRemoteRanksAfterTheGracePeriod) {
  Kolorun kolorun({"-np", "2", "-H", "203.0.113.1:2", "--network-interface",
                   "lo", "--grace-period", "0.5", "-x", "SCRATCH", "sh", "-c",
                   kReadyIgnoringTerm},
                  RemoteEnvironment({"SCRATCH=" + scratch_}));
  ASSERT_TRUE(kolorun.WaitFor(1, "] ready\n", 2));
  ASSERT_EQ(kill(kolorun.pid(), SIGINT), 0);
  const Result r = kolorun.Wait();
  EXPECT_EQ(r.exit_code(), 130) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "received SIGINT")) << r.err;
  ExpectGone({"pid.0", "pid.1"});
}

TEST_F(KolorunRemoteTest, SecretIsOnNoCommandLine) {
  Kolorun kolorun(
      {"-np", "2", "-H", "localhost:1,203.0.113.1:1", "--network-interface",
       "lo", "--grace-period", "0.5", "-x", "SCRATCH", "-x",
       "TMPDIR=" + secret_dir_, "sh", "-c", kReadyIgnoringTerm},
      RemoteEnvironment({"SCRATCH=" + scratch_}));
  ASSERT_TRUE(kolorun.WaitFor(1, "] ready\n", 2));
  const Result partial = kolorun.Snapshot();
  std::string secret;
  for (const std::string& line : Lines(partial.out)) {
    const std::string body = line.substr(line.find("] ") + 2);
    if (body.size() == 64) secret = body;
  }
  ASSERT_EQ(secret.size(), 64u) << partial.out;
  std::vector<std::string> leaks;
  DIR* proc = opendir("/proc");
  ASSERT_NE(proc, nullptr);
  while (struct dirent* entry = readdir(proc)) {
    int pid;
    if (!absl::SimpleAtoi(entry->d_name, &pid)) continue;
    std::string cmdline =
        ReadFile(absl::StrCat("/proc/", entry->d_name, "/cmdline"));
    if (absl::StrContains(cmdline, secret)) leaks.push_back(entry->d_name);
  }
  closedir(proc);
  EXPECT_TRUE(leaks.empty())
      << "the secret is in the argv of pids " << absl::StrJoin(leaks, ", ");
  ASSERT_EQ(kill(kolorun.pid(), SIGTERM), 0);
  const Result r = kolorun.Wait();
  EXPECT_EQ(r.exit_code(), 143) << r.err;
  ExpectGone({"pid.0", "pid.1"});
  EXPECT_TRUE(SecretDirEntries().empty());
}

// Waits for `pids` to exit (pidfd: they need not be our children).
// Returns those still alive at `deadline`.
std::set<pid_t> WaitForExit(std::set<pid_t> pids, absl::Time deadline) {
  std::vector<struct pollfd> fds;
  std::vector<pid_t> owners;
  for (pid_t pid : pids) {
    const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    if (fd < 0) continue;  // Gone already.
    fds.push_back({fd, POLLIN, 0});
    owners.push_back(pid);
  }
  std::set<pid_t> alive(owners.begin(), owners.end());
  while (!alive.empty() && absl::Now() < deadline) {
    const int ms =
        static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()) + 1);
    if (poll(fds.data(), fds.size(), ms) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents) {
        alive.erase(owners[i]);
        fds[i].fd = -fds[i].fd - 1;  // Ignored from now on.
      }
    }
  }
  for (const struct pollfd& p : fds) close(p.fd >= 0 ? p.fd : -p.fd - 1);
  return alive;
}

TEST_F(KolorunRemoteTest, KillingKolorunEndsRemoteRanks) {
  std::set<pid_t> workers;
  absl::Time killed;
  {
    Kolorun kolorun({"-np", "3", "-H", "localhost:1,203.0.113.1:2",
                     "--network-interface", "lo", "-x", "SCRATCH", "sh", "-c",
                     "echo $$ > \"$SCRATCH/pid.$KOLO_RANK.tmp\"; "
                     "mv \"$SCRATCH/pid.$KOLO_RANK.tmp\" "
                     "\"$SCRATCH/pid.$KOLO_RANK\"; echo ready; "
                     "exec sleep 1000"},
                    RemoteEnvironment({"SCRATCH=" + scratch_}));
    ASSERT_TRUE(kolorun.WaitFor(1, "] ready\n", 3));
    workers = {PidFromFile("pid.0"), PidFromFile("pid.1"),
               PidFromFile("pid.2")};
    killed = absl::Now();
    ASSERT_EQ(kill(kolorun.pid(), SIGKILL), 0);
    kolorun.Wait();
  }
  // The killed ranks come back to this process (a subreaper) as zombies once
  // their parents are gone: pidfds see them exit either way.
  const std::set<pid_t> alive =
      WaitForExit(workers, absl::Now() + kHarnessDeadline);
  const absl::Duration took = absl::Now() - killed;
  EXPECT_TRUE(alive.empty()) << alive.size() << " workers outlived kolorun";
  EXPECT_LT(took, absl::Seconds(5)) << "RELIABILITY.md: within 5 s";
  // Reap what came back to this process (killed ranks, orphaned guards).
  while (waitpid(-1, nullptr, WNOHANG) > 0) {
  }
}

TEST(RankGuardTest, RefusesInputThatIsNotKolorunsRequest) {
  int in[2], err[2];
  ASSERT_EQ(pipe(in), 0);
  ASSERT_EQ(pipe(err), 0);
  const std::string guard = Runfile("tools/kolorun/kolo_rank_guard");
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(err[1], 2);
    close(in[1]);
    close(err[0]);
    execl(guard.c_str(), guard.c_str(), "--rank", "0", "--", "true",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(in[0]);
  close(err[1]);
  const std::string garbage = "this is not a request from kolorun\n";
  ASSERT_EQ(write(in[1], garbage.data(), garbage.size()),
            static_cast<ssize_t>(garbage.size()));
  close(in[1]);
  std::string message;
  char buffer[512];
  for (ssize_t n; (n = read(err[0], buffer, sizeof(buffer))) > 0;) {
    message.append(buffer, n);
  }
  close(err[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 125) << message;
  EXPECT_TRUE(absl::StrContains(message, "kolo_rank_guard: rank 0 on "))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "malformed request")) << message;
}

}  // namespace
}  // namespace kolorun_testing
