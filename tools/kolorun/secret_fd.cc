#include "tools/kolorun/secret_fd.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "runtime/os/errno_text.h"

namespace kolo {
namespace kolorun {

absl::StatusOr<std::unique_ptr<SecretDescriptor>> SecretDescriptor::Create(
    const std::string& secret) {
  // Closed on every error below.
  os::UniqueFd fd(memfd_create("kolo-secret", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) {
    return absl::InternalError(absl::StrCat(
        "cannot create the memory file for the job secret (memfd_create): ",
        os::ErrnoText(errno)));
  }
  size_t written = 0;
  while (written < secret.size()) {
    const ssize_t n =
        write(fd.get(), secret.data() + written, secret.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(absl::StrCat(
          "cannot write the job secret's memory file: ", os::ErrnoText(errno)));
    }
    written += static_cast<size_t>(n);
  }
  if (fchmod(fd.get(), 0600) != 0 ||
      fcntl(fd.get(), F_ADD_SEALS,
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    return absl::InternalError(absl::StrCat(
        "cannot seal the job secret's memory file: ", os::ErrnoText(errno)));
  }
  return std::unique_ptr<SecretDescriptor>(new SecretDescriptor(std::move(fd)));
}

}  // namespace kolorun
}  // namespace kolo
