// kolorun: starts N local workers of one kolo job. See `kolorun --help` and
// Note [Launcher lifecycle] in launcher.h.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tools/kolorun/args.h"
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

}  // namespace

int main(int argc, char** argv) {
  EnsureStandardDescriptors();
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<kolo::kolorun::LaunchOptions> options =
      kolo::kolorun::ParseArgs(args);
  if (!options.ok()) {
    std::fprintf(stderr, "kolorun: %s\nRun 'kolorun --help' for usage.\n",
                 std::string(options.status().message()).c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(kolo::kolorun::Usage().c_str(), stdout);
    return 0;
  }
  kolo::kolorun::Launcher launcher(*std::move(options));
  return launcher.Run();
}
