// Launcher: runs one kolo job, on this machine or on several hosts, from
// start to teardown.
//
// Note [Launcher lifecycle]
// 0. A guard process is forked that kills the job's process groups should
//    kolorun die without tearing them down (Note [Job guard]).
// 1. A fresh job secret goes into a sealed memory file that the local
//    workers inherit (KOLO_SECRET_FD, Note [Secret without a file]); the
//    rendezvous store (TcpStoreServer) listens on the job's store address
//    (JobPlan: loopback for a job on this machine, else the address of
//    --network-interface or the one that routes to the first remote host),
//    port chosen by the kernel.
// 2. N workers are started, each in its own process group, with the KOLO_*
//    environment of its rank and its stdout/stderr on pipes: local ranks
//    forked directly, remote ranks through ssh under kolo_rank_guard (Note
//    [Remote ranks] in remote.h), whose standard input is a pipe kolorun
//    holds open.
// 3. One poll() loop waits on every output pipe, a self-pipe carrying
//    SIGCHLD/SIGINT/SIGTERM/SIGHUP/SIGQUIT, and the next deadline: the start
//    timeout (every rank must have set `kolo/ready/<rank>` in the store by
//    then), or during teardown the end of the grace period. Nothing sleeps.
// 4. The first failure (a worker that exits non-zero or by a signal, on any
//    host; ssh failing; a missing rank at the start timeout; a signal to
//    kolorun) is reported once, naming host, rank and exit status, and starts
//    the teardown: SIGTERM (and SIGCONT, for stopped workers) to every local
//    worker's process group, and for remote ranks kolorun closes the guard's
//    standard input, upon which the guard does the same on its host; SIGKILL
//    to whatever is left after the grace period (for remote ranks: to ssh,
//    whose death ends the guard's wait too); a second SIGINT/SIGTERM skips
//    the rest of the grace period. kolorun is a child subreaper, so that
//    processes the workers started are reaped by it too; the job ends when
//    every process group is empty.
// 5. The store stops, the secret file is removed, and kolorun exits: 0 if
//    every worker exited 0, 1 after a failure, 128+n after signal n.
// If kolorun itself is killed (kill -9), local workers and ssh get SIGKILL
// (PR_SET_PDEATHSIG); the guards see their standard input close and end the
// remote ranks.
//
// Thread safety: Run() is called once, from the main thread (signal
// dispositions are process-wide).
#ifndef KOLO_TOOLS_KOLORUN_LAUNCHER_H_
#define KOLO_TOOLS_KOLORUN_LAUNCHER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/store.h"
#include "runtime/os/unique_fd.h"
#include "tools/kolorun/args.h"
#include "tools/kolorun/elastic.h"
#include "tools/kolorun/hosts.h"
#include "tools/kolorun/job.h"
#include "tools/kolorun/job_guard.h"
#include "tools/kolorun/output.h"
#include "tools/kolorun/process.h"
#include "tools/kolorun/signals.h"

namespace kolo {
namespace kolorun {

class Launcher {
 public:
  Launcher(LaunchOptions options, JobPlan plan);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Runs the job (Note [Launcher lifecycle]) and returns kolorun's exit
  // status. Blocks until every worker has been reaped.
  int Run();

 private:
  struct Worker {
    RankPlacement placement;
    pid_t pid = -1;  // Also the process group id. ssh for remote ranks.
    bool running = false;
    os::UniqueFd stdin_fd;  // Remote: the guard's standard input (ssh's).
    // Remote: how the rank ended, from the guard's status line.
    bool status_known = false;
    pid_t remote_pid = -1;
    int remote_wait_status = 0;
    os::UniqueFd log_fd;  // --output-filename
    std::unique_ptr<LineForwarder> out;
    std::unique_ptr<LineForwarder> err;
    // How it ended, if it exited 0 before it finished the rendezvous
    // (Note [Failures at start]); empty otherwise.
    std::string exited_before_joining;
    // Elastic mode (Note [Elastic launcher] in launcher.cc): the worker's
    // id, the generation it belongs to (or left last), whether it left that
    // generation, whether its host was removed (it gets no place in the
    // next one), whether kolorun killed it as lost (its end is no news).
    int64_t elastic_id = -1;
    int64_t generation = 0;
    bool left = false;
    bool removed = false;
    bool killed = false;
    // When a survivor reported it lost while it still ran (it may be
    // exiting: kolorun kills it only if it still runs kLostGrace later),
    // by whom and why.
    absl::Time reported_lost = absl::InfiniteFuture();
    std::string lost_report;
  };
  // kReporting: a worker failed on its own; the others get kReportGrace to
  // report what they saw (e.g. "rank 1 lost") and exit before the teardown.
  enum class Phase { kRunning, kReporting, kTerminating, kKilling };
  enum class Teardown { kNow, kAfterReports };

