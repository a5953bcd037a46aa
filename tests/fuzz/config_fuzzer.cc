// Fuzzes the configuration parser: the input is "NAME=value" lines.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/str_split.h"
#include "runtime/api/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kolo::EnvironmentMap env;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    std::string name(line.substr(0, eq));
    // Secret files are read from disk: keep the fuzzer to the parsing.
    if (name == "KOLO_SECRET_FILE") continue;
    env[name] = std::string(line.substr(eq + 1));
  }
  kolo::ParseSettings settings;
  settings.resolve_names = false;  // numeric addresses only: no DNS queries
  auto options = kolo::ParseOptions(env, settings);
  if (options.ok()) (void)kolo::ValidateOptions(*options);
  return 0;
}
