#include "runtime/api/config.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "kolo/store.h"
#include "runtime/net/hosts.h"
#include "runtime/os/errno_text.h"
#include "runtime/util/status_macros.h"

extern char** environ;

namespace kolo {

const char kInsecureWellKnownSecret[] = "kolo-insecure-well-known-secret";

namespace {

absl::Status Bad(const std::string& var, const std::string& value,
                 const std::string& expected) {
  return absl::InvalidArgumentError(absl::StrCat(
      "invalid value for ", var, "=\"", value, "\": expected ", expected));
}

const std::string* Find(const EnvironmentMap& env, const std::string& var) {
  auto it = env.find(var);
  if (it == env.end()) return nullptr;
  return &it->second;
}

// Integer in [min_value, max_value].
absl::Status ReadInt(const EnvironmentMap& env, const std::string& var,
                     int64_t min_value, int64_t max_value, int64_t* out) {
  const std::string* v = Find(env, var);
  if (!v) return absl::OkStatus();
  int64_t parsed;
  if (!absl::SimpleAtoi(*v, &parsed) || parsed < min_value ||
      parsed > max_value) {
    return Bad(var, *v,
               absl::StrCat("an integer from ", min_value, " to ", max_value));
  }
  *out = parsed;
  return absl::OkStatus();
}

absl::Status ReadInt32(const EnvironmentMap& env, const std::string& var,
                       int64_t min_value, int* out) {
  int64_t value = *out;
  absl::Status s = ReadInt(env, var, min_value, 1 << 30, &value);
  *out = static_cast<int>(value);
  return s;
}

// A non-negative (or positive) number of `unit`s, fractions allowed.
absl::Status ReadDuration(const EnvironmentMap& env, const std::string& var,
                          absl::Duration unit, bool allow_zero,
                          absl::Duration* out) {
  const std::string* v = Find(env, var);
  if (!v) return absl::OkStatus();
  double parsed;
  const char* what = unit == absl::Seconds(1)        ? "seconds"
                     : unit == absl::Microseconds(1) ? "microseconds"
                                                     : "milliseconds";
  // At most 1e9 units (31 years of seconds): larger values overflow the
  // deadlines computed from them.
  constexpr double kMaxUnits = 1e9;
  if (!absl::SimpleAtod(*v, &parsed) || !std::isfinite(parsed) || parsed < 0 ||
      (!allow_zero && parsed == 0)) {
    return Bad(var, *v,
               absl::StrCat(allow_zero ? "a non-negative" : "a positive",
                            " number of ", what));
  }
  if (parsed > kMaxUnits) {
    return Bad(var, *v,
               absl::StrCat("a number of ", what, " no larger than 1e9"));
  }
  *out = parsed * unit;
  return absl::OkStatus();
}

absl::Status ReadBool(const EnvironmentMap& env, const std::string& var,
                      bool* out) {
  const std::string* v = Find(env, var);
  if (!v) return absl::OkStatus();
  std::string lower = absl::AsciiStrToLower(*v);
  if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") {
    *out = true;
  } else if (lower == "0" || lower == "false" || lower == "off" ||
             lower == "no") {
    *out = false;
  } else {
    return Bad(var, *v, "one of 1, 0, true, false, on, off, yes, no");
  }
  return absl::OkStatus();
}

absl::Status ReadLogLevel(const EnvironmentMap& env, const std::string& var,
                          LogLevel* out) {
  const std::string* v = Find(env, var);
  if (!v) return absl::OkStatus();
  static constexpr const char* kNames[] = {"trace",   "debug", "info",
                                           "warning", "error", "fatal"};
  std::string lower = absl::AsciiStrToLower(*v);
  for (int i = 0; i < 6; ++i) {
    if (lower == kNames[i]) {
      *out = static_cast<LogLevel>(i);
      return absl::OkStatus();
    }
  }
  return Bad(var, *v, "trace, debug, info, warning, error or fatal");
}

// Note [Horovod's names]
// Horovod's users set HOROVOD_FUSION_THRESHOLD and friends; for the
// settings kolo shares (same meaning, same unit) the HOROVOD_* name is read
// when the KOLO_* one is not set, so KOLO_* wins. docs/configuration.md
// lists the pairs.
const char* HorovodName(const std::string& kolo_var) {
  static const std::pair<const char*, const char*> kAliases[] = {
      {"KOLO_FUSION_THRESHOLD", "HOROVOD_FUSION_THRESHOLD"},
      {"KOLO_CYCLE_TIME", "HOROVOD_CYCLE_TIME"},
      {"KOLO_CACHE_CAPACITY", "HOROVOD_CACHE_CAPACITY"},
      {"KOLO_TIMELINE", "HOROVOD_TIMELINE"},
      {"KOLO_TIMELINE_MARK_CYCLES", "HOROVOD_TIMELINE_MARK_CYCLES"},
      {"KOLO_STALL_CHECK_TIME", "HOROVOD_STALL_CHECK_TIME_SECONDS"},
      {"KOLO_STALL_SHUTDOWN_TIME", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"},
      {"KOLO_LOG_LEVEL", "HOROVOD_LOG_LEVEL"},
      {"KOLO_HIERARCHICAL_ALLREDUCE", "HOROVOD_HIERARCHICAL_ALLREDUCE"},
  };
  for (const auto& [kolo, horovod] : kAliases) {
    if (kolo_var == kolo) return horovod;
  }
  return nullptr;
}

// The variable to read for `kolo_var`: itself if set, else Horovod's name
// of it if that is set, else itself.
std::string Alias(const EnvironmentMap& env, const std::string& kolo_var) {
  if (Find(env, kolo_var)) return kolo_var;
  const char* horovod = HorovodName(kolo_var);
  if (horovod && Find(env, horovod)) return horovod;
  return kolo_var;
}

// The secret from the descriptor KOLO_SECRET_FD (kolorun's: Note [Secret
// without a file] in tools/kolorun/secret_fd.h), read at offset 0 so that
// it can be read again; the descriptor is then marked close-on-exec, so that
// programs the worker starts do not inherit it.
absl::Status ReadSecretDescriptor(const std::string& value, std::string* out) {
  int fd = -1;
  if (!absl::SimpleAtoi(value, &fd) || fd < 0) {
    return Bad("KOLO_SECRET_FD", value, "a descriptor number");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KOLO_SECRET_FD=", fd, ": descriptor ", fd,
        " is not open in this process (kolorun passes it to the workers it "
        "starts; a program started by a worker does not inherit it)"));
  }
  std::string buffer(4096, '\0');
  ssize_t n;
  do {
    n = pread(fd, &buffer[0], buffer.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KOLO_SECRET_FD=", fd,
                     ": cannot read the secret: ", os::ErrnoText(errno)));
  }
  buffer.resize(static_cast<size_t>(n));
  std::string secret(absl::StripAsciiWhitespace(buffer));
  if (secret.size() < kMinSecretBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KOLO_SECRET_FD=", fd, ": the secret must be at least ",
        kMinSecretBytes, " bytes, the descriptor holds ", secret.size()));
  }
  const int flags = fcntl(fd, F_GETFD);
  if (flags >= 0) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  *out = std::move(secret);
  return absl::OkStatus();
}

