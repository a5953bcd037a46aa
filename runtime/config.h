// Configuration: the ONLY place in the library that reads KOLO_* variables.
//
// ParseOptions() works on an environment map, so tests pass maps instead of
// calling setenv. Every variable, its default and meaning is listed in
// docs/configuration.md; a bad value fails with InvalidArgument naming the
// variable and the value.
#ifndef KOLO_RUNTIME_CONFIG_H_
#define KOLO_RUNTIME_CONFIG_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "kolo/options.h"

namespace kolo {

using EnvironmentMap = std::map<std::string, std::string>;

// The current process environment as a map.
EnvironmentMap ProcessEnvironment();

// Options from `env`. Reads the secret file named by KOLO_SECRET_FILE.
absl::StatusOr<Options> ParseOptions(const EnvironmentMap& env);

// Checks cross-field consistency (rank < size, ...) of options built by
// hand or parsed.
absl::Status ValidateOptions(const Options& options);

// The first IPv4 address of network interface `iface` (e.g. "eth0", "lo").
absl::StatusOr<std::string> InterfaceAddress(const std::string& iface);

}  // namespace kolo

#endif  // KOLO_RUNTIME_CONFIG_H_
