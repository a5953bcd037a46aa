#include "tools/kolorun/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/net/secure_channel.h"
#include "runtime/rendezvous/tcp_store.h"
#include "tools/kolorun/process.h"
#include "tools/kolorun/secret_file.h"

extern char** environ;

namespace kolo {
namespace kolorun {
namespace {

// After SIGKILL, how long to wait for the killed processes to be reaped
// before giving up on them (a process in uninterruptible sleep dies only
// when it leaves it; PR_SET_PDEATHSIG still covers the workers then).
constexpr absl::Duration kReapAfterKill = absl::Seconds(2);

std::string ShellQuote(const std::string& arg) {
  const bool plain =
      !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) ||
               std::strchr("@%+=:,./_-", c) != nullptr;
      });
  if (plain) return arg;
  std::string quoted = "'";
  for (char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::string EnvName(const std::string& entry) {
  return entry.substr(0, entry.find('='));
}

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
      INT_MAX));
}

}  // namespace

std::vector<std::string> WorkerEnvironment(
    const std::vector<std::string>& inherited, const LaunchOptions& options,
    int rank, int store_port, const std::string& secret_path, int cpus) {
  const std::vector<std::pair<std::string, std::string>> job = {
      {"KOLO_RANK", absl::StrCat(rank)},
      {"KOLO_SIZE", absl::StrCat(options.num_proc)},
      {"KOLO_LOCAL_RANK", absl::StrCat(rank)},
      {"KOLO_LOCAL_SIZE", absl::StrCat(options.num_proc)},
      {"KOLO_CROSS_RANK", "0"},
      {"KOLO_CROSS_SIZE", "1"},
      {"KOLO_RENDEZVOUS_ADDR", "127.0.0.1"},
      {"KOLO_RENDEZVOUS_PORT", absl::StrCat(store_port)},
      {"KOLO_SECRET_FILE", secret_path},
  };
  // Replaced by the job's values; KOLO_SECRET never reaches a worker: the
  // secret travels only through the file.
  std::set<std::string> dropped = {"KOLO_SECRET"};
  for (const auto& [name, value] : job) dropped.insert(name);

  std::vector<std::string> env;
  bool has_start_timeout = false;
  bool has_omp_threads = false;
  for (const std::string& entry : inherited) {
    const std::string name = EnvName(entry);
    if (dropped.count(name)) continue;
    has_start_timeout |= name == "KOLO_START_TIMEOUT";
    has_omp_threads |= name == "OMP_NUM_THREADS";
    env.push_back(entry);
  }
  for (const auto& [name, value] : job)
    env.push_back(absl::StrCat(name, "=", value));
  if (!has_start_timeout) {
    env.push_back(absl::StrCat("KOLO_START_TIMEOUT=",
                               FormatSeconds(options.start_timeout)));
  }
  if (!has_omp_threads) {
    env.push_back(
        absl::StrCat("OMP_NUM_THREADS=", std::max(1, cpus / options.num_proc)));
  }
  return env;
}

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

Launcher::Launcher(LaunchOptions options) : options_(std::move(options)) {}

Launcher::~Launcher() = default;

void Launcher::Log(const std::string& message) const {
  WriteFully(STDERR_FILENO, absl::StrCat(message, "\n"));
}

int Launcher::Run() {
  absl::StatusOr<std::unique_ptr<SignalPipe>> signals = SignalPipe::Install();
  if (!signals.ok()) {
    Log(absl::StrCat("kolorun: ", signals.status().message()));
    return 1;
  }
  signals_ = *std::move(signals);
  // Processes the workers leave behind are re-parented to kolorun, which
  // reaps them and sees their process groups empty (Note [Launcher
  // lifecycle]).
  prctl(PR_SET_CHILD_SUBREAPER, 1);

  const std::string secret = net::GenerateSecret();
  absl::StatusOr<std::unique_ptr<SecretFile>> secret_file =
      SecretFile::Create(secret);
  if (!secret_file.ok()) {
    Log(absl::StrCat("kolorun: ", secret_file.status().message()));
    return 1;
  }
  absl::StatusOr<std::unique_ptr<rendezvous::TcpStoreServer>> server =
      rendezvous::TcpStoreServer::Start("127.0.0.1", 0, secret);
  if (!server.ok()) {
    Log(absl::StrCat("kolorun: cannot start the rendezvous store: ",
                     server.status().message()));
    return 1;
  }
  store_ = (*server)->local();
  const int port = (*server)->port();
  if (options_.verbose) {
    std::vector<std::string> quoted;
    for (const std::string& arg : options_.command)
      quoted.push_back(ShellQuote(arg));
    Log(absl::StrCat("kolorun: starting ", options_.num_proc, " worker",
                     options_.num_proc == 1 ? "" : "s", ": ",
                     absl::StrJoin(quoted, " ")));
    Log(absl::StrCat("kolorun: rendezvous store on 127.0.0.1:", port,
                     ", start timeout ", FormatSeconds(options_.start_timeout),
                     " s, grace period ", FormatSeconds(options_.grace_period),
                     " s"));
  }

  start_deadline_ = absl::Now() + options_.start_timeout;
  SpawnAll(port, (*secret_file)->path());
  EventLoop();

  for (Worker& worker : workers_) {
    worker.out->ReadAvailable();
    worker.out->Close();
    worker.err->ReadAvailable();
    worker.err->Close();
  }
  (*server)->Stop();
  store_.reset();
  return exit_code_;  // ~SecretFile removes the file.
}