// The secret from KOLO_SECRET_FD, KOLO_SECRET_FILE or KOLO_SECRET, in that
// order. Messages never contain the secret itself.
absl::Status ReadSecret(const EnvironmentMap& env, std::string* out) {
  if (const std::string* fd = Find(env, "KOLO_SECRET_FD")) {
    return ReadSecretDescriptor(*fd, out);
  }
  if (const std::string* path = Find(env, "KOLO_SECRET_FILE")) {
    struct stat st;
    if (stat(path->c_str(), &st) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KOLO_SECRET_FILE=\"", *path, "\": cannot read the file"));
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KOLO_SECRET_FILE=\"", *path,
          "\": the file must be readable by its owner only (mode 0600)"));
    }
    std::ifstream in(*path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    std::string secret = std::string(absl::StripAsciiWhitespace(buffer.str()));
    if (!in || secret.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KOLO_SECRET_FILE=\"", *path, "\": the file is empty or unreadable"));
    }
    if (secret.size() < kMinSecretBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KOLO_SECRET_FILE=\"", *path, "\": the secret must be at least ",
          kMinSecretBytes, " bytes, the file holds ", secret.size()));
    }
    *out = std::move(secret);
    return absl::OkStatus();
  }
  if (const std::string* secret = Find(env, "KOLO_SECRET")) {
    if (secret->empty()) {
      return absl::InvalidArgumentError("KOLO_SECRET is set but empty");
    }
    if (secret->size() < kMinSecretBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("KOLO_SECRET must be at least ", kMinSecretBytes,
                       " bytes, it has ", secret->size()));
    }
    *out = *secret;  // Never echoed in messages.
  }
  return absl::OkStatus();
}

