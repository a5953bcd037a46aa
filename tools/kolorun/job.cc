#include "tools/kolorun/job.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/api/config.h"
#include "runtime/net/hosts.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/unique_fd.h"
#include "tools/kolorun/remote.h"

namespace kolo {
namespace kolorun {
namespace {

using Variables = std::vector<std::pair<std::string, std::string>>;

std::string EnvName(const std::string& entry) {
  return entry.substr(0, entry.find('='));
}

// Sets `name` in `vars`, replacing an earlier value.
void Set(Variables* vars, const std::string& name, std::string value) {
  for (auto& [existing, old_value] : *vars) {
    if (existing == name) {
      old_value = std::move(value);
      return;
    }
  }
  vars->emplace_back(name, std::move(value));
}

bool Has(const Variables& vars, const std::string& name) {
  return std::any_of(vars.begin(), vars.end(),
                     [&](const auto& v) { return v.first == name; });
}

const std::string* Inherited(const std::vector<std::string>& inherited,
                             const std::string& name) {
  for (const std::string& entry : inherited) {
    if (EnvName(entry) == name && entry.size() > name.size()) return &entry;
  }
  return nullptr;
}

// The variables kolorun sets for every worker, whatever the environment
// says: the job's, and those the options ask for.
Variables JobVariables(const std::vector<std::string>& inherited,
                       const LaunchOptions& options,
                       const RankEndpoint& endpoint) {
  const RankPlacement& p = endpoint.placement;
  const int world_size =
      endpoint.world_size > 0 ? endpoint.world_size : options.num_proc;
  Variables vars = {
      {"KOLO_RANK", absl::StrCat(p.rank)},
      {"KOLO_SIZE", absl::StrCat(world_size)},
      {"KOLO_LOCAL_RANK", absl::StrCat(p.local_rank)},
      {"KOLO_LOCAL_SIZE", absl::StrCat(p.local_size)},
      {"KOLO_CROSS_RANK", absl::StrCat(p.cross_rank)},
      {"KOLO_CROSS_SIZE", absl::StrCat(p.cross_size)},
      {"KOLO_RENDEZVOUS_ADDR", endpoint.store_addr},
      {"KOLO_RENDEZVOUS_PORT", absl::StrCat(endpoint.store_port)},
      // The store listens before any worker starts: a worker that cannot
      // reach it has a wrong address and says so at once.
      {"KOLO_LAUNCHER", "kolorun"},
      // Horovod's names, for scripts that read them (horovodrun exports
      // these).
      {"HOROVOD_RANK", absl::StrCat(p.rank)},
      {"HOROVOD_SIZE", absl::StrCat(world_size)},
      {"HOROVOD_LOCAL_RANK", absl::StrCat(p.local_rank)},
      {"HOROVOD_LOCAL_SIZE", absl::StrCat(p.local_size)},
      {"HOROVOD_CROSS_RANK", absl::StrCat(p.cross_rank)},
      {"HOROVOD_CROSS_SIZE", absl::StrCat(p.cross_size)},
  };
  // Note [torch.distributed's variables]
  // torch.distributed's default init_method (env://) reads RANK,
  // WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun sets them, with
  // LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK): kolorun sets them too, so
  // that `dist.init_process_group("kolo")` (or "gloo") needs no argument.
  // The ranks always come from kolorun; MASTER_ADDR and MASTER_PORT only
  // unless kolorun's environment (or -x) has them. Rank 0's torch process
  // listens there (its TCPStore, not kolo's: docs/security.md).
  Set(&vars, "RANK", absl::StrCat(p.rank));
  Set(&vars, "WORLD_SIZE", absl::StrCat(world_size));
  Set(&vars, "LOCAL_RANK", absl::StrCat(p.local_rank));
  Set(&vars, "LOCAL_WORLD_SIZE", absl::StrCat(p.local_size));
  Set(&vars, "GROUP_RANK", absl::StrCat(p.cross_rank));
  if (!Inherited(inherited, "MASTER_ADDR") &&
      !endpoint.torch_master_addr.empty()) {
    Set(&vars, "MASTER_ADDR", endpoint.torch_master_addr);
  }
  if (!Inherited(inherited, "MASTER_PORT") && endpoint.torch_master_port > 0) {
    Set(&vars, "MASTER_PORT", absl::StrCat(endpoint.torch_master_port));
  }
  if (endpoint.secret_fd >= 0) {
    Set(&vars, "KOLO_SECRET_FD", absl::StrCat(endpoint.secret_fd));
  }
  if (endpoint.elastic_id >= 0) {
    Set(&vars, "KOLO_ELASTIC_ID", absl::StrCat(endpoint.elastic_id));
    Set(&vars, "KOLO_ELASTIC_GENERATION", absl::StrCat(endpoint.generation));
    // Waiting for the next generation may take the whole elastic timeout
    // (kolorun waiting for --min-np workers), and then some.
    Set(&vars, "KOLO_ELASTIC_TIMEOUT",
        FormatSeconds(options.elastic_timeout + absl::Seconds(60)));
  }
  if (!options.network_interface.empty()) {
    Set(&vars, "KOLO_IFACE", options.network_interface);
  }
  if (!options.log_level.empty()) {
    Set(&vars, "KOLO_LOG_LEVEL", options.log_level);
  }
  // -x comes last and wins (it cannot name the job variables: ParseArgs).
  for (const ForwardedVariable& x : options.forwarded) {
    if (x.has_value) {
      Set(&vars, x.name, x.value);
    } else if (const std::string* entry = Inherited(inherited, x.name)) {
      Set(&vars, x.name, entry->substr(x.name.size() + 1));
    }
  }
  if (!Inherited(inherited, "KOLO_START_TIMEOUT") &&
      !Has(vars, "KOLO_START_TIMEOUT")) {
    Set(&vars, "KOLO_START_TIMEOUT", FormatSeconds(options.start_timeout));
  }
  // Python workers write through kolorun's pipes, where Python would
  // buffer whole blocks: unbuffered, their lines (and a dying worker's last
  // words) reach the console as they are written.
  if (!Inherited(inherited, "PYTHONUNBUFFERED") &&
      !Has(vars, "PYTHONUNBUFFERED")) {
    Set(&vars, "PYTHONUNBUFFERED", "1");
  }
  return vars;
}

// `inherited` entries that `keep` accepts and `vars` does not replace,
// followed by `vars`. KOLO_SECRET, KOLO_SECRET_FILE and KOLO_SECRET_FD
// never pass: the secret travels only in kolorun's own descriptor.
std::vector<std::string> Merge(
    const std::vector<std::string>& inherited, const Variables& vars,
    const std::function<bool(const std::string&)>& keep) {
  std::set<std::string> replaced = {"KOLO_SECRET", "KOLO_SECRET_FILE",
                                    "KOLO_SECRET_FD"};
  for (const auto& [name, value] : vars) replaced.insert(name);
  std::vector<std::string> env;
  for (const std::string& entry : inherited) {
    const std::string name = EnvName(entry);
    if (!replaced.count(name) && keep(name)) env.push_back(entry);
  }
  for (const auto& [name, value] : vars) {
    env.push_back(absl::StrCat(name, "=", value));
  }
  return env;
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(const LaunchOptions& options) {
  JobPlan plan;
  absl::StatusOr<std::vector<RankPlacement>> ranks =
      PlaceRanks(options.num_proc, options.hosts, IsLocalHost);
  if (!ranks.ok()) return ranks.status();
  plan.ranks = *std::move(ranks);
  const auto remote =
      std::find_if(plan.ranks.begin(), plan.ranks.end(),
                   [](const RankPlacement& p) { return p.remote; });
  plan.multi_host =
      plan.ranks.back().cross_size > 1 || remote != plan.ranks.end();
  if (!options.network_interface.empty()) {
    absl::StatusOr<std::string> addr =
        InterfaceAddress(options.network_interface);
    if (!addr.ok()) {
      // InterfaceAddress ends its message with the interfaces there are.
      const std::string message(addr.status().message());
      const size_t have = message.rfind(" (have: ");
      return absl::InvalidArgumentError(
          absl::StrCat("--network-interface ", options.network_interface,
                       ": no IPv4 interface of that name",
                       have == std::string::npos ? "" : message.substr(have)));
    }
    plan.store_addr = *addr;
    plan.store_addr_reason =
        absl::StrCat("the address of ", options.network_interface);
  } else if (remote != plan.ranks.end()) {
    absl::StatusOr<std::string> addr = LocalAddressFor(remote->host);
    if (!addr.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot choose the address remote workers reach kolorun at: ",
          addr.status().message(), "; pass --network-interface NAME"));
    }
    plan.store_addr = *addr;
    plan.store_addr_reason =
        absl::StrCat("the local address that routes to ", remote->host);
  }
  if (remote == plan.ranks.end() && options.elastic &&
      !options.host_discovery_script.empty()) {
    // Hosts the discovery script adds later may be remote.
    plan.guard_path = GuardPathNextToSelf();
    if (access(plan.guard_path.c_str(), X_OK) != 0) plan.guard_path.clear();
  }
  if (remote != plan.ranks.end()) {
    plan.guard_path = GuardPathNextToSelf();
    if (access(plan.guard_path.c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "remote ranks need kolo_rank_guard next to kolorun, at ",
          plan.guard_path, " on every host: ", os::ErrnoText(errno)));
    }
  }
  return plan;
}

std::vector<std::string> WorkerEnvironment(
    const std::vector<std::string>& inherited, const LaunchOptions& options,
    const RankEndpoint& endpoint, int cpus) {
  Variables vars = JobVariables(inherited, options, endpoint);
  if (!Inherited(inherited, "OMP_NUM_THREADS") &&
      !Has(vars, "OMP_NUM_THREADS")) {
    vars.emplace_back(
        "OMP_NUM_THREADS",
        absl::StrCat(std::max(1, cpus / endpoint.placement.local_size)));
  }
  return Merge(inherited, vars, [](const std::string&) { return true; });
}

std::vector<std::string> RemoteWorkerEnvironment(
    const std::vector<std::string>& inherited, const LaunchOptions& options,
    const RankEndpoint& endpoint) {
  RankEndpoint remote = endpoint;
  remote.secret_fd = -1;
  return Merge(inherited, JobVariables(inherited, options, remote),
               [](const std::string& name) {
                 return absl::StartsWith(name, "KOLO_") || name == "PATH" ||
                        name == "LD_LIBRARY_PATH" ||
                        name == "OMP_NUM_THREADS" || name == "MASTER_ADDR" ||
                        name == "MASTER_PORT";
               });
}

std::string TorchMasterAddress(const JobPlan& plan) {
  if (plan.ranks.empty() || !plan.ranks.front().remote) return plan.store_addr;
  return plan.ranks.front().host;
}

int FreeTcpPort() {
  const os::UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return 0;
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);  // as torch's TCPStore binds
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) ==
          0 &&
      getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), &len) ==
          0) {
    port = ntohs(addr.sin_port);
  }
  return port;
}