void Launcher::SpawnAll(int store_port, const std::string& secret_path) {
  const int dev_null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<std::string> inherited;
  for (char** entry = environ; entry && *entry; ++entry)
    inherited.push_back(*entry);
  const int cpus = AvailableCpus();

  workers_.reserve(options_.num_proc);
  for (int rank = 0; rank < options_.num_proc && !failed_; ++rank) {
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0) {
      Fail(absl::StrCat("kolorun: cannot start rank ", rank,
                        ": pipe: ", std::strerror(errno)),
           1);
      break;
    }
    if (pipe2(err_pipe, O_CLOEXEC) != 0) {
      Fail(absl::StrCat("kolorun: cannot start rank ", rank,
                        ": pipe: ", std::strerror(errno)),
           1);
      close(out_pipe[0]);
      close(out_pipe[1]);
      break;
    }
    WorkerLaunch launch;
    launch.argv = options_.command;
    launch.env = WorkerEnvironment(inherited, options_, rank, store_port,
                                   secret_path, cpus);
    // Workers run in their own process groups, outside the terminal's
    // foreground group: reading a terminal would stop them (SIGTTIN).
    launch.stdin_fd = dev_null >= 0 ? dev_null : out_pipe[0];
    launch.stdout_fd = out_pipe[1];
    launch.stderr_fd = err_pipe[1];
    const SpawnResult spawned = SpawnWorker(launch, *signals_);
    close(out_pipe[1]);
    close(err_pipe[1]);

    Worker worker;
    worker.rank = rank;
    worker.pid = spawned.pid;
    worker.running = spawned.pid > 0;
    worker.out =
        std::make_unique<LineForwarder>(rank, out_pipe[0], STDOUT_FILENO);
    worker.err =
        std::make_unique<LineForwarder>(rank, err_pipe[0], STDERR_FILENO);
    if (worker.running) worker_by_pid_[worker.pid] = workers_.size();
    workers_.push_back(std::move(worker));

    if (!spawned.status.ok()) {
      Fail(absl::StrCat(
               "kolorun: rank ", rank,
               spawned.pid > 0 ? absl::StrCat(" (pid ", spawned.pid, ")") : "",
               ": ", spawned.status.message()),
           1);
    }
  }
  if (dev_null >= 0) close(dev_null);
}

void Launcher::EventLoop() {
  std::vector<struct pollfd> fds;
  std::vector<LineForwarder*> forwarders;
  for (;;) {
    if (AllWorkersReaped()) {
      ReapChildren();  // Orphans re-parented to kolorun.
      if (!AnyProcessGroupAlive()) break;
      if (phase_ == Phase::kRunning) {
        Log("kolorun: terminating processes the workers left behind");
        BeginTeardown();
      }
    }
    if (phase_ == Phase::kKilling && absl::Now() >= give_up_deadline_) {
      Log(absl::StrCat("kolorun: processes of the job were still alive ",
                       FormatSeconds(kReapAfterKill), " s after SIGKILL"));
      break;
    }

    fds.clear();
    forwarders.clear();
    fds.push_back({signals_->read_fd(), POLLIN, 0});
    for (Worker& worker : workers_) {
      for (LineForwarder* stream : {worker.out.get(), worker.err.get()}) {
        if (stream->fd() < 0) continue;
        fds.push_back({stream->fd(), POLLIN, 0});
        forwarders.push_back(stream);
      }
    }
    const int ready =
        poll(fds.data(), fds.size(), PollTimeoutMs(NextDeadline()));
    if (ready < 0 && errno != EINTR) {
      Fail(absl::StrCat("kolorun: poll failed: ", std::strerror(errno)), 1);
      if (phase_ == Phase::kTerminating) KillRemaining();
    }
    if (ready > 0) {
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents) forwarders[i - 1]->ReadAvailable();
      }
      if (fds[0].revents) {
        for (int signo : signals_->Drain()) OnSignal(signo);
      }
    }

    const absl::Time now = absl::Now();
    if (phase_ == Phase::kRunning && now >= start_deadline_) OnStartDeadline();
    if (phase_ == Phase::kTerminating && now >= kill_deadline_) KillRemaining();
  }
}

