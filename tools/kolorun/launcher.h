// Launcher: runs one local kolo job from start to teardown.
//
// Note [Launcher lifecycle]
// 1. A fresh job secret goes into a 0600 file (KOLO_SECRET_FILE); the
//    rendezvous store (TcpStoreServer) listens on 127.0.0.1, port chosen by
//    the kernel.
// 2. N workers are forked, each in its own process group, with the KOLO_*
//    environment of its rank and its stdout/stderr on pipes.
// 3. One poll() loop waits on every output pipe, a self-pipe carrying
//    SIGCHLD/SIGINT/SIGTERM/SIGHUP/SIGQUIT, and the next deadline: the start
//    timeout (every rank must have set `kolo/ready/<rank>` in the store by
//    then), or during teardown the end of the grace period. Nothing sleeps.
// 4. The first failure (a worker that exits non-zero or by a signal, a missing
//    rank at the start timeout, or a signal to kolorun) is reported once and
//    starts the teardown: SIGTERM (and SIGCONT, for stopped workers) to every
//    worker's process group, SIGKILL to whatever is left after the grace
//    period; a second SIGINT/SIGTERM skips the rest of the grace period.
//    kolorun is a child subreaper, so that processes the workers started are
//    reaped by it too; the job ends when every process group is empty.
// 5. The store stops, the secret file is removed, and kolorun exits: 0 if
//    every worker exited 0, 1 after a failure, 128+n after signal n.
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

#include "absl/time/time.h"
#include "kolo/store.h"
#include "tools/kolorun/args.h"
#include "tools/kolorun/output.h"
#include "tools/kolorun/signals.h"

namespace kolo {
namespace kolorun {

// The environment of worker `rank`: `inherited` ("NAME=value" entries)
// without KOLO_SECRET, plus the KOLO_* variables of Note [Launcher lifecycle]
// and OMP_NUM_THREADS = max(1, cpus / num_proc) unless already set.
std::vector<std::string> WorkerEnvironment(
    const std::vector<std::string>& inherited, const LaunchOptions& options,
    int rank, int store_port, const std::string& secret_path, int cpus);

// CPUs this process may run on (its affinity mask).
int AvailableCpus();

class Launcher {
 public:
  explicit Launcher(LaunchOptions options);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Runs the job (Note [Launcher lifecycle]) and returns kolorun's exit
  // status. Blocks until every worker has been reaped.
  int Run();

 private:
  struct Worker {
    int rank = 0;
    pid_t pid = -1;  // Also the process group id.
    bool running = false;
    std::unique_ptr<LineForwarder> out;
    std::unique_ptr<LineForwarder> err;
  };
  enum class Phase { kRunning, kTerminating, kKilling };

  // Starts the workers; stops at (and reports) the first that cannot start.
  void SpawnAll(int store_port, const std::string& secret_path);
  void EventLoop();
  void OnSignal(int signo);
  void ReapChildren();
  void OnStartDeadline();
  // Reports `message` as the job's failure (first one only) with `exit_code`
  // and starts the teardown.
  void Fail(const std::string& message, int exit_code);
  void BeginTeardown();
  void KillRemaining();
  bool AllWorkersReaped() const;
  bool AnyProcessGroupAlive() const;
  absl::Time NextDeadline() const;
  void Log(const std::string& message) const;

  const LaunchOptions options_;
  std::unique_ptr<SignalPipe> signals_;
  std::shared_ptr<Store> store_;
  std::vector<Worker> workers_;
  std::map<pid_t, size_t> worker_by_pid_;

  Phase phase_ = Phase::kRunning;
  int exit_code_ = 0;
  bool failed_ = false;
  absl::Time start_deadline_ = absl::InfiniteFuture();
  absl::Time kill_deadline_ = absl::InfiniteFuture();
  absl::Time give_up_deadline_ = absl::InfiniteFuture();
};

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_LAUNCHER_H_
