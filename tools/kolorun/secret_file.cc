#include "tools/kolorun/secret_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace kolo {
namespace kolorun {

absl::StatusOr<std::unique_ptr<SecretFile>> SecretFile::Create(
    const std::string& secret) {
  const char* tmpdir = getenv("TMPDIR");
  const std::string dir = (tmpdir && *tmpdir) ? tmpdir : "/tmp";
  std::string name = absl::StrCat(dir, "/kolo-secret-XXXXXX");
  std::vector<char> buffer(name.begin(), name.end());
  buffer.push_back('\0');
  const int fd = mkostemp(buffer.data(), O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot create the secret file in ",
                                            dir, ": ", std::strerror(errno)));
  }
  // Owns the path from here on: every error below removes the file.
  std::unique_ptr<SecretFile> file(new SecretFile(buffer.data()));
  absl::Status status;
  if (fchmod(fd, 0600) != 0) {
    status = absl::InternalError(absl::StrCat("cannot restrict ", file->path(),
                                              ": ", std::strerror(errno)));
  }
  size_t written = 0;
  while (status.ok() && written < secret.size()) {
    const ssize_t n =
        write(fd, secret.data() + written, secret.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      status = absl::InternalError(absl::StrCat("cannot write ", file->path(),
                                                ": ", std::strerror(errno)));
      break;
    }
    written += static_cast<size_t>(n);
  }
  if (close(fd) != 0 && status.ok()) {
    status = absl::InternalError(absl::StrCat("cannot write ", file->path(),
                                              ": ", std::strerror(errno)));
  }
  if (!status.ok()) return status;
  return file;
}

SecretFile::~SecretFile() { unlink(path_.c_str()); }

}  // namespace kolorun
}  // namespace kolo
