#include "tools/kolorun/launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/net/secure_channel.h"
#include "runtime/rendezvous/tcp_store.h"
#include "tools/kolorun/process.h"
#include "tools/kolorun/remote.h"
#include "tools/kolorun/job_guard.h"
#include "tools/kolorun/secret_fd.h"

extern char** environ;

namespace kolo {
namespace kolorun {
namespace {

// After SIGKILL, how long to wait for the killed processes to be reaped
// before giving up on them (a process in uninterruptible sleep dies only
// when it leaves it; PR_SET_PDEATHSIG still covers the workers then).
constexpr absl::Duration kReapAfterKill = absl::Seconds(2);
// A guard SIGKILLs its rank when the grace period ends, as kolorun does its
// local ranks; kolorun gives it this long to report before it kills ssh.
constexpr absl::Duration kGuardSlack = absl::Seconds(3);
// After a worker fails on its own, how long the others may take to report
// what they saw and exit before the teardown signals them (Phase
// kReporting). Survivors hear of a lost rank within milliseconds.
constexpr absl::Duration kReportGrace = absl::Seconds(1);
// Elastic mode: how long the discovery script may run; how long a worker
// reported lost may take to exit before kolorun kills it (Note [Elastic
// launcher]).
constexpr absl::Duration kDiscoveryTimeout = absl::Seconds(10);
constexpr absl::Duration kLostGrace = absl::Milliseconds(500);
// Lines of stderr kept for a rank that --output-ranks hides, shown if it
// fails.
constexpr size_t kHiddenTailLines = 20;

int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(
      absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
      INT_MAX));
}

}  // namespace

Launcher::Launcher(LaunchOptions options, JobPlan plan)
    : options_(std::move(options)), plan_(std::move(plan)) {}

Launcher::~Launcher() {
  if (dev_null_for_spawn_ >= 0) close(dev_null_for_spawn_);
  for (Worker& worker : workers_) {
    if (worker.stdin_fd >= 0) close(worker.stdin_fd);
    if (worker.log_fd >= 0) close(worker.log_fd);
  }
}

void Launcher::Log(const std::string& message) const {
  WriteFully(STDERR_FILENO, absl::StrCat(message, "\n"));
}

int Launcher::Run() {
  // Before any thread exists (Note [Job guard]).
  absl::StatusOr<std::unique_ptr<JobGuard>> guard = JobGuard::Start();
  if (!guard.ok()) {
    Log(absl::StrCat("kolorun: ", guard.status().message()));
    return 1;
  }
  guard_ = *std::move(guard);
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
  status_token_ = net::GenerateSecret().substr(0, 16);
  absl::StatusOr<std::unique_ptr<SecretDescriptor>> secret_fd =
      SecretDescriptor::Create(secret);
  if (!secret_fd.ok()) {
    Log(absl::StrCat("kolorun: ", secret_fd.status().message()));
    return 1;
  }
  if (!options_.output_dir.empty() &&
      mkdir(options_.output_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    Log(absl::StrCat("kolorun: cannot create --output-filename directory ",
                     options_.output_dir, ": ", std::strerror(errno)));
    return 1;
  }
  if (pipe2(store_changed_, O_CLOEXEC | O_NONBLOCK) != 0) {
    Log(absl::StrCat("kolorun: pipe: ", std::strerror(errno)));
    return 1;
  }
  rendezvous::ServerOptions server_options;
  // The store's thread only rings; the poll loop reads the store.
  const int changed_fd = store_changed_[1];
  server_options.on_change = [changed_fd] {
    const char byte = 1;
    (void)!write(changed_fd, &byte, 1);  // Full: a ring is pending anyway.
  };
  absl::StatusOr<std::unique_ptr<rendezvous::TcpStoreServer>> server =
      rendezvous::TcpStoreServer::Start(plan_.store_addr, 0, secret,
                                        std::move(server_options));
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
    for (size_t i = 0; i < plan_.ranks.size();) {
      const RankPlacement& first = plan_.ranks[i];
      i += first.local_size;
      Log(absl::StrCat("kolorun: host ", first.cross_rank, " ", first.host,
                       first.remote ? " (ssh)" : " (local)", ": ranks ",
                       first.rank, "-", first.rank + first.local_size - 1));
    }
    Log(absl::StrCat("kolorun: rendezvous store on ", plan_.store_addr, ":",
                     port, " (", plan_.store_addr_reason, "), start timeout ",
                     FormatSeconds(options_.start_timeout), " s, grace period ",
                     FormatSeconds(options_.grace_period), " s"));
  }

  start_deadline_ = absl::Now() + options_.start_timeout;
  if (options_.elastic) {
    // Every generation's rendezvous has the runtime's own start timeout.
    start_deadline_ = absl::InfiniteFuture();
    store_port_ = port;
    secret_ = secret;
    secret_fd_ = (*secret_fd)->fd();
    ElasticStart();
  } else {
    SpawnAll(port, secret, (*secret_fd)->fd());
  }
  EventLoop();

  for (Worker& worker : workers_) {
    worker.out->ReadAvailable();
    worker.out->Close();
    worker.err->ReadAvailable();
    worker.err->Close();
  }
  (*server)->Stop();
  store_.reset();
  // Every process group of the job is empty (or given up on after
  // SIGKILL): nothing left for the guard to do.
  guard_->Release();
  return exit_code_;
}

