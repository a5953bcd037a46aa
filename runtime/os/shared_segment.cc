#include "runtime/os/shared_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace os {
namespace {

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
    const int err = errno;
    return absl::ResourceExhaustedError(absl::StrCat(
        "mmap of shared memory ", name, " (", bytes, " bytes) failed: ",
        ErrnoText(err), " (/dev/shm has ", FreeSpaceOfDevShm(), " free)"));
  }
  return p;
}

}  // namespace

std::string SharedSegment::RandomName(absl::string_view prefix) {
  uint64_t bits = 0;
  // getrandom never fails for 8 bytes once the pool is initialised; if it
  // does, the address of a stack variable and the time still vary enough for
  // O_EXCL to catch the rare clash.
  if (getrandom(&bits, sizeof(bits), 0) != sizeof(bits)) {
    bits = reinterpret_cast<uintptr_t>(&bits) ^
           static_cast<uint64_t>(time(nullptr)) * 0x9e3779b97f4a7c15ull;
  }
  return absl::StrFormat("/%s-%d-%016x", prefix, getpid(), bits);
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Create(
    const std::string& name, size_t bytes) {
  UniqueFd fd(
      shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    const int err = errno;
    return absl::UnavailableError(
        absl::StrCat("shm_open(", name, ") failed: ", ErrnoText(err)));
  }
  auto fail = [&](absl::Status s) {
    shm_unlink(name.c_str());
    return s;
  };
  // posix_fallocate reserves the pages: on a full tmpfs it fails here with
  // ENOSPC, whereas ftruncate alone would succeed and the first write to a
  // missing page would kill the process with SIGBUS.
  const int err = posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
  if (err != 0) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("cannot reserve ", bytes >> 10,
                     " KiB of shared memory for ", name, ": ", ErrnoText(err),
                     " (/dev/shm has ", FreeSpaceOfDevShm(), " free)")));
  }
  absl::StatusOr<void*> data = Map(fd.get(), bytes, name);
  if (!data.ok()) return fail(data.status());
  return std::unique_ptr<SharedSegment>(new SharedSegment(*data, bytes));
}

absl::StatusOr<std::unique_ptr<SharedSegment>> SharedSegment::Open(
    const std::string& name, size_t bytes) {
  UniqueFd fd(shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) {
    // ENOENT here usually means the creator is on another machine (or in
    // another /dev/shm namespace): the ranks are not on one host after all.
    const int err = errno;
    return absl::UnavailableError(
        absl::StrCat("shm_open(", name, ") failed: ", ErrnoText(err)));
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) {
    const int err = errno;
    return absl::InternalError(
        absl::StrCat("fstat of shared memory ", name, ": ", ErrnoText(err)));
  }
  if (static_cast<size_t>(st.st_size) != bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", name, " has ", st.st_size,
                     " bytes, expected ", bytes));
  }
  // The mapping stays valid once the descriptor is closed.
  absl::StatusOr<void*> data = Map(fd.get(), bytes, name);
  if (!data.ok()) return data.status();
  return std::unique_ptr<SharedSegment>(new SharedSegment(*data, bytes));
}

absl::Status SharedSegment::Unlink(const std::string& name) {
  if (shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    return absl::InternalError(
        absl::StrCat("shm_unlink(", name, ") failed: ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

void SharedSegment::Populate() {
#ifdef MADV_POPULATE_WRITE
  if (madvise(data_, size_, MADV_POPULATE_WRITE) == 0) return;
#endif
  // Older kernels: a read maps a page of a shared writable tmpfs mapping
  // writable (tmpfs tracks no dirty pages), and changes nothing.
  const long page = sysconf(_SC_PAGESIZE);
  const size_t step = page > 0 ? static_cast<size_t>(page) : 4096;
  const volatile uint8_t* p = static_cast<const volatile uint8_t*>(data_);
  for (size_t i = 0; i < size_; i += step) (void)p[i];
}

SharedSegment::~SharedSegment() { munmap(data_, size_); }

}  // namespace os
}  // namespace kolo