namespace {

// Descriptors kolorun needs besides those of the workers.
constexpr int64_t kBaseDescriptors = 64;
// Per worker: two output pipes, its connection to the store, and for a
// remote rank ssh's standard input; with room for a second store
// connection.
constexpr int64_t kDescriptorsPerWorker = 5;
// Processes kolorun needs besides the workers: its own threads, the job
// guard, and the first threads of the workers.
constexpr int64_t kBaseProcesses = 16;

int64_t ReadInt64File(const std::string& path, int64_t fallback) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text)) return fallback;
  int64_t value;
  if (!absl::SimpleAtoi(text, &value)) return fallback;  // e.g. "max"
  return value;
}

// The tightest pids.max - pids.current of this process's cgroup and its
// ancestors (the pids controller of cgroup v2, or of v1 where it is mounted
// on its own), or -1.
int64_t CgroupProcessesLeft(std::string* where) {
  std::ifstream in("/proc/self/cgroup");
  std::string line;
  std::vector<std::pair<std::string, std::string>> roots;  // (mount, path)
  while (std::getline(in, line)) {
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (controllers.empty()) {
      roots.emplace_back("/sys/fs/cgroup", path);  // v2
    } else if (controllers == "pids") {
      roots.emplace_back("/sys/fs/cgroup/pids", path);  // v1
    }
  }
  int64_t best = -1;
  for (auto [mount, path] : roots) {
    for (;;) {
      const std::string dir = path == "/" ? mount : mount + path;
      const int64_t max = ReadInt64File(dir + "/pids.max", -1);
      if (max >= 0) {
        const int64_t left =
            std::max<int64_t>(0, max - ReadInt64File(dir + "/pids.current", 0));
        if (best < 0 || left < best) {
          best = left;
          *where = absl::StrCat("pids.max=", max, " of the cgroup ", dir);
        }
      }
      if (path == "/" || path.empty()) break;
      const size_t slash = path.rfind('/');
      path = slash == 0 || slash == std::string::npos ? "/"
                                                      : path.substr(0, slash);
    }
  }
  return best;
}

}  // namespace