void Launcher::SpawnAll(int store_port, const std::string& secret,
                        int secret_fd) {
  const int dev_null = open("/dev/null", O_RDONLY | O_CLOEXEC);
  std::vector<std::string> inherited;
  for (char** entry = environ; entry && *entry; ++entry)
    inherited.push_back(*entry);
  workers_.reserve(plan_.ranks.size());
  const std::string torch_addr = TorchMasterAddress(plan_);
  const int torch_port = FreeTcpPort();
  for (const RankPlacement& placement : plan_.ranks) {
    RankEndpoint endpoint;
    endpoint.placement = placement;
    endpoint.store_addr = plan_.store_addr;
    endpoint.store_port = store_port;
    endpoint.secret_fd = secret_fd;
    endpoint.torch_master_addr = torch_addr;
    endpoint.torch_master_port = torch_port;
    if (!Spawn(endpoint, secret, inherited, dev_null)) break;
  }
  if (dev_null >= 0) close(dev_null);
}

namespace {

// A pipe for a remote rank's standard input, holding `request` already.
// Returns the read end (for ssh) in fds[0] and the write end in fds[1].
absl::Status RequestPipe(const std::string& request, int fds[2]) {
  if (pipe2(fds, O_CLOEXEC) != 0) {
    fds[0] = fds[1] = -1;
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // The whole request must fit, so that writing it never waits for ssh.
  fcntl(fds[1], F_SETPIPE_SZ, 1 << 20);
  const int capacity = fcntl(fds[1], F_GETPIPE_SZ);
  fcntl(fds[1], F_SETFL, O_NONBLOCK);
  if (capacity < static_cast<int>(request.size()) ||
      write(fds[1], request.data(), request.size()) !=
          static_cast<ssize_t>(request.size())) {
    close(fds[0]);
    close(fds[1]);
    fds[0] = fds[1] = -1;
    return absl::ResourceExhaustedError(
        absl::StrCat("the environment for the remote rank is too large (",
                     request.size(), " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

bool Launcher::Spawn(const RankEndpoint& endpoint, const std::string& secret,
                     const std::vector<std::string>& inherited, int dev_null) {
  const RankPlacement& placement = endpoint.placement;
  const int rank = placement.rank;
  const std::string where =
      MultiHost() ? absl::StrCat(" on ", placement.host) : "";
  Worker worker;
  worker.placement = placement;
  if (!options_.output_dir.empty()) {
    const std::string path =
        absl::StrCat(options_.output_dir, "/rank.", rank, ".log");
    worker.log_fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC,
             0644);
    if (worker.log_fd < 0) {
      Fail(absl::StrCat("kolorun: cannot open ", path, ": ",
                        std::strerror(errno)),
           1);
      return false;
    }
  }
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    Fail(absl::StrCat("kolorun: cannot start rank ", rank, where,
                      ": pipe: ", std::strerror(errno)),
         1);
    if (worker.log_fd >= 0) close(worker.log_fd);
    return false;
  }
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    Fail(absl::StrCat("kolorun: cannot start rank ", rank, where,
                      ": pipe: ", std::strerror(errno)),
         1);
    close(out_pipe[0]);
    close(out_pipe[1]);
    if (worker.log_fd >= 0) close(worker.log_fd);
    return false;
  }
  WorkerLaunch launch;
  // Workers run in their own process groups, outside the terminal's
  // foreground group: reading a terminal would stop them (SIGTTIN).
  launch.stdin_fd = dev_null >= 0 ? dev_null : out_pipe[0];
  launch.stdout_fd = out_pipe[1];
  launch.stderr_fd = err_pipe[1];
  int request_pipe[2] = {-1, -1};
  absl::Status prepared;
  if (placement.remote) {
    GuardRequest request;
    char cwd[PATH_MAX];
    request.cwd = getcwd(cwd, sizeof(cwd)) ? cwd : "";
    request.env = RemoteWorkerEnvironment(inherited, options_, endpoint);
    request.secret = secret;
    request.status_token = status_token_;
    request.grace_period = options_.grace_period;
    request.bind_to_core = options_.bind_to_core;
    prepared = RequestPipe(EncodeGuardRequest(request), request_pipe);
    launch.argv = SshCommand(options_, placement.host, rank, plan_.guard_path);
    launch.stdin_fd = request_pipe[0];
    // ssh itself runs with kolorun's environment (its agent, HOME, PATH).
    for (const std::string& entry : inherited) {
      if (entry.rfind("KOLO_SECRET", 0) != 0) launch.env.push_back(entry);
    }
  } else {
    launch.argv = options_.command;
    launch.env =
        WorkerEnvironment(inherited, options_, endpoint, AvailableCpus());
    launch.inherited_fd = endpoint.secret_fd;
    if (options_.bind_to_core) {
      launch.cpus = CpuShare(allowed_cpus_, placement.local_rank,
                             placement.local_size);
    }
    if (options_.verbose) {
      Log(absl::StrCat("kolorun: rank ", rank, " runs on CPUs ",
                       FormatCpuList(launch.cpus.empty() ? CpuIds(allowed_cpus_)
                                                         : launch.cpus),
                       launch.cpus.empty() && options_.bind_to_core &&
                               placement.local_size > 1
                           ? " (not bound: more workers than CPUs)"
                           : ""));
    }
  }
  SpawnResult spawned;
  if (prepared.ok()) {
    spawned = SpawnWorker(launch, *signals_);
  } else {
    spawned.status = prepared;
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  if (request_pipe[0] >= 0) close(request_pipe[0]);
  worker.stdin_fd = request_pipe[1];

  worker.pid = spawned.pid;
  worker.running = spawned.pid > 0;
  // The worker's process group (it leads it) ends with kolorun, whatever
  // happens to kolorun (Note [Job guard]).
  guard_->Watch(spawned.pid);
  ForwardOptions forward;
  forward.timestamps = options_.prefix_timestamp;
  forward.tag = options_.tag_output;
  forward.visible = options_.ShowsRank(rank);
  forward.log_fd = worker.log_fd;
  worker.out = std::make_unique<LineForwarder>(rank, out_pipe[0], STDOUT_FILENO,
                                               forward);
  if (placement.remote) {
    const size_t index = workers_.size();
    forward.status_marker = GuardStatusMarker(status_token_);
    forward.on_status = [this, index](const std::string& rest) {
      Worker& w = workers_[index];
      w.status_known =
          ParseGuardStatus(rest, &w.remote_pid, &w.remote_wait_status);
    };
  }
  // A hidden rank's last words on stderr are shown if it fails.
  forward.hidden_tail = kHiddenTailLines;
  worker.err = std::make_unique<LineForwarder>(rank, err_pipe[0], STDERR_FILENO,
                                               forward);
  if (worker.running) worker_by_pid_[worker.pid] = workers_.size();
  workers_.push_back(std::move(worker));

  if (!spawned.status.ok()) {
    Fail(absl::StrCat(
             "kolorun: rank ", rank, where,
             spawned.pid > 0 ? absl::StrCat(" (pid ", spawned.pid, ")") : "",
             ": ", spawned.status.message()),
         1);
    return false;
  }
  return true;
}

void Launcher::EventLoop() {
  std::vector<struct pollfd> fds;
  std::vector<LineForwarder*> forwarders;
  for (;;) {
    if (AllWorkersReaped() && !ElasticWaiting()) {
      ReapChildren();  // Orphans re-parented to kolorun.
      if (!AnyProcessGroupAlive()) break;
      if (phase_ == Phase::kRunning || phase_ == Phase::kReporting) {
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
    fds.push_back({store_changed_[0], POLLIN, 0});
    for (Worker& worker : workers_) {
      for (LineForwarder* stream : {worker.out.get(), worker.err.get()}) {
        if (stream->fd() < 0) continue;
        fds.push_back({stream->fd(), POLLIN, 0});
        forwarders.push_back(stream);
      }
    }
    // The line a worker is still writing is due on the console too (Note
    // [Live output] in output.h).
    absl::Time deadline = NextDeadline();
    for (LineForwarder* stream : forwarders) {
      deadline = std::min(deadline, stream->Deadline());
    }
    const int ready = poll(fds.data(), fds.size(), PollTimeoutMs(deadline));
    if (ready < 0 && errno != EINTR) {
      Fail(absl::StrCat("kolorun: poll failed: ", std::strerror(errno)), 1);
      if (phase_ == Phase::kTerminating) {
        KillRemaining(/*wait_for_guards=*/false);
      }
    }
    if (ready > 0) {
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents) forwarders[i - 2]->ReadAvailable();
      }
      if (fds[0].revents) {
        for (int signo : signals_->Drain()) OnSignal(signo);
      }
      if (fds[1].revents) {
        char drain[64];
        while (read(store_changed_[0], drain, sizeof(drain)) > 0) {
        }
        if (options_.elastic) {
          OnElasticStoreChange();
        } else {
          CheckEarlyExits();
        }
      }
    }

    const absl::Time now = absl::Now();
    for (Worker& worker : workers_) {
      worker.out->OnTimer(now);
      worker.err->OnTimer(now);
    }
    if (phase_ == Phase::kRunning && now >= start_deadline_) OnStartDeadline();
    if (phase_ == Phase::kRunning && now >= discovery_deadline_) OnDiscovery();
    if (phase_ == Phase::kRunning && now >= min_np_deadline_) TryForm();
    if (phase_ == Phase::kRunning && options_.elastic) KillLostWorkers();
    if (phase_ == Phase::kReporting && now >= report_deadline_) {
      BeginTeardown();
    }
    if (phase_ == Phase::kTerminating && now >= kill_deadline_) {
      KillRemaining(/*wait_for_guards=*/true);
    }
    if (phase_ == Phase::kKilling && now >= ssh_kill_deadline_) KillSsh();
  }
}

absl::Time Launcher::NextDeadline() const {
  switch (phase_) {
    case Phase::kRunning: {
      absl::Time next =
          std::min({start_deadline_, discovery_deadline_, min_np_deadline_});
      for (const Worker& w : workers_) {
        if (w.reported_lost != absl::InfiniteFuture()) {
          next = std::min(next, w.reported_lost + kLostGrace);
        }
      }
      return next;
    }
    case Phase::kReporting:
      return report_deadline_;
    case Phase::kTerminating:
      return kill_deadline_;
    case Phase::kKilling:
      return std::min(give_up_deadline_, ssh_kill_deadline_);
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
    case Phase::kReporting:
      Log(absl::StrCat("kolorun: received ", SignalName(signo),
                       ", terminating the workers"));
      BeginTeardown();
      break;
    case Phase::kTerminating:
      Log(absl::StrCat("kolorun: received ", SignalName(signo),
                       " again, killing the workers"));
      KillRemaining(/*wait_for_guards=*/false);
      break;
    case Phase::kKilling:
      KillSsh();
      break;
  }
}

std::string Launcher::Name(const Worker& worker, pid_t pid) const {
  return absl::StrCat(
      "rank ", worker.placement.rank,
      MultiHost() ? absl::StrCat(" on ", worker.placement.host) : "",
      pid > 0 ? absl::StrCat(" (pid ", pid, ")") : "");
}

std::string Launcher::DescribeEnd(const Worker& worker, int wait_status,
                                  bool* success) const {
  if (!worker.placement.remote) {
    *success = WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
    return absl::StrCat(Name(worker, worker.pid), " ",
                        DescribeWaitStatus(wait_status));
  }
  if (worker.status_known) {
    *success = WIFEXITED(worker.remote_wait_status) &&
               WEXITSTATUS(worker.remote_wait_status) == 0;
    return absl::StrCat(Name(worker, worker.remote_pid), " ",
                        DescribeWaitStatus(worker.remote_wait_status));
  }
  // No word from the guard: ssh failed, or the guard could not start the
  // rank (its own message is printed above).
  *success = false;
  if (WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 255) {
    return absl::StrCat(Name(worker, -1), ": ssh to ", worker.placement.host,
                        " (pid ", worker.pid,
                        ") failed with exit status 255; see its message above");
  }
  return absl::StrCat(Name(worker, -1), ": ssh (pid ", worker.pid, ") ",
                      DescribeWaitStatus(wait_status),
                      " without a status from kolo_rank_guard");
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
    if (worker.stdin_fd >= 0) {
      close(worker.stdin_fd);
      worker.stdin_fd = -1;
    }
    // Everything the worker (or ssh, with the guard's status line) wrote is
    // in its pipes now: print it before its exit status.
    for (LineForwarder* stream : {worker.out.get(), worker.err.get()}) {
      stream->ReadAvailable();
      stream->Flush();
    }
    bool success = false;
    std::string what =
        absl::StrCat("kolorun: ", DescribeEnd(worker, status, &success));
    if (!success && !options_.ShowsRank(worker.placement.rank)) {
      ShowHiddenTail(worker);
    }
    // Whether the teardown's own signal ended it (not worth a line).
    const bool ours =
        WIFSIGNALED(status) &&
        (WTERMSIG(status) == SIGTERM ||
         (WTERMSIG(status) == SIGKILL && phase_ == Phase::kKilling));
    if (options_.elastic && phase_ == Phase::kRunning) {
      OnElasticEnd(worker, success, what);
      continue;
    }
    const int rank = worker.placement.rank;
    const bool joined = RankSet("ready", rank);
    if (!joined && RankSet("claim", rank)) {
      absl::StrAppend(&what, " during the rendezvous");
    } else if (!joined && phase_ == Phase::kRunning &&
               AnyRankSet("claim")) {
      absl::StrAppend(&what, " before it joined the rendezvous");
    }
    if (!success && phase_ == Phase::kRunning) {
      // A rank that never joined leaves the others waiting for it: nothing
      // to report. Otherwise the others may have seen what happened.
      Fail(what, 1, joined ? Teardown::kAfterReports : Teardown::kNow);
    } else if (success && !joined && phase_ == Phase::kRunning) {
      worker.exited_before_joining =
          absl::EndsWith(what, "rendezvous")
              ? what
              : absl::StrCat(what, " before it joined the rendezvous");
      CheckEarlyExits();
    } else if (!success && !worker.placement.remote && !ours) {
      // A failure of its own while the job was already coming down, e.g. a
      // rank killed at the same moment as the one named first (which of
      // two exits the kernel reports first is not the order they began).
      Log(what);
    } else if (options_.verbose) {
      Log(what);
    }
  }
}

void Launcher::ShowHiddenTail(const Worker& worker) {
  const std::vector<std::string> tail = worker.err->HiddenTail();
  if (tail.empty()) return;
  const int rank = worker.placement.rank;
  std::string text = absl::StrCat(
      "kolorun: the last ", tail.size(), " lines rank ", rank,
      " wrote to stderr (--output-ranks hides its output):\n");
  for (const std::string& line : tail) {
    absl::StrAppend(&text, "[", rank, "] ", line, "\n");
  }
  WriteFully(STDERR_FILENO, text);
}

bool Launcher::RankSet(const char* what, int rank) const {
  absl::StatusOr<bool> set = store_->Check(absl::StrCat("kolo/", what, "/", rank));
  return set.ok() && *set;
}

bool Launcher::AnyRankSet(const char* what) const {
  return std::any_of(workers_.begin(), workers_.end(), [&](const Worker& w) {
    return RankSet(what, w.placement.rank);
  });
}

std::string Launcher::RankList(const std::vector<int>& ranks) const {
  std::vector<std::string> names;
  for (int rank : ranks) {
    const RankPlacement& p = plan_.ranks[rank];
    names.push_back(absl::StrCat(
        rank, MultiHost() ? absl::StrCat(" on ", p.host) : ""));
  }
  return absl::StrCat(ranks.size() == 1 ? "rank " : "ranks [",
                      absl::StrJoin(names, ", "), ranks.size() == 1 ? "" : "]");
}

// Note [Failures at start]
// A worker that ends before it has joined (set kolo/ready/<rank>) leaves
// the ranks that did claim their place (kolo/claim/<rank>, the first thing
// the runtime does in the store) waiting for it until the start timeout. A
// non-zero exit fails the job at once anyway; an exit with code 0 fails it
// as soon as some rank is seen waiting (now, or when a rank claims its
// place later: the store rings kolorun on every change). A job whose
// workers never use kolo (e.g. `kolorun -np 2 hostname`) claims nothing
// and ends as its workers do.
void Launcher::CheckEarlyExits() {
  if (phase_ != Phase::kRunning ||
      std::none_of(workers_.begin(), workers_.end(), [](const Worker& w) {
        return !w.exited_before_joining.empty();
      })) {
    return;
  }
  std::vector<int> waiting;
  for (const Worker& worker : workers_) {
    const int rank = worker.placement.rank;
    if (worker.running && RankSet("claim", rank)) waiting.push_back(rank);
  }
  if (waiting.empty()) return;
  for (const Worker& worker : workers_) {
    if (worker.exited_before_joining.empty()) continue;
    Fail(absl::StrCat(worker.exited_before_joining, "; ", RankList(waiting),
                      waiting.size() == 1 ? " was" : " were",
                      " waiting for it in the rendezvous"),
         1);
    return;
  }
}

void Launcher::OnStartDeadline() {
  start_deadline_ = absl::InfiniteFuture();
  // missing: never reached the store; stuck: reached it, not joined;
  // waiting: every rank that reached it (joined or not).
  std::vector<int> missing, stuck, waiting;
  for (const Worker& worker : workers_) {
    const int rank = worker.placement.rank;
    const bool ready = RankSet("ready", rank);
    const bool claimed = ready || RankSet("claim", rank);
    if (claimed) waiting.push_back(rank);
    if (!claimed) missing.push_back(rank);
    if (claimed && !ready) stuck.push_back(rank);
  }
  if (missing.empty() && stuck.empty()) {
    if (options_.verbose) {
      Log(absl::StrCat("kolorun: all ", workers_.size(), " ranks joined"));
    }
    return;
  }
  const std::string timeout =
      absl::StrCat(FormatSeconds(options_.start_timeout), " s (start timeout)");
  if (missing.empty()) {
    Fail(absl::StrCat("kolorun: ", RankList(stuck),
                      " reached the rendezvous store but did not finish "
                      "joining within ",
                      timeout),
         1);
    return;
  }
  Fail(absl::StrCat("kolorun: ", RankList(missing),
                    " did not reach the rendezvous store within ", timeout,
                    waiting.empty()
                        ? ""
                        : absl::StrCat("; ", RankList(waiting),
                                       waiting.size() == 1 ? " was" : " were",
                                       " waiting for ",
                                       missing.size() == 1 ? "it" : "them")),
       1);
}

void Launcher::Fail(const std::string& message, int exit_code,
                    Teardown teardown) {
  if (!failed_) {
    failed_ = true;
    exit_code_ = exit_code;
    Log(message);
  }
  if (phase_ != Phase::kRunning) return;
  if (teardown == Teardown::kAfterReports && kReportGrace > absl::ZeroDuration()) {
    phase_ = Phase::kReporting;
    start_deadline_ = absl::InfiniteFuture();
    report_deadline_ = absl::Now() + kReportGrace;
    return;
  }
  BeginTeardown();
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
  report_deadline_ = absl::InfiniteFuture();
  for (Worker& worker : workers_) {
    if (worker.placement.remote) {
      // The guard sees its standard input close and ends the rank: SIGTERM,
      // then SIGKILL after the same grace period (Note [Remote ranks]).
      if (worker.stdin_fd >= 0) {
        close(worker.stdin_fd);
        worker.stdin_fd = -1;
      }
      continue;
    }
    SignalWorker(worker.pid, worker.running, SIGTERM);
    // A stopped process acts on SIGTERM only once continued.
    SignalWorker(worker.pid, worker.running, SIGCONT);
  }
  kill_deadline_ = absl::Now() + options_.grace_period;
  if (options_.grace_period <= absl::ZeroDuration()) {
    KillRemaining(/*wait_for_guards=*/true);
  }
}

void Launcher::KillRemaining(bool wait_for_guards) {
  phase_ = Phase::kKilling;
  bool remote_running = false;
  for (Worker& worker : workers_) {
    if (worker.stdin_fd >= 0) {
      close(worker.stdin_fd);
      worker.stdin_fd = -1;
    }
    if (worker.placement.remote) {
      remote_running |= worker.running;
      continue;
    }
    if (worker.running) {
      Log(absl::StrCat("kolorun: ", Name(worker, worker.pid),
                       " is still running, sending SIGKILL"));
    }
    SignalWorker(worker.pid, worker.running, SIGKILL);
  }
  ssh_kill_deadline_ = absl::Now() + kGuardSlack;
  give_up_deadline_ = ssh_kill_deadline_ + kReapAfterKill;
  if (!wait_for_guards || !remote_running) KillSsh();
}

void Launcher::KillSsh() {
  ssh_kill_deadline_ = absl::InfiniteFuture();
  for (Worker& worker : workers_) {
    if (!worker.placement.remote) continue;
    if (worker.running) {
      Log(absl::StrCat("kolorun: ", Name(worker, -1), ": ssh (pid ", worker.pid,
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

// Note [Elastic launcher]
// In elastic mode kolorun keeps the job going through the loss and arrival
// of workers (Note [Generations of a job] in elastic.h): a worker that fails
// (exits non-zero, dies of a signal, or is reported lost by a survivor: then
// kolorun kills it, since it may be hung) is removed, counted against its
// host (HostBook), and the current generation is asked to re-form
// (elastic/<g>/closing). The discovery script runs every
// --discovery-interval; free slots on hosts not blacklisted, up to
// --max-np, and hosts that disappeared also ask for a re-form. The next
// generation is formed (TryForm) once every member of the current one has
// left or is gone: its assignment is published in the store, survivors read
// it from there, newcomers are started with it in their environment.
// Workers exiting 0 mean the job is finishing: no generation forms after
// that ("done" is published for the next one, so that workers waiting for
// it exit). kolorun fails the job when fewer than --min-np workers remain
// (after --elastic-timeout with a discovery script, at once without one),
// or when the job would re-form more than --reset-limit times. Nothing here
// blocks but the discovery script (bounded by kDiscoveryTimeout).

namespace {


std::string MembersKey(int64_t generation) {
  return absl::StrCat("elastic/", generation, "/members");
}

}  // namespace

void Launcher::ElasticStart() {
  dev_null_for_spawn_ = open("/dev/null", O_RDONLY | O_CLOEXEC);
  for (char** entry = environ; entry && *entry; ++entry)
    inherited_.push_back(*entry);
  torch_addr_ = TorchMasterAddress(plan_);
  torch_port_ = FreeTcpPort();
  discovered_ = options_.hosts;
  if (discovered_.empty()) {
    discovered_.push_back({"localhost", options_.num_proc});
  }
  for (const HostSlots& host : discovered_) host_order_.push_back(host.name);
  std::vector<std::pair<int64_t, elastic::Assignment>> members;
  for (const RankPlacement& p : plan_.ranks) {
    elastic::Assignment a;
    a.member = true;
    a.rank = p.rank;
    a.size = static_cast<int>(plan_.ranks.size());
    a.local_rank = p.local_rank;
    a.local_size = p.local_size;
    a.cross_rank = p.cross_rank;
    a.cross_size = p.cross_size;
    members.emplace_back(p.rank, a);
  }
  next_id_ = static_cast<int64_t>(plan_.ranks.size());
  absl::Status s = store_->Set(MembersKey(0), elastic::FormatMembers(members));
  if (s.ok()) s = store_->Set("elastic/generation", "0");
  if (!s.ok()) {
    Fail(absl::StrCat("kolorun: cannot publish generation 0: ", s.message()), 1);
    return;
  }
  if (!options_.host_discovery_script.empty()) {
    discovery_deadline_ = absl::Now() + options_.discovery_interval;
  }
  workers_.reserve(plan_.ranks.size() * 4);
  for (const RankPlacement& placement : plan_.ranks) {
    RankEndpoint endpoint;
    endpoint.placement = placement;
    endpoint.store_addr = plan_.store_addr;
    endpoint.store_port = store_port_;
    endpoint.secret_fd = secret_fd_;
    endpoint.torch_master_addr = torch_addr_;
    endpoint.torch_master_port = torch_port_;
    endpoint.world_size = static_cast<int>(plan_.ranks.size());
    endpoint.elastic_id = placement.rank;
    endpoint.generation = 0;
    if (!Spawn(endpoint, secret_, inherited_, dev_null_for_spawn_)) break;
    workers_.back().elastic_id = placement.rank;
  }
  if (options_.verbose) {
    Log(absl::StrCat("kolorun: elastic job, generation 0: ",
                     plan_.ranks.size(), " workers (--min-np ",
                     options_.min_np, ", --max-np ", options_.max_np, ")"));
  }
}

bool Launcher::ElasticWaiting() const {
  return options_.elastic && phase_ == Phase::kRunning &&
         min_np_deadline_ != absl::InfiniteFuture();
}

void Launcher::RequestReform(const std::string& reason) {
  if (reform_ || finishing_) return;
  reform_ = true;
  reform_reason_ = reason;
  if (options_.verbose) {
    Log(absl::StrCat("kolorun: generation ", generation_, " re-forms: ", reason));
  }
  store_->Set(absl::StrCat("elastic/", generation_, "/closing"), reason)
      .IgnoreError();  // The local store cannot fail.
}

void Launcher::OnElasticEnd(Worker& worker, bool success,
                            const std::string& what) {
  const bool member = worker.generation == generation_;
  if (success) {
    if (options_.verbose) Log(what);
    if (member && !worker.removed && !finishing_ && !worker.left) {
      // A member finished its training: the job is ending; nobody waits
      // for a generation that will not come.
      finishing_ = true;
      store_->Set(MembersKey(generation_ + 1), "done").IgnoreError();
    }
    TryForm();
    return;
  }
  if (worker.killed) {
    TryForm();
    return;
  }
  if (finishing_) {
    Log(what);
    return;
  }
  const std::string host = worker.placement.host;
  Log(absl::StrCat(what, "; the job goes on without it (elastic)"));
  if (host_book_.RecordFailure(host, absl::Now())) {
    Log(absl::StrCat(
        "kolorun: host ", host, " is blacklisted ",
        options_.blacklist_cooldown == absl::ZeroDuration()
            ? std::string("for good")
            : absl::StrCat("for ", FormatSeconds(options_.blacklist_cooldown),
                           " s"),
        " after ", kBlacklistFailures, " failures of its workers: it gets no "
        "new workers until then"));
  }
  RequestReform(what.substr(std::string("kolorun: ").size()));
  TryForm();  // `worker` may move: not used after this.
}

void Launcher::OnElasticStoreChange() {
  // Exits already signalled come first: a worker the others report lost
  // has usually died, and says so itself.
  ReapChildren();
  for (size_t i = 0; i < workers_.size(); ++i) {
    Worker& worker = workers_[i];
    if (worker.generation != generation_ || worker.left) continue;
    const std::string key = absl::StrCat("elastic/", generation_, "/left/",
                                         worker.elastic_id);
    absl::StatusOr<bool> set = store_->Check(key);
    if (!set.ok() || !*set) continue;
    absl::StatusOr<std::string> value = store_->Get(key, absl::ZeroDuration());
    if (!value.ok()) continue;
    worker.left = true;
    int lost = -1;
    const size_t space = value->find(' ');
    const std::string reason =
        space == std::string::npos ? *value : value->substr(space + 1);
    if (!absl::SimpleAtoi(value->substr(0, space), &lost)) lost = -1;
    if (options_.verbose) {
      Log(absl::StrCat("kolorun: ", Name(worker, worker.pid),
                       " left generation ", generation_, ": ", reason));
    }
    for (Worker& other : workers_) {
      if (lost < 0 || other.generation != generation_ ||
          other.placement.rank != lost || !other.running || other.left ||
          other.killed || other.reported_lost != absl::InfiniteFuture()) {
        continue;
      }
      other.reported_lost = absl::Now();
      other.lost_report = absl::StrCat("was reported lost by rank ",
                                       worker.placement.rank, " (", reason, ")");
    }
    RequestReform(reason);
  }
  TryForm();
}

void Launcher::KillLostWorkers() {
  const absl::Time due = absl::Now() - kLostGrace;
  for (Worker& other : workers_) {
    if (other.reported_lost > due) continue;
    other.reported_lost = absl::InfiniteFuture();
    if (!other.running || other.killed) continue;
    // Still running but lost to the others: stopped, hung or cut off.
    Log(absl::StrCat("kolorun: ", Name(other, other.pid), " ",
                     other.lost_report,
                     "; killing it, the job goes on without it (elastic)"));
    other.killed = true;
    if (other.placement.remote) {
      if (other.stdin_fd >= 0) {
        close(other.stdin_fd);
        other.stdin_fd = -1;
      }
    } else {
      SignalWorker(other.pid, other.running, SIGKILL);
    }
    if (host_book_.RecordFailure(other.placement.host, absl::Now())) {
      Log(absl::StrCat("kolorun: host ", other.placement.host,
                       " is blacklisted after ", kBlacklistFailures,
                       " failures of its workers"));
    }
  }
}

std::vector<std::pair<std::string, int>> Launcher::FreeSlots() const {
  std::vector<std::pair<std::string, int>> free;
  if (options_.host_discovery_script.empty()) return free;  // Static hosts.
  const absl::Time now = absl::Now();
  for (const HostSlots& host : discovered_) {
    if (host_book_.Blacklisted(host.name, now)) continue;
    int used = 0;
    for (const Worker& w : workers_) {
      if (w.running && !w.removed && !w.killed && w.placement.host == host.name)
        ++used;
    }
    if (host.slots > used) free.emplace_back(host.name, host.slots - used);
  }
  return free;
}

void Launcher::OnDiscovery() {
  discovery_deadline_ = absl::Now() + options_.discovery_interval;
  absl::StatusOr<std::string> output =
      RunDiscoveryScript(options_.host_discovery_script, kDiscoveryTimeout);
  absl::StatusOr<std::vector<HostSlots>> hosts =
      output.ok() ? ParseDiscoveryOutput(*output, options_.slots_per_host)
                  : absl::StatusOr<std::vector<HostSlots>>(output.status());
  if (!hosts.ok()) {
    // The hosts stay as they were; said once per kind of trouble.
    const std::string message =
        absl::StrCat("kolorun: ", hosts.status().message(),
                     "; keeping the hosts it printed last");
    if (message != last_discovery_error_) Log(message);
    last_discovery_error_ = message;
    return;
  }
  last_discovery_error_.clear();
  std::vector<std::string> changes;
  for (const HostSlots& host : *hosts) {
    if (std::find(host_order_.begin(), host_order_.end(), host.name) ==
        host_order_.end()) {
      host_order_.push_back(host.name);
    }
  }
  // Workers beyond what a host now offers (all of them for a host no longer
  // printed) leave: the newest first.
  for (const HostSlots& old : discovered_) {
    auto now_host = std::find_if(hosts->begin(), hosts->end(),
                                 [&](const HostSlots& h) { return h.name == old.name; });
    const int slots = now_host == hosts->end() ? 0 : now_host->slots;
    std::vector<Worker*> on_host;
    for (Worker& w : workers_) {
      if (w.running && !w.removed && !w.killed && w.placement.host == old.name)
        on_host.push_back(&w);
    }
    for (int i = static_cast<int>(on_host.size()) - 1; i >= slots; --i) {
      on_host[i]->removed = true;
      changes.push_back(absl::StrCat(Name(*on_host[i], on_host[i]->pid),
                                     " leaves (host ", old.name,
                                     slots == 0 ? " removed" : " has fewer slots",
                                     ")"));
    }
  }
  discovered_ = *std::move(hosts);
  int running = 0;
  for (const Worker& w : workers_) {
    if (w.running && !w.removed && !w.killed) ++running;
  }
  int free = 0;
  for (const auto& [host, slots] : FreeSlots()) free += slots;
  if (free > 0 && running < options_.max_np) {
    changes.push_back(absl::StrCat(std::min(free, options_.max_np - running),
                                   " new slot", free == 1 ? "" : "s"));
  }
  if (!changes.empty()) {
    if (!reform_ && options_.verbose) {
      Log(absl::StrCat("kolorun: hosts changed: ", absl::StrJoin(changes, ", ")));
    }
    RequestReform(absl::StrCat("hosts changed: ", absl::StrJoin(changes, ", ")));
  }
  TryForm();
}

void Launcher::TryForm() {
  if (!reform_ || finishing_ || phase_ != Phase::kRunning) return;
  for (const Worker& w : workers_) {
    if (w.generation == generation_ && w.running && !w.left) return;
  }
  std::vector<Candidate> candidates;
  std::vector<size_t> survivors;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    if (w.generation != generation_ || !w.running || w.removed || w.killed)
      continue;
    candidates.push_back({w.elastic_id, w.placement.host, w.placement.rank});
    survivors.push_back(i);
  }
  std::vector<int64_t> newcomer_ids;
  for (const auto& [host, slots] : FreeSlots()) {
    for (int k = 0; k < slots; ++k) {
      if (static_cast<int>(candidates.size()) >= options_.max_np) break;
      const int64_t id = next_id_ + static_cast<int64_t>(newcomer_ids.size());
      candidates.push_back({id, host, -1});
      newcomer_ids.push_back(id);
    }
  }
  const int count = static_cast<int>(candidates.size());
  if (count < options_.min_np) {
    const absl::Time now = absl::Now();
    if (!options_.host_discovery_script.empty() &&
        min_np_deadline_ == absl::InfiniteFuture()) {
      min_np_deadline_ = now + options_.elastic_timeout;
      Log(absl::StrCat("kolorun: ", count, " worker", count == 1 ? "" : "s",
                       " left, fewer than --min-np ", options_.min_np,
                       "; waiting up to ", FormatSeconds(options_.elastic_timeout),
                       " s (--elastic-timeout) for the discovery script to "
                       "offer more slots"));
      return;
    }
    if (now < min_np_deadline_ && min_np_deadline_ != absl::InfiniteFuture())
      return;
    min_np_deadline_ = absl::InfiniteFuture();
    Fail(absl::StrCat(
             "kolorun: only ", count, " worker", count == 1 ? "" : "s",
             " left, fewer than --min-np ", options_.min_np,
             options_.host_discovery_script.empty()
                 ? ""
                 : absl::StrCat(", and no slots were added within ",
                                FormatSeconds(options_.elastic_timeout),
                                " s (--elastic-timeout)"),
             "; the job ends after: ", reform_reason_),
         1);
    return;
  }
  min_np_deadline_ = absl::InfiniteFuture();
  if (options_.reset_limit >= 0 && resets_ >= options_.reset_limit) {
    Fail(absl::StrCat("kolorun: the job re-formed ", resets_, " time",
                      resets_ == 1 ? "" : "s", " already (--reset-limit ",
                      options_.reset_limit, "); it ends after: ",
                      reform_reason_),
         1);
    return;
  }
  ++resets_;
  const int64_t generation = generation_ + 1;
  const std::vector<std::pair<int64_t, elastic::Assignment>> assignments =
      AssignRanks(candidates, host_order_, generation);
  // The store keeps the old generation's keys: a worker that has not read
  // them yet still finds them.
  store_->Set(MembersKey(generation), elastic::FormatMembers(assignments))
      .IgnoreError();
  store_->Set("elastic/generation", absl::StrCat(generation)).IgnoreError();
  generation_ = generation;
  reform_ = false;
  const std::string why = reform_reason_;
  reform_reason_.clear();
  next_id_ += static_cast<int64_t>(newcomer_ids.size());

  auto placement_of = [&](int64_t id, const std::string& host) {
    RankPlacement p;
    for (const auto& [member, a] : assignments) {
      if (member != id) continue;
      p.rank = a.rank;
      p.local_rank = a.local_rank;
      p.local_size = a.local_size;
      p.cross_rank = a.cross_rank;
      p.cross_size = a.cross_size;
    }
    p.host = host;
    p.remote = !IsLocalHost(host);
    return p;
  };
  for (size_t i : survivors) {
    Worker& w = workers_[i];
    w.placement = placement_of(w.elastic_id, w.placement.host);
    w.generation = generation;
    w.left = false;
    w.out->set_rank(w.placement.rank);
    w.err->set_rank(w.placement.rank);
  }
  Log(absl::StrCat("kolorun: generation ", generation, ": ", count, " worker",
                   count == 1 ? "" : "s",
                   newcomer_ids.empty()
                       ? std::string()
                       : absl::StrCat(" (", newcomer_ids.size(), " new)"),
                   ", after: ", why));
  for (int64_t id : newcomer_ids) {
    std::string host;
    for (const Candidate& c : candidates) {
      if (c.id == id) host = c.host;
    }
    RankEndpoint endpoint;
    endpoint.placement = placement_of(id, host);
    endpoint.store_addr = plan_.store_addr;
    endpoint.store_port = store_port_;
    endpoint.secret_fd = secret_fd_;
    endpoint.torch_master_addr = torch_addr_;
    endpoint.torch_master_port = torch_port_;
    endpoint.world_size = count;
    endpoint.elastic_id = id;
    endpoint.generation = generation;
    if (endpoint.placement.remote &&
        absl::StartsWith(plan_.store_addr, "127.")) {
      Fail(absl::StrCat("kolorun: cannot start a worker on ", host,
                        ": kolorun's store listens on ", plan_.store_addr,
                        ", which ", host, " cannot reach; start elastic jobs "
                        "whose discovery script may add other hosts with "
                        "--network-interface NAME"),
           1);
      return;
    }
    if (endpoint.placement.remote && plan_.guard_path.empty()) {
      Fail(absl::StrCat("kolorun: cannot start a worker on ", host,
                        ": kolo_rank_guard was not found next to kolorun"),
           1);
      return;
    }
    // Messages name hosts from now on.
    if (endpoint.placement.remote) grew_beyond_host_ = true;
    if (!Spawn(endpoint, secret_, inherited_, dev_null_for_spawn_)) return;
    workers_.back().elastic_id = id;
    workers_.back().generation = generation;
  }
}

}  // namespace kolorun
}  // namespace kolo