// --- Placement (Note [Placement and rendezvous from the environment]). ---

// The first of `vars` that is set, or nullptr; its name goes to `*name`.
const std::string* FindFirst(const EnvironmentMap& env,
                             std::initializer_list<const char*> vars,
                             std::string* name) {
  for (const char* var : vars) {
    if (const std::string* v = Find(env, var)) {
      *name = var;
      return v;
    }
  }
  return nullptr;
}

// Reads the first of `vars` that is set into *out (left alone if none is).
absl::Status ReadFirstInt32(const EnvironmentMap& env,
                            std::initializer_list<const char*> vars,
                            int64_t min_value, int* out) {
  std::string name;
  if (!FindFirst(env, vars, &name)) return absl::OkStatus();
  return ReadInt32(env, name, min_value, out);
}

absl::Status Require(const EnvironmentMap& env, const char* present,
                     const char* needed) {
  if (Find(env, needed)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(present, " is set but ", needed,
                   " is not: cannot tell this worker's place in the job"));
}

// Cross rank and size when the launcher names no host index: ranks are
// assumed to fill hosts in order, local_size at a time.
void DeriveCross(Options* o, int hosts) {
  o->cross_size =
      hosts > 0 ? hosts : (o->size + o->local_size - 1) / o->local_size;
  o->cross_rank = std::min(o->rank / o->local_size, o->cross_size - 1);
}

// "2(x3),1" (Slurm's tasks per node) -> {2, 2, 2, 1}.
absl::StatusOr<std::vector<int>> ExpandTasksPerNode(const std::string& var,
                                                    const std::string& value) {
  std::vector<int> counts;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    int count = 0, repeat = 1;
    absl::string_view number = item;
    if (size_t open = item.find("(x"); open != absl::string_view::npos) {
      number = item.substr(0, open);
      absl::string_view times = item.substr(open + 2);
      if (!absl::ConsumeSuffix(&times, ")") ||
          !absl::SimpleAtoi(times, &repeat) || repeat < 1 ||
          repeat > (1 << 20)) {
        return Bad(var, value, "counts like \"2(x3),1\"");
      }
    }
    if (!absl::SimpleAtoi(number, &count) || count < 1 ||
        counts.size() + repeat > (1 << 20)) {
      return Bad(var, value, "counts like \"2(x3),1\"");
    }
    counts.insert(counts.end(), repeat, count);
  }
  return counts;
}

absl::Status ParseMpirunPlacement(const EnvironmentMap& env, Options* o) {
  const char* kRank = "OMPI_COMM_WORLD_RANK";
  const char* kSize = "OMPI_COMM_WORLD_SIZE";
  KOLO_RETURN_IF_ERROR(Require(env, Find(env, kRank) ? kRank : kSize,
                               Find(env, kRank) ? kSize : kRank));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, kSize, 1, &o->size));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, kRank, 0, &o->rank));
  o->local_rank = o->rank;
  o->local_size = o->size;
  KOLO_RETURN_IF_ERROR(
      ReadInt32(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, &o->local_size));
  KOLO_RETURN_IF_ERROR(
      ReadInt32(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, &o->local_rank));
  int hosts = 0;
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "OMPI_MCA_orte_num_nodes", 1, &hosts));
  DeriveCross(o, hosts);
  return absl::OkStatus();
}