absl::Time Launcher::NextDeadline() const {
  switch (phase_) {
    case Phase::kRunning:
      return start_deadline_;
    case Phase::kTerminating:
      return kill_deadline_;
    case Phase::kKilling:
      return give_up_deadline_;
  }
  return absl::InfiniteFuture();
}

void Launcher::OnSignal(int signo) {
  if (signo == SIGCHLD) {
    ReapChildren();
    return;
  }
  switch (phase_) {
    case Phase::kRunning:
      Fail(absl::StrCat("kolorun: received ", SignalName(signo),
                        ", terminating the workers"),
           128 + signo);
      break;
    case Phase::kTerminating:
      Log(absl::StrCat("kolorun: received ", SignalName(signo),
                       " again, killing the workers"));
      KillRemaining();
      break;
    case Phase::kKilling:
      break;
  }
}

void Launcher::ReapChildren() {
  for (;;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) return;  // None exited (0) or no children left (ECHILD).
    const auto it = worker_by_pid_.find(pid);
    if (it == worker_by_pid_.end()) continue;  // A re-parented orphan.
    Worker& worker = workers_[it->second];
    worker.running = false;
    // Everything the worker wrote is in its pipes now: print it before its
    // exit status.
    for (LineForwarder* stream : {worker.out.get(), worker.err.get()}) {
      stream->ReadAvailable();
      stream->FlushPartialLine();
    }
    const bool success = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const std::string what =
        absl::StrCat("kolorun: rank ", worker.rank, " (pid ", pid, ") ",
                     DescribeWaitStatus(status));
    if (!success && phase_ == Phase::kRunning) {
      Fail(what, 1);
    } else if (options_.verbose) {
      Log(what);
    }
  }
}

void Launcher::OnStartDeadline() {
  start_deadline_ = absl::InfiniteFuture();
  std::vector<int> missing;
  for (const Worker& worker : workers_) {
    absl::StatusOr<bool> ready =
        store_->Check(absl::StrCat("kolo/ready/", worker.rank));
    if (!ready.ok() || !*ready) missing.push_back(worker.rank);
  }
  if (missing.empty()) {
    if (options_.verbose) {
      Log(absl::StrCat("kolorun: all ", workers_.size(), " ranks joined"));
    }
    return;
  }
  Fail(
      absl::StrCat("kolorun: ranks [", absl::StrJoin(missing, ", "),
                   "] did not join within ",
                   FormatSeconds(options_.start_timeout), " s (start timeout)"),
      1);
}

void Launcher::Fail(const std::string& message, int exit_code) {
  if (!failed_) {
    failed_ = true;
    exit_code_ = exit_code;
    Log(message);
  }
  if (phase_ == Phase::kRunning) BeginTeardown();
}

namespace {

// Signals the worker's process group, and the worker itself should it have
// left the group (setsid/setpgid in the worker).
void SignalWorker(pid_t pid, bool running, int signo) {
  if (pid <= 0) return;
  killpg(pid, signo);
  if (running && getpgid(pid) != pid) kill(pid, signo);
}

}  // namespace

void Launcher::BeginTeardown() {
  phase_ = Phase::kTerminating;
  start_deadline_ = absl::InfiniteFuture();
  for (const Worker& worker : workers_) {
    SignalWorker(worker.pid, worker.running, SIGTERM);
    // A stopped process acts on SIGTERM only once continued.
    SignalWorker(worker.pid, worker.running, SIGCONT);
  }
  kill_deadline_ = absl::Now() + options_.grace_period;
  if (options_.grace_period <= absl::ZeroDuration()) KillRemaining();
}

void Launcher::KillRemaining() {
  phase_ = Phase::kKilling;
  for (const Worker& worker : workers_) {
    if (worker.running) {
      Log(absl::StrCat("kolorun: rank ", worker.rank, " (pid ", worker.pid,
                       ") is still running, sending SIGKILL"));
    }
    SignalWorker(worker.pid, worker.running, SIGKILL);
  }
  give_up_deadline_ = absl::Now() + kReapAfterKill;
}

bool Launcher::AllWorkersReaped() const {
  return std::none_of(workers_.begin(), workers_.end(),
                      [](const Worker& w) { return w.running; });
}

bool Launcher::AnyProcessGroupAlive() const {
  return std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) {
    // EPERM: the group id now belongs to processes kolorun may not signal,
    // which are not the job's.
    return w.pid > 0 && killpg(w.pid, 0) == 0;
  });
}

}  // namespace kolorun
}  // namespace kolo
