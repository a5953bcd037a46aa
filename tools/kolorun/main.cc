// kolorun: starts the N workers of one kolo job, on this machine or on
// several hosts over ssh. See `kolorun --help`, Note [Launcher lifecycle] in
// launcher.h and Note [Remote ranks] in remote.h.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tools/kolorun/args.h"
#include "tools/kolorun/job.h"
#include "tools/kolorun/launcher.h"

namespace {

// Descriptors 0-2 must be open before kolorun creates pipes, or a pipe could
// land on 1 and a worker's output on kolorun's stdout unprefixed.
void EnsureStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) < 0) {
      const int opened = open("/dev/null", O_RDWR);
      if (opened >= 0 && opened != fd) close(opened);
    }
  }
}

int UsageError(const absl::Status& status) {
  std::fprintf(stderr, "kolorun: %s\nRun 'kolorun --help' for usage.\n",
               std::string(status.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  EnsureStandardDescriptors();
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<kolo::kolorun::LaunchOptions> options =
      kolo::kolorun::ParseArgs(args);
  if (!options.ok()) return UsageError(options.status());
  if (options->help) {
    std::fputs(kolo::kolorun::Usage().c_str(), stdout);
    return 0;
  }
  // Everything that can be wrong with the command line, the files it names
  // and the hosts is found before anything starts.
  if (absl::Status s = kolo::kolorun::LoadFiles(&*options); !s.ok()) {
    return UsageError(s);
  }
  absl::StatusOr<kolo::kolorun::JobPlan> plan =
      kolo::kolorun::PlanJob(*options);
  if (!plan.ok()) return UsageError(plan.status());
  if (absl::Status s = kolo::kolorun::CheckResources(
          *options, *plan, kolo::kolorun::ReadResourceLimits());
      !s.ok()) {
    std::fprintf(stderr, "kolorun: %s\n", std::string(s.message()).c_str());
    return 2;  // Nothing started, as for a usage error.
  }
  kolo::kolorun::Launcher launcher(*std::move(options), *std::move(plan));
  return launcher.Run();
}
