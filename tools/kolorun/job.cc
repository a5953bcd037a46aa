#include "tools/kolorun/job.h"

#include <errno.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/config.h"
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
  Variables vars = {
      {"KOLO_RANK", absl::StrCat(p.rank)},
      {"KOLO_SIZE", absl::StrCat(options.num_proc)},
      {"KOLO_LOCAL_RANK", absl::StrCat(p.local_rank)},
      {"KOLO_LOCAL_SIZE", absl::StrCat(p.local_size)},
      {"KOLO_CROSS_RANK", absl::StrCat(p.cross_rank)},
      {"KOLO_CROSS_SIZE", absl::StrCat(p.cross_size)},
      {"KOLO_RENDEZVOUS_ADDR", endpoint.store_addr},
      {"KOLO_RENDEZVOUS_PORT", absl::StrCat(endpoint.store_port)},
  };
  if (!endpoint.secret_path.empty()) {
    Set(&vars, "KOLO_SECRET_FILE", endpoint.secret_path);
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
  return vars;
}

// `inherited` entries that `keep` accepts and `vars` does not replace,
// followed by `vars`. KOLO_SECRET and KOLO_SECRET_FILE never pass: the
// secret travels only in kolorun's own file.
std::vector<std::string> Merge(
    const std::vector<std::string>& inherited, const Variables& vars,
    const std::function<bool(const std::string&)>& keep) {
  std::set<std::string> replaced = {"KOLO_SECRET", "KOLO_SECRET_FILE"};
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
      return absl::InvalidArgumentError(absl::StrCat(
          "--network-interface ", options.network_interface,
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
  if (remote != plan.ranks.end()) {
    plan.guard_path = GuardPathNextToSelf();
    if (access(plan.guard_path.c_str(), X_OK) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "remote ranks need kolo_rank_guard next to kolorun, at ",
          plan.guard_path, " on every host: ", std::strerror(errno)));
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
  remote.secret_path.clear();
  return Merge(inherited, JobVariables(inherited, options, remote),
               [](const std::string& name) {
                 return absl::StartsWith(name, "KOLO_") || name == "PATH" ||
                        name == "LD_LIBRARY_PATH" || name == "OMP_NUM_THREADS";
               });
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