  // Where a worker at `placement` finds the job (store, secret, torch's
  // rendezvous).
  RankEndpoint EndpointFor(const RankPlacement& placement) const;
  // Starts one worker; false (after Fail) if it could not be started.
  bool Spawn(const RankEndpoint& endpoint);
  void EventLoop();
  // Elastic mode (Note [Elastic launcher] in launcher.cc).
  void ElasticStart();
  void OnElasticEnd(Worker& worker, bool success, const std::string& what);
  void OnElasticStoreChange();
  void OnDiscovery();
  // Kills the workers reported lost kLostGrace ago that still run.
  void KillLostWorkers();
  // Counts a failure against `host` and says when that blacklists it.
  void RecordHostFailure(const std::string& host);
  // Asks the current generation to re-form (elastic/<g>/closing).
  void RequestReform(const std::string& reason);
  // Forms the next generation once every member has left or is gone.
  void TryForm();
  // Free slots on hosts that may get new workers now, per host.
  std::vector<std::pair<std::string, int>> FreeSlots() const;
  // Whether the job waits for workers it has not started yet.
  bool ElasticWaiting() const;
  void OnSignal(int signo);
  void ReapChildren();
  void OnStartDeadline();
  // Note [Failures at start]: fails the job if a rank exited before it
  // joined while others wait for it.
  void CheckEarlyExits();
  // Whether `rank` set the store key `kolo/<what>/<rank>`.
  bool RankSet(const char* what, int rank) const;
  bool AnyRankSet(const char* what) const;
  // "rank 2" / "ranks [1, 3 on hostB]".
  std::string RankList(const std::vector<int>& ranks) const;
  // Reports `message` as the job's failure (first one only) with `exit_code`
  // and starts the teardown, at once or after the report grace.
  void Fail(const std::string& message, int exit_code,
            Teardown teardown = Teardown::kNow);
  void BeginTeardown();
  // SIGKILL to the local workers; ssh of remote ranks gets it too, after
  // kGuardSlack if `wait_for_guards` (the guards end their ranks themselves
  // at the end of the grace period), else at once.
  void KillRemaining(bool wait_for_guards);
  // SIGKILL to the ssh of every remote rank still running.
  void KillSsh();
  // Prints what a rank hidden by --output-ranks last wrote to stderr.
  void ShowHiddenTail(const Worker& worker);
  bool AllWorkersReaped() const;
  bool AnyProcessGroupAlive() const;
  absl::Time NextDeadline() const;
  void Log(const std::string& message) const;
  // Whether messages name hosts: the job runs (or, in elastic mode, ran)
  // on more than this machine.
  bool MultiHost() const { return plan_.multi_host || grew_beyond_host_; }
  // "rank 2 on hostB (pid 123)" / "rank 2 (pid 123)" for one-host jobs.
  std::string Name(const Worker& worker, pid_t pid) const;
  // How `worker` ended, given ssh's or the local worker's wait status;
  // `*success` tells whether that is a clean exit.
  std::string DescribeEnd(const Worker& worker, int wait_status,
                          bool* success) const;

  const LaunchOptions options_;
  // What Spawn() needs, set once the store listens.
  int store_port_ = 0;
  std::string secret_;
  int secret_fd_ = -1;  // borrowed from Run()'s SecretDescriptor
  std::vector<std::string> inherited_;  // kolorun's environment
  os::UniqueFd dev_null_;               // the workers' standard input
  std::string torch_addr_;
  int torch_port_ = 0;
  // Elastic state.
  int64_t generation_ = 0;
  int64_t next_id_ = 0;
  int resets_ = 0;
  bool reform_ = false;
  std::string reform_reason_;
  bool finishing_ = false;
  std::vector<HostSlots> discovered_;
  std::vector<std::string> host_order_;
  HostBook host_book_{options_.blacklist_cooldown};
  absl::Time discovery_deadline_ = absl::InfiniteFuture();
  absl::Time min_np_deadline_ = absl::InfiniteFuture();
  std::string last_discovery_error_;
  bool grew_beyond_host_ = false;
  const JobPlan plan_;
  std::unique_ptr<JobGuard> guard_;
  std::unique_ptr<SignalPipe> signals_;
  // Rung by the store on every change (its server lives only in Run());
  // read by the poll loop.
  os::Pipe store_changed_;
  std::string status_token_;  // Names the guards' status lines.
  const std::vector<Cpu> allowed_cpus_ = AllowedCpus();  // Note [Binding]
  std::shared_ptr<Store> store_;
  std::vector<Worker> workers_;
  std::map<pid_t, size_t> worker_by_pid_;

  Phase phase_ = Phase::kRunning;
  int exit_code_ = 0;
  bool failed_ = false;
  absl::Time start_deadline_ = absl::InfiniteFuture();
  absl::Time report_deadline_ = absl::InfiniteFuture();
  absl::Time kill_deadline_ = absl::InfiniteFuture();
  absl::Time ssh_kill_deadline_ = absl::InfiniteFuture();
  absl::Time give_up_deadline_ = absl::InfiniteFuture();
};

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_LAUNCHER_H_