absl::Status ParseSlurmPlacement(const EnvironmentMap& env, Options* o) {
  std::string size_var;
  if (!FindFirst(env, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"},
                 &size_var)) {
    return Require(env, "SLURM_PROCID", "SLURM_NTASKS");
  }
  KOLO_RETURN_IF_ERROR(ReadInt32(env, size_var, 1, &o->size));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "SLURM_PROCID", 0, &o->rank));
  o->local_rank = 0;
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "SLURM_LOCALID", 0, &o->local_rank));
  o->cross_rank = 0;
  o->cross_size = 1;
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "SLURM_NODEID", 0, &o->cross_rank));
  KOLO_RETURN_IF_ERROR(ReadFirstInt32(
      env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, 1,
      &o->cross_size));
  std::string tasks_var;
  if (const std::string* tasks =
          FindFirst(env, {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"},
                    &tasks_var)) {
    absl::StatusOr<std::vector<int>> counts =
        ExpandTasksPerNode(tasks_var, *tasks);
    if (!counts.ok()) return counts.status();
    if (o->cross_rank >= static_cast<int>(counts->size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("SLURM_NODEID=", o->cross_rank, " has no entry in ",
                       tasks_var, "=\"", *tasks, "\""));
    }
    o->local_size = (*counts)[o->cross_rank];
  } else if (Find(env, "SLURM_NTASKS_PER_NODE")) {
    KOLO_RETURN_IF_ERROR(
        ReadInt32(env, "SLURM_NTASKS_PER_NODE", 1, &o->local_size));
  } else if (o->cross_size == 1) {
    o->local_size = o->size;
  } else {
    return absl::InvalidArgumentError(
        "cannot tell how many Slurm tasks run on this node: neither "
        "SLURM_TASKS_PER_NODE nor SLURM_NTASKS_PER_NODE is set (set "
        "KOLO_LOCAL_SIZE)");
  }
  return absl::OkStatus();
}

absl::Status ParseTorchrunPlacement(const EnvironmentMap& env, Options* o) {
  KOLO_RETURN_IF_ERROR(Require(env, Find(env, "RANK") ? "RANK" : "WORLD_SIZE",
                               Find(env, "RANK") ? "WORLD_SIZE" : "RANK"));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "WORLD_SIZE", 1, &o->size));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "RANK", 0, &o->rank));
  // A Kubernetes job without torchrun runs one worker per pod.
  o->local_rank = 0;
  o->local_size = 1;
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "LOCAL_WORLD_SIZE", 1, &o->local_size));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "LOCAL_RANK", 0, &o->local_rank));
  int hosts = 0;
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "GROUP_WORLD_SIZE", 1, &hosts));
  DeriveCross(o, hosts);
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "GROUP_RANK", 0, &o->cross_rank));
  return absl::OkStatus();
}

// Fills the placement fields and placement_source.
absl::Status ParsePlacement(const EnvironmentMap& env, Options* o) {
  if (Find(env, "KOLO_RANK") || Find(env, "KOLO_SIZE")) {
    o->placement_source = "kolo";
    KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_SIZE", 1, &o->size));
    KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_RANK", 0, &o->rank));
    o->local_size = o->size;
    o->local_rank = o->rank;
  } else if (Find(env, "OMPI_COMM_WORLD_RANK") ||
             Find(env, "OMPI_COMM_WORLD_SIZE")) {
    o->placement_source = "mpirun";
    KOLO_RETURN_IF_ERROR(ParseMpirunPlacement(env, o));
  } else if (Find(env, "SLURM_PROCID")) {
    o->placement_source = "slurm";
    KOLO_RETURN_IF_ERROR(ParseSlurmPlacement(env, o));
  } else if (Find(env, "RANK") || Find(env, "WORLD_SIZE")) {
    o->placement_source = "torchrun";
    KOLO_RETURN_IF_ERROR(ParseTorchrunPlacement(env, o));
  }
  // Explicit KOLO_* values win over what a launcher said.
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_LOCAL_SIZE", 1, &o->local_size));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_LOCAL_RANK", 0, &o->local_rank));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_CROSS_SIZE", 1, &o->cross_size));
  KOLO_RETURN_IF_ERROR(ReadInt32(env, "KOLO_CROSS_RANK", 0, &o->cross_rank));
  absl::Status valid = ValidateOptions(*o);
  if (!valid.ok() && !o->placement_source.empty() &&
      o->placement_source != "kolo") {
    return absl::InvalidArgumentError(
        absl::StrCat(valid.message(), " (placement from ", o->placement_source,
                     "'s environment variables)"));
  }
  return valid;
}

