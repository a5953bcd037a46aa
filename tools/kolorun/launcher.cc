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
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/net/secure_channel.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/poll_timeout.h"
#include "runtime/rendezvous/tcp_store.h"
#include "tools/kolorun/job_guard.h"
#include "tools/kolorun/process.h"
#include "tools/kolorun/remote.h"
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
// Lines of stderr kept for a rank that --output-ranks hides, shown if it
// fails.
constexpr size_t kHiddenTailLines = 20;

using os::ErrnoText;

}  // namespace

Launcher::Launcher(LaunchOptions options, JobPlan plan)
    : options_(std::move(options)), plan_(std::move(plan)) {}

Launcher::~Launcher() = default;

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
                     options_.output_dir, ": ", ErrnoText(errno)));
    return 1;
  }
  absl::StatusOr<os::Pipe> store_changed = os::MakePipe(O_CLOEXEC | O_NONBLOCK);
  if (!store_changed.ok()) {
    Log(absl::StrCat("kolorun: ", store_changed.status().message()));
    return 1;
  }
  store_changed_ = *std::move(store_changed);
  rendezvous::ServerOptions server_options;
  // The store's thread only rings; the poll loop reads the store.
  const int changed_fd = store_changed_.write_end.get();
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

  // What every Spawn() needs, also for elastic newcomers later.
  store_port_ = port;
  secret_ = secret;
  secret_fd_ = (*secret_fd)->fd();
  dev_null_.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
  for (char** entry = environ; entry && *entry; ++entry)
    inherited_.push_back(*entry);
  torch_addr_ = TorchMasterAddress(plan_);
  torch_port_ = FreeTcpPort();
  workers_.reserve(plan_.ranks.size());
  start_deadline_ = absl::Now() + options_.start_timeout;
  if (options_.elastic) {
    // Every generation's rendezvous has the runtime's own start timeout.
    start_deadline_ = absl::InfiniteFuture();
    ElasticStart();
  } else {
    for (const RankPlacement& placement : plan_.ranks) {
      if (!Spawn(EndpointFor(placement))) break;
    }
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

RankEndpoint Launcher::EndpointFor(const RankPlacement& placement) const {
  RankEndpoint endpoint;
  endpoint.placement = placement;
  endpoint.store_addr = plan_.store_addr;
  endpoint.store_port = store_port_;
  endpoint.secret_fd = secret_fd_;
  endpoint.torch_master_addr = torch_addr_;
  endpoint.torch_master_port = torch_port_;
  return endpoint;
}

namespace {

// A pipe for a remote rank's standard input, holding `request` already:
// the read end for ssh, the write end for kolorun to close at teardown.
absl::StatusOr<os::Pipe> RequestPipe(const std::string& request) {
  absl::StatusOr<os::Pipe> pipe = os::MakePipe(O_CLOEXEC);
  if (!pipe.ok()) return pipe.status();
  const int fd = pipe->write_end.get();
  // The whole request must fit, so that writing it never waits for ssh.
  fcntl(fd, F_SETPIPE_SZ, 1 << 20);
  const int capacity = fcntl(fd, F_GETPIPE_SZ);
  fcntl(fd, F_SETFL, O_NONBLOCK);
  if (capacity < static_cast<int>(request.size()) ||
      write(fd, request.data(), request.size()) !=
          static_cast<ssize_t>(request.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the environment for the remote rank is too large (",
                     request.size(), " bytes)"));
  }
  return pipe;
}

}  // namespace

bool Launcher::Spawn(const RankEndpoint& endpoint) {
  const std::string& secret = secret_;
  const std::vector<std::string>& inherited = inherited_;
  const int dev_null = dev_null_.get();
  const RankPlacement& placement = endpoint.placement;
  const int rank = placement.rank;
  const std::string where =
      MultiHost() ? absl::StrCat(" on ", placement.host) : "";
  Worker worker;
  worker.placement = placement;
  if (!options_.output_dir.empty()) {
    const std::string path =
        absl::StrCat(options_.output_dir, "/rank.", rank, ".log");
    worker.log_fd.reset(
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC,
             0644));
    if (!worker.log_fd.valid()) {
      Fail(absl::StrCat("kolorun: cannot open ", path, ": ", ErrnoText(errno)),
           1);
      return false;
    }
  }
  // Every descriptor here closes on every way out: what the worker
  // inherited (the write ends, ssh's request pipe) once it is started, the
  // rest with the Worker.
  absl::StatusOr<os::Pipe> out_pipe = os::MakePipe(O_CLOEXEC);
  absl::StatusOr<os::Pipe> err_pipe =
      out_pipe.ok() ? os::MakePipe(O_CLOEXEC) : out_pipe.status();
  if (!err_pipe.ok()) {
    Fail(absl::StrCat("kolorun: cannot start rank ", rank, where, ": ",
                      err_pipe.status().message()),
         1);
    return false;
  }
  WorkerLaunch launch;
  // Workers run in their own process groups, outside the terminal's
  // foreground group: reading a terminal would stop them (SIGTTIN).
  launch.stdin_fd = dev_null >= 0 ? dev_null : out_pipe->read_end.get();
  launch.stdout_fd = out_pipe->write_end.get();
  launch.stderr_fd = err_pipe->write_end.get();
  os::Pipe request_pipe;
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
    absl::StatusOr<os::Pipe> request_fds =
        RequestPipe(EncodeGuardRequest(request));
    if (request_fds.ok()) {
      request_pipe = *std::move(request_fds);
    } else {
      prepared = request_fds.status();
    }
    launch.argv = SshCommand(options_, placement.host, rank, plan_.guard_path);
    launch.stdin_fd = request_pipe.read_end.get();
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
      launch.cpus =
          CpuShare(allowed_cpus_, placement.local_rank, placement.local_size);
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
  // The worker has its copies (or never will).
  out_pipe->write_end.reset();
  err_pipe->write_end.reset();
  request_pipe.read_end.reset();
  worker.stdin_fd = std::move(request_pipe.write_end);

  worker.pid = spawned.pid;
  worker.running = spawned.pid > 0;
  // The worker's process group (it leads it) ends with kolorun, whatever
  // happens to kolorun (Note [Job guard]).
  guard_->Watch(spawned.pid);
  ForwardOptions forward;
  forward.timestamps = options_.prefix_timestamp;
  forward.tag = options_.tag_output;
  forward.visible = options_.ShowsRank(rank);
  forward.log_fd = worker.log_fd.get();  // Borrowed: the Worker owns it.
  worker.out = std::make_unique<LineForwarder>(
      rank, std::move(out_pipe->read_end), STDOUT_FILENO, forward);
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
  worker.err = std::make_unique<LineForwarder>(
      rank, std::move(err_pipe->read_end), STDERR_FILENO, forward);
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
    fds.push_back({store_changed_.read_end.get(), POLLIN, 0});
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
    const int ready = poll(fds.data(), fds.size(), os::PollTimeoutMs(deadline));
    if (ready < 0 && errno != EINTR) {
      Fail(absl::StrCat("kolorun: poll failed: ", ErrnoText(errno)), 1);
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
        while (read(store_changed_.read_end.get(), drain, sizeof(drain)) > 0) {
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
    worker.stdin_fd.reset();
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
    } else if (!joined && phase_ == Phase::kRunning && AnyRankSet("claim")) {
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
  std::string text =
      absl::StrCat("kolorun: the last ", tail.size(), " lines rank ", rank,
                   " wrote to stderr (--output-ranks hides its output):\n");
  for (const std::string& line : tail) {
    absl::StrAppend(&text, "[", rank, "] ", line, "\n");
  }
  WriteFully(STDERR_FILENO, text);
}

bool Launcher::RankSet(const char* what, int rank) const {
  absl::StatusOr<bool> set =
      store_->Check(absl::StrCat("kolo/", what, "/", rank));
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
    names.push_back(
        absl::StrCat(rank, MultiHost() ? absl::StrCat(" on ", p.host) : ""));
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
  if (teardown == Teardown::kAfterReports &&
      kReportGrace > absl::ZeroDuration()) {
    phase_ = Phase::kReporting;
    start_deadline_ = absl::InfiniteFuture();
    report_deadline_ = absl::Now() + kReportGrace;
    return;
  }
  BeginTeardown();
}

void Launcher::BeginTeardown() {
  phase_ = Phase::kTerminating;
  start_deadline_ = absl::InfiniteFuture();
  report_deadline_ = absl::InfiniteFuture();
  for (Worker& worker : workers_) {
    if (worker.placement.remote) {
      // The guard sees its standard input close and ends the rank: SIGTERM,
      // then SIGKILL after the same grace period (Note [Remote ranks]).
      worker.stdin_fd.reset();
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
    worker.stdin_fd.reset();
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

}  // namespace kolorun
}  // namespace kolo
