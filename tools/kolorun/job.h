// What kolorun decides before it starts anything: where each rank runs,
// where the rendezvous store listens, and each worker's environment.
#ifndef KOLO_TOOLS_KOLORUN_JOB_H_
#define KOLO_TOOLS_KOLORUN_JOB_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/kolorun/args.h"
#include "tools/kolorun/hosts.h"

namespace kolo {
namespace kolorun {

// Everything decided before any process starts.
struct JobPlan {
  std::vector<RankPlacement> ranks;
  // Where the rendezvous store listens; workers get it as
  // KOLO_RENDEZVOUS_ADDR.
  std::string store_addr = "127.0.0.1";
  // Why that address, for --verbose.
  std::string store_addr_reason = "loopback: every rank runs here";
  // kolo_rank_guard, when some rank is remote.
  std::string guard_path;
  // Whether some rank runs elsewhere than here (messages name hosts).
  bool multi_host = false;
};

// Places the ranks (PlaceRanks with IsLocalHost), chooses the store address
// and finds the guard. InvalidArgument (a usage error: nothing has started)
// for too few slots, an unknown --network-interface, a first remote host
// with no route, or a missing kolo_rank_guard.
absl::StatusOr<JobPlan> PlanJob(const LaunchOptions& options);

// What this machine lets kolorun start. Read by CheckResources(); tests
// build it by hand.
struct ResourceLimits {
  // Descriptors kolorun may open (RLIMIT_NOFILE, soft limit raised to the
  // hard one by ReadResourceLimits).
  int64_t descriptors = 1024;
  // Processes and threads kolorun may still start: the tightest of the
  // cgroups' pids.max - pids.current up the hierarchy, RLIMIT_NPROC (not
  // for root), and the kernel's pid_max and threads-max; -1: no limit found.
  int64_t processes = -1;
  // Where `processes` comes from, for the message.
  std::string processes_source;
};
ResourceLimits ReadResourceLimits();

// InvalidArgument, before anything starts, when the job cannot be started
// within `limits`: every local worker costs kolorun descriptors (its output
// pipes, its store connection) and a process (or ssh for a remote one).
absl::Status CheckResources(const LaunchOptions& options, const JobPlan& plan,
                            const ResourceLimits& limits);

// Where a rank's job variables point.
struct RankEndpoint {
  RankPlacement placement;
  std::string store_addr = "127.0.0.1";
  int store_port = 0;
  // Local ranks only: the descriptor holding the job secret (Note [Secret
  // without a file] in secret_fd.h), -1: none.
  int secret_fd = -1;
  // torch.distributed's env:// rendezvous (Note [torch.distributed's
  // variables] in job.cc): where rank 0's TCPStore will listen.
  std::string torch_master_addr;
  int torch_master_port = 0;
  // Elastic mode: the job's size in the worker's first generation (0:
  // -np), the worker's id (KOLO_ELASTIC_ID; -1: not elastic) and that
  // generation (KOLO_ELASTIC_GENERATION).
  int world_size = 0;
  int64_t elastic_id = -1;
  int64_t generation = 0;
};

// Where torch.distributed's rank 0 listens under kolorun: rank 0's host
// (plan.store_addr when it runs here, its host name otherwise).
std::string TorchMasterAddress(const JobPlan& plan);
// A TCP port free on this machine now (0 if none was found), for
// MASTER_PORT.
int FreeTcpPort();

// The complete environment of a local worker: `inherited` ("NAME=value"
// entries) without KOLO_SECRET*, plus the job variables of `endpoint`
// (KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_*, KOLO_CROSS_*, KOLO_RENDEZVOUS_*,
// KOLO_SECRET_FD, KOLO_LAUNCHER=kolorun), the same ranks under Horovod's
// names (HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_*, HOROVOD_CROSS_*, as
// horovodrun exports them), torch.distributed's RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK and (unless set) MASTER_ADDR and
// MASTER_PORT, KOLO_IFACE (--network-interface) and KOLO_LOG_LEVEL
// (--log-level) when given, the -x variables, KOLO_START_TIMEOUT and
// PYTHONUNBUFFERED=1 unless set, and OMP_NUM_THREADS = max(1, cpus / local
// size) unless set.
std::vector<std::string> WorkerEnvironment(
    const std::vector<std::string>& inherited, const LaunchOptions& options,
    const RankEndpoint& endpoint, int cpus);

// What a remote worker gets on top of its login environment (through the
// guard): the job variables but KOLO_SECRET_FD (the guard makes its own),
// kolorun's other KOLO_* variables but KOLO_SECRET*, PATH, LD_LIBRARY_PATH
// and OMP_NUM_THREADS when set here, KOLO_IFACE, KOLO_LOG_LEVEL and
// KOLO_START_TIMEOUT as for local workers, and the -x variables. (The guard
// sets OMP_NUM_THREADS from the remote host's CPUs if it is still unset.)
std::vector<std::string> RemoteWorkerEnvironment(
    const std::vector<std::string>& inherited, const LaunchOptions& options,
    const RankEndpoint& endpoint);

// CPUs this process may run on (its affinity mask).
int AvailableCpus();

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_JOB_H_