// --- Rendezvous. ---

// Sets rendezvous_addr/port and host_store. `*addr_source` names the
// variable the address came from, for messages.
absl::Status ParseRendezvous(const EnvironmentMap& env, Options* o,
                             std::string* addr_source) {
  if (const std::string* v = Find(env, "KOLO_RENDEZVOUS_PORT")) {
    int64_t port = 0;
    if (!absl::SimpleAtoi(*v, &port) || port < 1 || port > 65535) {
      return Bad("KOLO_RENDEZVOUS_PORT", *v, "a port from 1 to 65535");
    }
    o->rendezvous_port = static_cast<int>(port);
  }
  if (o->placement_source == "torchrun") {
    const std::string* master_port = Find(env, "MASTER_PORT");
    if (master_port && *master_port == absl::StrCat(o->rendezvous_port)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KOLO_RENDEZVOUS_PORT=", o->rendezvous_port,
          " is torchrun's MASTER_PORT, where torchrun's own store listens: "
          "set KOLO_RENDEZVOUS_PORT to another port"));
    }
  }
  if (const std::string* v = Find(env, "KOLO_LAUNCHER")) {
    // kolorun's store listens before it starts any worker.
    o->store_listening = *v == "kolorun";
  }
  o->host_store = o->placement_source == "mpirun" ||
                  o->placement_source == "slurm" ||
                  o->placement_source == "torchrun";
  KOLO_RETURN_IF_ERROR(ReadBool(env, "KOLO_HOST_STORE", &o->host_store));

  *addr_source = "default";
  if (const std::string* v = Find(env, "KOLO_RENDEZVOUS_ADDR")) {
    if (v->empty()) return Bad("KOLO_RENDEZVOUS_ADDR", *v, "a host address");
    o->rendezvous_addr = *v;
    *addr_source = "KOLO_RENDEZVOUS_ADDR";
    return absl::OkStatus();
  }
  if (o->size == 1) return absl::OkStatus();
  if (const std::string* v = Find(env, "MASTER_ADDR"); v && !v->empty()) {
    o->rendezvous_addr = *v;
    *addr_source = "MASTER_ADDR";
    return absl::OkStatus();
  }
  std::string nodelist_var;
  if (const std::string* v = FindFirst(
          env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"},
          &nodelist_var)) {
    absl::StatusOr<std::vector<std::string>> nodes = ExpandSlurmNodelist(*v);
    if (!nodes.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid value for ", nodelist_var, "=\"", *v,
                       "\": ", nodes.status().message()));
    }
    o->rendezvous_addr = nodes->front();
    *addr_source = absl::StrCat("the first node of ", nodelist_var);
    return absl::OkStatus();
  }
  if (o->local_size == o->size) {
    o->rendezvous_addr = "127.0.0.1";
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot tell where the rendezvous store is: the ", o->size,
      " ranks run on several hosts (placement from ", o->placement_source,
      ") and none of KOLO_RENDEZVOUS_ADDR, MASTER_ADDR or SLURM_NODELIST is "
      "set: set KOLO_RENDEZVOUS_ADDR to the address of rank 0's host"));
}

