#include "ops/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kolo {
namespace shm {
namespace {

std::string Errno(int err) { return std::strerror(err); }

std::string FreeSpaceOfDevShm() {
  struct statvfs st;
  if (statvfs("/dev/shm", &st) != 0) return "unknown";
  const double free_mb =
      static_cast<double>(st.f_bavail) * st.f_frsize / (1 << 20);
  return absl::StrFormat("%.1f MiB", free_mb);
}

absl::StatusOr<void*> Map(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("mmap of shared memory ", name, " (", bytes,
                     " bytes) failed: ", Errno(errno)));
  }
  return p;
}

}  // namespace

std::string SharedSegment::RandomName() {
  uint64_t bits = 0;
  // getrandom never fails for 8 bytes once the pool is initialised; if it
  // does, the address of a stack variable and the time still vary enough for
  // O_EXCL to catch the rare clash.
  if (getrandom(&bits, sizeof(bits), 0) != sizeof(bits)) {
    bits = reinterpret_cast<uintptr_t>(&bits) ^
           static_cast<uint64_t>(time(nullptr)) * 0x9e3779b97f4a7c15ull;
  }
  return absl::StrFormat("/kolo-%d-%016x", getpid(), bits);
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(
    const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("shm_open(", name, ") failed: ", Errno(errno)));
  }
  auto fail = [&](absl::Status s) {
    close(fd);
    shm_unlink(name.c_str());
    return s;
  };
  // posix_fallocate reserves the pages: on a full tmpfs it fails here with
  // ENOSPC, whereas ftruncate alone would succeed and the first write to a
  // missing page would kill the process with SIGBUS.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", bytes >> 10, " KiB of shared memory for ", name,
        ": ", Errno(err), " (/dev/shm has ", FreeSpaceOfDevShm(), " free)")));
  }
  auto data = Map(fd, bytes, name);
  if (!data.ok()) return fail(data.status());
  close(fd);
  return std::unique_ptr<SharedSegment>(new SharedSegment(*data, bytes));
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Open(
    const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    // ENOENT here usually means the creator is on another machine (or in
    // another /dev/shm namespace): the ranks are not on one host after all.
    return absl::UnavailableError(
        absl::StrCat("shm_open(", name, ") failed: ", Errno(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", name, " has ", st.st_size,
                     " bytes, expected ", bytes));
  }
  auto data = Map(fd, bytes, name);
  close(fd);
  if (!data.ok()) return data.status();
  return std::unique_ptr<SharedSegment>(new SharedSegment(*data, bytes));
}

absl::Status SharedSegment::Unlink(const std::string& name) {
  if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(
        absl::StrCat("shm_unlink(", name, ") failed: ", Errno(errno)));
  }
  return absl::OkStatus();
}

SharedSegment::~SharedSegment() { munmap(data_, size_); }

}  // namespace shm
}  // namespace kolo
