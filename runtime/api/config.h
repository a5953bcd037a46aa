// Configuration: the ONLY place in the library that reads KOLO_* variables.
//
// ParseOptions() works on an environment map, so tests pass maps instead of
// calling setenv. Every variable, its default and meaning is listed in
// docs/configuration.md; a bad value fails with InvalidArgument naming the
// variable and the value.
#ifndef KOLO_RUNTIME_API_CONFIG_H_
#define KOLO_RUNTIME_API_CONFIG_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kolo/options.h"

namespace kolo {

using EnvironmentMap = std::map<std::string, std::string>;

// The current process environment as a map.
EnvironmentMap ProcessEnvironment();

// Options from `env`. Reads the secret from the descriptor KOLO_SECRET_FD
// (then marked close-on-exec) or the file KOLO_SECRET_FILE.
//
// Note [Placement and rendezvous from the environment]
// Placement (rank, size, local and cross rank/size) comes from the first
// launcher found: KOLO_RANK/KOLO_SIZE (kolorun, or set by hand), then
// mpirun (OMPI_COMM_WORLD_*), then Slurm (SLURM_PROCID, ...), then torchrun
// or a Kubernetes job (RANK, WORLD_SIZE, ...); any KOLO_LOCAL_* or
// KOLO_CROSS_* variable that is set overrides what the launcher said.
// The store is at KOLO_RENDEZVOUS_ADDR, else MASTER_ADDR, else the first node
// of the Slurm node list, else 127.0.0.1 when every rank is on one host;
// port KOLO_RENDEZVOUS_PORT (default 29600). Under mpirun, Slurm and torchrun
// rank 0 hosts it (Options::host_store); kolorun hosts its own. A job of
// several ranks needs a secret of at least 16 bytes, unless
// KOLO_INSECURE_NO_SECRET=1. docs/configuration.md and docs/multihost.md
// list every variable.
absl::StatusOr<Options> ParseOptions(const EnvironmentMap& env);

struct ParseSettings {
  // Resolve host names (MASTER_ADDR=node1, a Slurm node) with getaddrinfo,
  // which may ask DNS. Off, only numeric addresses are accepted: for fuzzers
  // and tests, which must not send queries anywhere.
  bool resolve_names = true;
};
absl::StatusOr<Options> ParseOptions(const EnvironmentMap& env,
                                     const ParseSettings& settings);

// Checks cross-field consistency (rank < size, ...) of options built by
// hand or parsed.
absl::Status ValidateOptions(const Options& options);

// The secret used with KOLO_INSECURE_NO_SECRET=1. Public by design.
extern const char kInsecureWellKnownSecret[];
// The shortest secret accepted from KOLO_SECRET or KOLO_SECRET_FILE.
constexpr size_t kMinSecretBytes = 16;

}  // namespace kolo

#endif  // KOLO_RUNTIME_API_CONFIG_H_