// Sets bind_addr (Options::bind_addr) and checks that rank 0, when it hosts
// the store, listens where the others look for it.
absl::Status ParseBindAddress(const EnvironmentMap& env, Options* o,
                              const std::string& addr_source,
                              bool resolve_names) {
  if (const std::string* v = Find(env, "KOLO_IFACE"); v && !v->empty()) {
    absl::StatusOr<std::string> addr = InterfaceAddress(*v);
    if (!addr.ok()) return addr.status();
    o->iface = *v;
    o->bind_addr = *addr;
  } else if (o->size > 1 && o->rendezvous_addr != "127.0.0.1") {
    absl::StatusOr<std::string> addr =
        LocalAddressFor(o->rendezvous_addr, resolve_names);
    if (!addr.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("no local address reaches the rendezvous address \"",
                       o->rendezvous_addr, "\" (from ", addr_source,
                       "): ", addr.status().message(), "; set KOLO_IFACE"));
    }
    o->bind_addr = *addr;
  }
  if (o->size == 1 || !o->host_store || o->rank != 0) return absl::OkStatus();
  absl::StatusOr<std::vector<std::string>> resolved =
      ResolveIPv4(o->rendezvous_addr, resolve_names);
  if (!resolved.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank 0 hosts the rendezvous store at \"", o->rendezvous_addr,
        "\" (from ", addr_source, "): ", resolved.status().message()));
  }
  for (const std::string& addr : *resolved) {
    if (addr == o->bind_addr || o->bind_addr == "0.0.0.0") {
      return absl::OkStatus();
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rank 0 hosts the rendezvous store on ", o->bind_addr,
      o->iface.empty() ? "" : absl::StrCat(" (KOLO_IFACE=", o->iface, ")"),
      " but the other ranks look for it at \"", o->rendezvous_addr, "\" (",
      absl::StrJoin(*resolved, ", "), ", from ", addr_source,
      "): make them agree"));
}

// Fills secret and insecure_no_secret; a job of several ranks needs one.
absl::Status ParseSecret(const EnvironmentMap& env, Options* o) {
  KOLO_RETURN_IF_ERROR(ReadSecret(env, &o->secret));
  bool insecure = false;
  KOLO_RETURN_IF_ERROR(ReadBool(env, "KOLO_INSECURE_NO_SECRET", &insecure));
  if (!o->secret.empty() || o->size == 1) return absl::OkStatus();
  if (insecure) {
    o->secret = kInsecureWellKnownSecret;
    o->insecure_no_secret = true;
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "no job secret for a job of ", o->size, " ranks: set KOLO_SECRET_FILE ",
      "(a file of mode 0600) or KOLO_SECRET to the same string of at least ",
      kMinSecretBytes,
      " bytes on every rank (kolorun does this for you); or set "
      "KOLO_INSECURE_NO_SECRET=1 to run with a fixed, publicly known secret, "
      "so that anyone who can reach kolo's ports can join or disrupt the "
      "job"));
}

}  // namespace

