// Unit tests of the launcher's pieces that need no running job.
#include "tools/kolorun/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/os/unique_fd.h"
#include "tools/kolorun/args.h"
#include "tools/kolorun/job.h"
#include "tools/kolorun/output.h"
#include "tools/kolorun/process.h"
#include "tools/kolorun/secret_fd.h"

namespace kolo {
namespace kolorun {
namespace {

bool Has(const std::vector<std::string>& env, const std::string& entry) {
  return std::find(env.begin(), env.end(), entry) != env.end();
}

int CountName(const std::vector<std::string>& env, const std::string& name) {
  return std::count_if(env.begin(), env.end(), [&](const std::string& e) {
    return absl::StartsWith(e, name + "=");
  });
}

// Rank `rank` of `size`, `local_size` per host.
RankEndpoint Endpoint(int rank, int local_size, int hosts, int port,
                      int secret_fd) {
  RankEndpoint e;
  e.placement.rank = rank;
  e.placement.local_rank = rank % local_size;
  e.placement.local_size = local_size;
  e.placement.cross_rank = rank / local_size;
  e.placement.cross_size = hosts;
  e.store_addr = hosts > 1 ? "10.0.0.1" : "127.0.0.1";
  e.store_port = port;
  e.secret_fd = secret_fd;
  e.torch_master_addr = e.store_addr;
  e.torch_master_port = 29500;
  return e;
}

TEST(WorkerEnvironmentTest, SetsEveryJobVariable) {
  LaunchOptions options;
  options.num_proc = 4;
  options.start_timeout = absl::Milliseconds(2500);
  const std::vector<std::string> env = WorkerEnvironment(
      {"PATH=/bin", "HOME=/root"}, options, Endpoint(2, 4, 1, 4242, 7), 16);
  for (const char* entry :
       {"PATH=/bin", "HOME=/root", "KOLO_RANK=2", "KOLO_SIZE=4",
        "KOLO_LOCAL_RANK=2", "KOLO_LOCAL_SIZE=4", "KOLO_CROSS_RANK=0",
        "KOLO_CROSS_SIZE=1", "KOLO_RENDEZVOUS_ADDR=127.0.0.1",
        "KOLO_RENDEZVOUS_PORT=4242", "KOLO_SECRET_FD=7",
        "KOLO_LAUNCHER=kolorun", "KOLO_START_TIMEOUT=2.5", "OMP_NUM_THREADS=4",
        // As horovodrun exports them.
        "HOROVOD_RANK=2", "HOROVOD_SIZE=4", "HOROVOD_LOCAL_RANK=2",
        "HOROVOD_LOCAL_SIZE=4", "HOROVOD_CROSS_RANK=0", "HOROVOD_CROSS_SIZE=1",
        "PYTHONUNBUFFERED=1",
        // As torchrun exports them (Note [torch.distributed's variables]).
        "RANK=2", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=4",
        "GROUP_RANK=0", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500"}) {
    EXPECT_TRUE(Has(env, entry)) << entry;
  }
  EXPECT_EQ(env.size(), 28u);
}

TEST(WorkerEnvironmentTest, PlacementOnSeveralHosts) {
  LaunchOptions options;
  options.num_proc = 6;
  options.network_interface = "eth1";
  options.log_level = "debug";
  // Rank 5 of 6, 3 per host: host 1 of 2, local rank 2 of 3.
  const std::vector<std::string> env =
      WorkerEnvironment({}, options, Endpoint(5, 3, 2, 7, 3), 12);
  for (const char* entry :
       {"KOLO_RANK=5", "KOLO_SIZE=6", "KOLO_LOCAL_RANK=2", "KOLO_LOCAL_SIZE=3",
        "KOLO_CROSS_RANK=1", "KOLO_CROSS_SIZE=2",
        "KOLO_RENDEZVOUS_ADDR=10.0.0.1", "KOLO_IFACE=eth1",
        "KOLO_LOG_LEVEL=debug", "HOROVOD_RANK=5", "HOROVOD_LOCAL_RANK=2",
        "HOROVOD_LOCAL_SIZE=3", "HOROVOD_CROSS_RANK=1", "HOROVOD_CROSS_SIZE=2",
        "OMP_NUM_THREADS=4"}) {  // 12 CPUs / 3 workers on this host.
    EXPECT_TRUE(Has(env, entry)) << entry;
  }
}

TEST(WorkerEnvironmentTest, ReplacesInheritedJobVariablesAndDropsTheSecret) {
  LaunchOptions options;
  options.num_proc = 2;
  const std::vector<std::string> env = WorkerEnvironment(
      {"KOLO_RANK=9", "KOLO_SECRET=abc", "KOLO_SECRET_FILE=/elsewhere",
       "KOLO_SECRET_FD=99", "KOLO_RENDEZVOUS_PORT=1", "KOLO_OP_TIMEOUT=30",
       "HOROVOD_RANK=7"},
      options, Endpoint(1, 2, 1, 5000, 4), 1);
  EXPECT_EQ(CountName(env, "KOLO_SECRET"), 0);
  EXPECT_EQ(CountName(env, "KOLO_SECRET_FILE"), 0);
  EXPECT_EQ(CountName(env, "KOLO_SECRET_FD"), 1);
  EXPECT_TRUE(Has(env, "KOLO_SECRET_FD=4"));
  EXPECT_EQ(CountName(env, "HOROVOD_RANK"), 1);
  EXPECT_TRUE(Has(env, "HOROVOD_RANK=1"));
  EXPECT_EQ(CountName(env, "KOLO_RANK"), 1);
  EXPECT_TRUE(Has(env, "KOLO_RANK=1"));
  EXPECT_TRUE(Has(env, "KOLO_RENDEZVOUS_PORT=5000"));
  EXPECT_TRUE(Has(env, "KOLO_OP_TIMEOUT=30"));  // Not kolorun's business.
  EXPECT_TRUE(Has(env, "OMP_NUM_THREADS=1"));   // max(1, 1 / 2)
  EXPECT_TRUE(Has(env, "KOLO_START_TIMEOUT=60"));
}

TEST(WorkerEnvironmentTest, TorchRanksAlwaysMastersOnlyUnlessSet) {
  LaunchOptions options;
  options.num_proc = 2;
  const std::vector<std::string> env = WorkerEnvironment(
      {"RANK=7", "WORLD_SIZE=9", "MASTER_ADDR=10.1.1.1", "MASTER_PORT=1234"},
      options, Endpoint(1, 2, 1, 5000, 4), 2);
  EXPECT_TRUE(Has(env, "RANK=1"));
  EXPECT_TRUE(Has(env, "WORLD_SIZE=2"));
  EXPECT_EQ(CountName(env, "RANK"), 1);
  EXPECT_TRUE(Has(env, "MASTER_ADDR=10.1.1.1"));
  EXPECT_TRUE(Has(env, "MASTER_PORT=1234"));
  EXPECT_EQ(CountName(env, "MASTER_PORT"), 1);
  EXPECT_GT(FreeTcpPort(), 0);
}

TEST(WorkerEnvironmentTest, KeepsStartTimeoutAndOmpThreadsAlreadySet) {
  LaunchOptions options;
  options.num_proc = 2;
  const std::vector<std::string> env =
      WorkerEnvironment({"KOLO_START_TIMEOUT=7", "OMP_NUM_THREADS=3"}, options,
                        Endpoint(0, 2, 1, 1, 3), 64);
  EXPECT_TRUE(Has(env, "KOLO_START_TIMEOUT=7"));
  EXPECT_TRUE(Has(env, "OMP_NUM_THREADS=3"));
  EXPECT_EQ(CountName(env, "KOLO_START_TIMEOUT"), 1);
  EXPECT_EQ(CountName(env, "OMP_NUM_THREADS"), 1);
}

TEST(WorkerEnvironmentTest, ForwardedVariablesWinOnce) {
  LaunchOptions options;
  options.num_proc = 1;
  options.log_level = "info";
  options.forwarded = {{"FOO", true, "bar"},
                       {"HOME", false, ""},
                       {"KOLO_LOG_LEVEL", true, "error"},
                       {"OMP_NUM_THREADS", true, "5"},
                       {"NOT_SET_ANYWHERE", false, ""}};
  const std::vector<std::string> env = WorkerEnvironment(
      {"HOME=/home/me", "FOO=old"}, options, Endpoint(0, 1, 1, 1, 3), 8);
  EXPECT_TRUE(Has(env, "FOO=bar"));
  EXPECT_EQ(CountName(env, "FOO"), 1);
  EXPECT_TRUE(Has(env, "HOME=/home/me"));
  EXPECT_EQ(CountName(env, "HOME"), 1);
  EXPECT_TRUE(Has(env, "KOLO_LOG_LEVEL=error"));
  EXPECT_EQ(CountName(env, "KOLO_LOG_LEVEL"), 1);
  EXPECT_TRUE(Has(env, "OMP_NUM_THREADS=5"));
  EXPECT_EQ(CountName(env, "OMP_NUM_THREADS"), 1);
  EXPECT_EQ(CountName(env, "NOT_SET_ANYWHERE"), 0);
}

TEST(RemoteWorkerEnvironmentTest, ForwardsTheDocumentedVariablesOnly) {
  LaunchOptions options;
  options.num_proc = 4;
  options.forwarded = {{"CUDA_VISIBLE_DEVICES", false, ""},
                       {"MY_SETTING", true, "on"}};
  const std::vector<std::string> env = RemoteWorkerEnvironment(
      {"PATH=/opt/bin:/usr/bin", "LD_LIBRARY_PATH=/opt/lib", "HOME=/root",
       "SSH_AUTH_SOCK=/tmp/agent", "KOLO_OP_TIMEOUT=30", "KOLO_SECRET=abc",
       "KOLO_SECRET_FILE=/here/only", "KOLO_SECRET_FD=5",
       "CUDA_VISIBLE_DEVICES=1", "PYTHONPATH=/p"},
      options, Endpoint(3, 2, 2, 999, 6));
  for (const char* entry : {"PATH=/opt/bin:/usr/bin",
                            "LD_LIBRARY_PATH=/opt/lib",
                            "KOLO_OP_TIMEOUT=30",
                            "CUDA_VISIBLE_DEVICES=1",
                            "MY_SETTING=on",
                            "KOLO_RANK=3",
                            "KOLO_SIZE=4",
                            "KOLO_LOCAL_RANK=1",
                            "KOLO_LOCAL_SIZE=2",
                            "KOLO_CROSS_RANK=1",
                            "KOLO_CROSS_SIZE=2",
                            "KOLO_RENDEZVOUS_ADDR=10.0.0.1",
                            "KOLO_RENDEZVOUS_PORT=999",
                            "KOLO_START_TIMEOUT=60",
                            "KOLO_LAUNCHER=kolorun",
                            "HOROVOD_RANK=3",
                            "HOROVOD_SIZE=4",
                            "HOROVOD_LOCAL_RANK=1",
                            "HOROVOD_LOCAL_SIZE=2",
                            "HOROVOD_CROSS_RANK=1",
                            "HOROVOD_CROSS_SIZE=2",
                            "PYTHONUNBUFFERED=1",
                            "RANK=3",
                            "WORLD_SIZE=4",
                            "LOCAL_RANK=1",
                            "LOCAL_WORLD_SIZE=2",
                            "GROUP_RANK=1",
                            "MASTER_ADDR=10.0.0.1",
                            "MASTER_PORT=29500"}) {
    EXPECT_TRUE(Has(env, entry)) << entry;
  }
  EXPECT_EQ(env.size(), 29u);
  // The guard makes the secret's descriptor on the remote host; the login
  // environment there provides HOME; OMP_NUM_THREADS follows the remote
  // host's CPUs.
  for (const char* name :
       {"KOLO_SECRET", "KOLO_SECRET_FILE", "KOLO_SECRET_FD", "HOME",
        "SSH_AUTH_SOCK", "PYTHONPATH", "OMP_NUM_THREADS"}) {
    EXPECT_EQ(CountName(env, name), 0) << name;
  }
}

// CPUs 0..n-1 with core(id) as their cores.
std::vector<Cpu> Cpus(int n, int (*core)(int)) {
  std::vector<Cpu> cpus;
  for (int id = 0; id < n; ++id) cpus.push_back({id, core(id)});
  return cpus;
}
int OwnCore(int id) { return id; }

TEST(CpuShareTest, EqualContiguousBlocksOfCores) {
  const std::vector<Cpu> two = Cpus(2, OwnCore);
  EXPECT_EQ(CpuShare(two, 0, 2), std::vector<int>({0}));
  EXPECT_EQ(CpuShare(two, 1, 2), std::vector<int>({1}));
  const std::vector<Cpu> eight = Cpus(8, OwnCore);
  EXPECT_EQ(CpuShare(eight, 0, 3), std::vector<int>({0, 1}));
  EXPECT_EQ(CpuShare(eight, 1, 3), std::vector<int>({2, 3, 4}));
  EXPECT_EQ(CpuShare(eight, 2, 3), std::vector<int>({5, 6, 7}));
  // The allowed set need not start at 0 nor be contiguous (a cpuset).
  const std::vector<Cpu> odd = {{1, 1}, {3, 3}, {5, 5}, {7, 7}};
  EXPECT_EQ(CpuShare(odd, 1, 2), std::vector<int>({5, 7}));
  // Nothing to bind: one rank, or more ranks than CPUs.
  EXPECT_TRUE(CpuShare(eight, 0, 1).empty());
  EXPECT_TRUE(CpuShare(two, 2, 3).empty());
  EXPECT_TRUE(CpuShare({}, 0, 2).empty());
}

TEST(CpuShareTest, HardwareThreadsOfACoreStayTogether) {
  // Second threads numbered after every first thread (common on Intel):
  // cores 0-3 are CPUs {0,4}, {1,5}, {2,6}, {3,7}.
  const std::vector<Cpu> split = Cpus(8, [](int id) { return id % 4; });
  EXPECT_EQ(CpuShare(split, 0, 2), std::vector<int>({0, 1, 4, 5}));
  EXPECT_EQ(CpuShare(split, 1, 2), std::vector<int>({2, 3, 6, 7}));
  // Siblings numbered together: cores {0,1}, {2,3}, {4,5}, {6,7}.
  const std::vector<Cpu> paired = Cpus(8, [](int id) { return id / 2 * 2; });
  EXPECT_EQ(CpuShare(paired, 0, 2), std::vector<int>({0, 1, 2, 3}));
  EXPECT_EQ(CpuShare(paired, 1, 4), std::vector<int>({2, 3}));
  // More ranks than cores but not than CPUs: the CPUs are cut instead.
  EXPECT_EQ(CpuShare(split, 5, 8), std::vector<int>({5}));
  EXPECT_EQ(CpuShare(paired, 0, 8), std::vector<int>({0}));
}

TEST(CpuShareTest, FormatsLikeTheKernel) {
  EXPECT_EQ(FormatCpuList({0}), "0");
  EXPECT_EQ(FormatCpuList({0, 1}), "0-1");
  EXPECT_EQ(FormatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(FormatCpuList({}), "");
}

TEST(DescribeWaitStatusTest, ExitCodesAndSignalNames) {
  EXPECT_EQ(DescribeWaitStatus(3 << 8), "exited with code 3");
  EXPECT_EQ(DescribeWaitStatus(0), "exited with code 0");
  EXPECT_EQ(DescribeWaitStatus(SIGKILL), "was killed by signal SIGKILL");
  EXPECT_EQ(DescribeWaitStatus(SIGSEGV | 0x80),
            "was killed by signal SIGSEGV (core dumped)");
  EXPECT_EQ(SignalName(SIGTERM), "SIGTERM");
  EXPECT_EQ(SignalName(SIGINT), "SIGINT");
}

// Runs a forwarder over a pipe fed with `input`, writing into a temp file.
std::string Forward(int rank, const std::string& input) {
  int pipe_fds[2];
  EXPECT_EQ(pipe(pipe_fds), 0);
  const char* tmpdir = getenv("TEST_TMPDIR");
  std::string templ = std::string(tmpdir ? tmpdir : "/tmp") + "/fwd_XXXXXX";
  const int target = mkstemp(templ.data());
  EXPECT_GE(target, 0) << templ;
  {
    LineForwarder forwarder(rank, os::UniqueFd(pipe_fds[0]), target);
    // A writer thread: the input may exceed the pipe's capacity.
    std::thread writer([&] {
      WriteFully(pipe_fds[1], input);
      close(pipe_fds[1]);
    });
    while (forwarder.fd() >= 0) {
      struct pollfd p = {forwarder.fd(), POLLIN, 0};
      poll(&p, 1, -1);
      forwarder.ReadAvailable();
    }
    writer.join();
  }
  close(target);
  std::ifstream in(templ);
  std::stringstream out;
  out << in.rdbuf();
  unlink(templ.c_str());
  return out.str();
}

TEST(LineForwarderTest, PrefixesEveryLineAndFlushesThePartialOneAtEof) {
  EXPECT_EQ(Forward(3, "a\nbb\n\nccc"), "[3] a\n[3] bb\n[3] \n[3] ccc\n");
  EXPECT_EQ(Forward(0, ""), "");
  EXPECT_EQ(Forward(12, "x\n"), "[12] x\n");
}

TEST(LineForwarderTest, SplitsOverlongLines) {
  const std::string input(200 * 1024, 'z');
  const std::string out = Forward(1, input);
  EXPECT_EQ(std::count(out.begin(), out.end(), 'z'), 200 * 1024);
  EXPECT_GE(std::count(out.begin(), out.end(), '\n'), 3);
  EXPECT_TRUE(absl::StartsWith(out, "[1] zzz"));
}

// A forwarder fed step by step: Feed() writes to its source pipe and has it
// read at time `at`; Take() returns what it wrote to its target since.
class Steps {
 public:
  explicit Steps(ForwardOptions options = {}) {
    int source[2], target[2];
    EXPECT_EQ(pipe(source), 0);
    EXPECT_EQ(pipe2(target, O_NONBLOCK), 0);
    writer_ = source[1];
    reader_ = target[0];
    target_ = target[1];
    forwarder_ = std::make_unique<LineForwarder>(0, os::UniqueFd(source[0]),
                                                 target_, std::move(options));
  }
  ~Steps() {
    forwarder_.reset();
    if (writer_ >= 0) close(writer_);
    close(reader_);
    close(target_);
  }
  LineForwarder& forwarder() { return *forwarder_; }
  void Feed(const std::string& data, absl::Time at) {
    WriteFully(writer_, data);
    forwarder_->ReadAvailable(at);
  }
  void End(absl::Time at) {
    close(writer_);
    writer_ = -1;
    forwarder_->ReadAvailable(at);
    EXPECT_EQ(forwarder_->fd(), -1);
  }
  std::string Take() {
    std::string out;
    char buffer[4096];
    ssize_t n;
    while ((n = read(reader_, buffer, sizeof(buffer))) > 0)
      out.append(buffer, n);
    return out;
  }

 private:
  int writer_ = -1, reader_ = -1, target_ = -1;
  std::unique_ptr<LineForwarder> forwarder_;
};

const absl::Time kT0 = absl::FromUnixSeconds(1000);
absl::Time At(int ms) { return kT0 + absl::Milliseconds(ms); }

TEST(LineForwarderTest, PartialLineIsWrittenAfterItsDelayAndNotAgain) {
  Steps steps;
  steps.Feed("Loading", At(0));
  EXPECT_EQ(steps.Take(), "");
  EXPECT_EQ(steps.forwarder().Deadline(), At(0) + kPartialDelay);
  steps.forwarder().OnTimer(At(99));
  EXPECT_EQ(steps.Take(), "");
  steps.forwarder().OnTimer(At(100));
  EXPECT_EQ(steps.Take(), "[0] Loading\n");
  EXPECT_EQ(steps.forwarder().Deadline(), absl::InfiniteFuture());
  // The rest of the line comes as a further line, without what was shown.
  steps.Feed("... done\nnext\n", At(500));
  EXPECT_EQ(steps.Take(), "[0] ... done\n[0] next\n");
  // A line written whole before its delay ran out is written once.
  steps.Feed("a", At(600));
  steps.Feed("b\n", At(650));
  EXPECT_EQ(steps.Take(), "[0] ab\n");
  EXPECT_EQ(steps.forwarder().Deadline(), absl::InfiniteFuture());
}

TEST(LineForwarderTest, CarriageReturnVersionsAreUpdatesAtMostOnePerGap) {
  Steps steps;
  steps.Feed("\rstep 1/4", At(0));
  steps.forwarder().OnTimer(At(100));
  EXPECT_EQ(steps.Take(), "[0] step 1/4\n");
  // Two versions in quick succession: the first is replaced before its turn.
  steps.Feed("\rstep 2/4", At(120));
  steps.Feed("\rstep 3/4", At(150));
  EXPECT_EQ(steps.forwarder().Deadline(), At(100) + kUpdateGap);
  steps.forwarder().OnTimer(At(349));
  EXPECT_EQ(steps.Take(), "");
  steps.forwarder().OnTimer(At(350));
  EXPECT_EQ(steps.Take(), "[0] step 3/4\n");
  // The newline ends the line with its last version; no '\r' ever leaves.
  steps.Feed("\rstep 4/4 loss 0.25\n", At(400));
  EXPECT_EQ(steps.Take(), "[0] step 4/4 loss 0.25\n");
  // "text\r\n" (as from a Windows program): one line.
  steps.Feed("crlf\r", At(1000));
  steps.Feed("\n", At(1001));
  EXPECT_EQ(steps.Take(), "[0] crlf\n");
  // Blank lines stay.
  steps.Feed("\n\n", At(1100));
  EXPECT_EQ(steps.Take(), "[0] \n[0] \n");
}

TEST(LineForwarderTest, LastVersionIsWrittenAtEof) {
  Steps steps;
  steps.Feed("\rA\rB\rC", At(0));
  EXPECT_EQ(steps.Take(), "");
  steps.End(At(1));
  EXPECT_EQ(steps.Take(), "[0] C\n");

  Steps ended_by_cr;
  ended_by_cr.Feed("\rA\rlast version\r", At(0));
  ended_by_cr.End(At(1));
  EXPECT_EQ(ended_by_cr.Take(), "[0] last version\n");
}

TEST(LineForwarderTest, FlushWritesTheLineInProgressAtOnce) {
  Steps steps;
  steps.Feed("prompt> ", At(0));
  steps.forwarder().Flush(At(1));
  EXPECT_EQ(steps.Take(), "[0] prompt> \n");
  steps.forwarder().Flush(At(2));
  EXPECT_EQ(steps.Take(), "");
}

TEST(LineForwarderTest, WithoutTagLinesAreAsWritten) {
  ForwardOptions options;
  options.tag = false;
  Steps steps(options);
  steps.Feed("a\nb", At(0));
  steps.End(At(1));
  EXPECT_EQ(steps.Take(), "a\nb\n");
}

TEST(LineForwarderTest, HiddenStreamKeepsOnlyItsLastLines) {
  ForwardOptions options;
  options.visible = false;
  options.hidden_tail = 2;
  Steps steps(options);
  steps.Feed("one\ntwo\nthree\nfour", At(0));
  steps.End(At(1));
  EXPECT_EQ(steps.Take(), "");
  EXPECT_EQ(steps.forwarder().HiddenTail(),
            (std::vector<std::string>{"three", "four"}));
}

TEST(SecretDescriptorTest, SealedMemoryFileReadableAgainAndClosedOnExec) {
  auto secret = SecretDescriptor::Create("0123abcd0123abcd");
  ASSERT_TRUE(secret.ok()) << secret.status();
  const int fd = (*secret)->fd();
  char buffer[64];
  for (int read_again = 0; read_again < 2; ++read_again) {
    const ssize_t n = pread(fd, buffer, sizeof(buffer), 0);
    ASSERT_EQ(n, 16);
    EXPECT_EQ(std::string(buffer, n), "0123abcd0123abcd");
  }
  // Sealed: nobody can change it, not even through this descriptor.
  EXPECT_LT(pwrite(fd, "x", 1, 0), 0);
  EXPECT_LT(ftruncate(fd, 0), 0);
  // Close-on-exec in kolorun; SpawnWorker clears it in the child only.
  EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  // Nothing on disk: the descriptor's target is an anonymous memory file.
  char target[256] = {};
  ASSERT_GT(readlink(absl::StrCat("/proc/self/fd/", fd).c_str(), target,
                     sizeof(target) - 1),
            0);
  EXPECT_TRUE(absl::StartsWith(target, "/memfd:kolo-secret")) << target;
}

JobPlan LocalPlan(int workers) {
  JobPlan plan;
  plan.ranks.resize(workers);
  return plan;
}

TEST(CheckResourcesTest, RefusesMoreWorkersThanDescriptors) {
  LaunchOptions options;
  options.num_proc = 100000;
  ResourceLimits limits;
  limits.descriptors = 1024;
  const absl::Status s = CheckResources(options, LocalPlan(100000), limits);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "-np 100000")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "file descriptors")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "1024 (ulimit -n)")) << s;
  limits.descriptors = 1 << 20;
  EXPECT_TRUE(CheckResources(options, LocalPlan(100000), limits).ok());
}

TEST(CheckResourcesTest, RefusesMoreWorkersThanProcessesLeft) {
  LaunchOptions options;
  options.num_proc = 1000;
  ResourceLimits limits;
  limits.descriptors = 1 << 20;
  limits.processes = 600;
  limits.processes_source = "pids.max=600 of the cgroup /sys/fs/cgroup/job";
  const absl::Status s = CheckResources(options, LocalPlan(1000), limits);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "600 more may start here")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "pids.max=600")) << s;
  options.num_proc = 4;
  EXPECT_TRUE(CheckResources(options, LocalPlan(4), limits).ok());
  limits.processes = -1;  // No limit found.
  options.num_proc = 1000;
  EXPECT_TRUE(CheckResources(options, LocalPlan(1000), limits).ok());
}

TEST(CheckResourcesTest, ThisMachineStartsASmallJob) {
  LaunchOptions options;
  options.num_proc = 2;
  const ResourceLimits limits = ReadResourceLimits();
  EXPECT_GE(limits.descriptors, 64);
  EXPECT_TRUE(CheckResources(options, LocalPlan(2), limits).ok());
}

}  // namespace
}  // namespace kolorun
}  // namespace kolo