ResourceLimits ReadResourceLimits() {
  ResourceLimits limits;
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0) {
    if (files.rlim_cur < files.rlim_max) {
      struct rlimit raised = files;
      raised.rlim_cur = files.rlim_max;
      if (setrlimit(RLIMIT_NOFILE, &raised) == 0) files = raised;
    }
    limits.descriptors = files.rlim_cur == RLIM_INFINITY
                             ? std::numeric_limits<int64_t>::max()
                             : static_cast<int64_t>(files.rlim_cur);
  }
  auto tighten = [&](int64_t left, const std::string& source) {
    if (left >= 0 && (limits.processes < 0 || left < limits.processes)) {
      limits.processes = left;
      limits.processes_source = source;
    }
  };
  std::string cgroup;
  tighten(CgroupProcessesLeft(&cgroup), cgroup);
  struct rlimit procs;
  if (geteuid() != 0 && getrlimit(RLIMIT_NPROC, &procs) == 0 &&
      procs.rlim_cur != RLIM_INFINITY) {
    tighten(static_cast<int64_t>(procs.rlim_cur),
            absl::StrCat("RLIMIT_NPROC=", procs.rlim_cur, " (ulimit -u)"));
  }
  const int64_t pid_max = ReadInt64File("/proc/sys/kernel/pid_max", -1);
  if (pid_max > 0) {
    tighten(pid_max, absl::StrCat("kernel.pid_max=", pid_max));
  }
  const int64_t threads_max = ReadInt64File("/proc/sys/kernel/threads-max", -1);
  if (threads_max > 0) {
    tighten(threads_max, absl::StrCat("kernel.threads-max=", threads_max));
  }
  return limits;
}

absl::Status CheckResources(const LaunchOptions& options, const JobPlan& plan,
                            const ResourceLimits& limits) {
  const int64_t workers = static_cast<int64_t>(plan.ranks.size());
  const int64_t descriptors =
      kBaseDescriptors + kDescriptorsPerWorker * workers;
  if (descriptors > limits.descriptors) {
    return absl::InvalidArgumentError(
        absl::StrCat("-np ", options.num_proc, ": kolorun needs about ",
                     descriptors, " file descriptors for ", workers,
                     " workers but may open ", limits.descriptors,
                     " (ulimit -n); raise the limit or start fewer "
                     "workers"));
  }
  const int64_t processes = kBaseProcesses + workers;
  if (limits.processes >= 0 && processes > limits.processes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "-np ", options.num_proc, ": ", workers, " workers need at least ",
        processes, " processes and threads, but only ", limits.processes,
        " more may start here (", limits.processes_source,
        "); start fewer workers or raise the limit"));
  }
  return absl::OkStatus();
}

int AvailableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    return std::max(1, CPU_COUNT(&set));
  }
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

}  // namespace kolorun
}  // namespace kolo