EnvironmentMap ProcessEnvironment() {
  EnvironmentMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

absl::StatusOr<Options> ParseOptions(const EnvironmentMap& env) {
  return ParseOptions(env, ParseSettings());
}

absl::StatusOr<Options> ParseOptions(const EnvironmentMap& env,
                                     const ParseSettings& settings) {
  Options o;
  std::string addr_source;
  KOLO_RETURN_IF_ERROR(ParsePlacement(env, &o));
  KOLO_RETURN_IF_ERROR(ParseRendezvous(env, &o, &addr_source));
  KOLO_RETURN_IF_ERROR(ParseSecret(env, &o));
  KOLO_RETURN_IF_ERROR(
      ParseBindAddress(env, &o, addr_source, settings.resolve_names));

  // Note [Horovod's names]: a HOROVOD_* setting kolo shares counts when the
  // KOLO_* one is unset; messages name the variable that was read.
  KOLO_RETURN_IF_ERROR(ReadInt(env, Alias(env, "KOLO_FUSION_THRESHOLD"), 0,
                               int64_t{1} << 40, &o.fusion_threshold_bytes));
  KOLO_RETURN_IF_ERROR(ReadDuration(env, Alias(env, "KOLO_CYCLE_TIME"),
                                    absl::Milliseconds(1),
                                    /*allow_zero=*/true, &o.cycle_time));
  KOLO_RETURN_IF_ERROR(
      ReadInt32(env, Alias(env, "KOLO_CACHE_CAPACITY"), 0, &o.cache_capacity));
  KOLO_RETURN_IF_ERROR(ReadDuration(env, "KOLO_SPIN_TIME",
                                    absl::Microseconds(1),
                                    /*allow_zero=*/true, &o.spin_time));
  KOLO_RETURN_IF_ERROR(ReadDuration(env, "KOLO_OP_TIMEOUT", absl::Seconds(1),
                                    /*allow_zero=*/false, &o.op_timeout));
  KOLO_RETURN_IF_ERROR(ReadDuration(env, "KOLO_START_TIMEOUT", absl::Seconds(1),
                                    /*allow_zero=*/false, &o.start_timeout));
  KOLO_RETURN_IF_ERROR(ReadDuration(env, Alias(env, "KOLO_STALL_CHECK_TIME"),
                                    absl::Seconds(1), /*allow_zero=*/true,
                                    &o.stall_check_time));
  if (!Find(env, "KOLO_STALL_CHECK_TIME")) {
    bool disabled = false;
    KOLO_RETURN_IF_ERROR(
        ReadBool(env, "HOROVOD_STALL_CHECK_DISABLE", &disabled));
    if (disabled) o.stall_check_time = absl::ZeroDuration();
  }
  KOLO_RETURN_IF_ERROR(ReadDuration(env, Alias(env, "KOLO_STALL_SHUTDOWN_TIME"),
                                    absl::Seconds(1), /*allow_zero=*/true,
                                    &o.stall_shutdown_time));
  if (const std::string* v = Find(env, Alias(env, "KOLO_TIMELINE"))) {
    o.timeline_path = *v;
  }
  KOLO_RETURN_IF_ERROR(ReadBool(env, Alias(env, "KOLO_TIMELINE_MARK_CYCLES"),
                                &o.timeline_mark_cycles));
  KOLO_RETURN_IF_ERROR(ReadBool(env, "KOLO_PHASE_TIMES", &o.phase_times));
  KOLO_RETURN_IF_ERROR(
      ReadLogLevel(env, Alias(env, "KOLO_LOG_LEVEL"), &o.log_level));
  KOLO_RETURN_IF_ERROR(ReadBool(env, "KOLO_SHM", &o.shm));
  KOLO_RETURN_IF_ERROR(
      ReadBool(env, "KOLO_HIT_BOARD", &o.negotiate_within_hosts));
  KOLO_RETURN_IF_ERROR(ReadBool(env, Alias(env, "KOLO_HIERARCHICAL_ALLREDUCE"),
                                &o.hierarchical_allreduce));
  KOLO_RETURN_IF_ERROR(ReadInt(env, "KOLO_ELASTIC_GENERATION", 0,
                               int64_t{1} << 40, &o.generation));
  KOLO_RETURN_IF_ERROR(
      ReadInt(env, "KOLO_ELASTIC_ID", 0, int64_t{1} << 40, &o.elastic_id));
  KOLO_RETURN_IF_ERROR(ReadDuration(env, "KOLO_ELASTIC_TIMEOUT",
                                    absl::Seconds(1), /*allow_zero=*/false,
                                    &o.elastic_timeout));
  KOLO_RETURN_IF_ERROR(ValidateOptions(o));
  return o;
}

absl::Status ValidateOptions(const Options& o) {
  if (o.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be at least 1, got ", o.size));
  }
  if (o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KOLO_RANK=", o.rank, " is outside the world of KOLO_SIZE=", o.size));
  }
  if (o.local_rank < 0 || o.local_rank >= o.local_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("KOLO_LOCAL_RANK=", o.local_rank,
                     " is outside KOLO_LOCAL_SIZE=", o.local_size));
  }
  if (o.cross_rank < 0 || o.cross_rank >= o.cross_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("KOLO_CROSS_RANK=", o.cross_rank,
                     " is outside KOLO_CROSS_SIZE=", o.cross_size));
  }
  if (o.fusion_threshold_bytes < 0) {
    return absl::InvalidArgumentError("fusion threshold must be >= 0 bytes");
  }
  if (o.incarnation < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("incarnation must be >= 0, got ", o.incarnation));
  }
  if (o.op_timeout <= absl::ZeroDuration() ||
      o.start_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be positive");
  }
  return absl::OkStatus();
}

}  // namespace kolo
