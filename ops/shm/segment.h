// SharedSegment: one POSIX shared-memory object (/dev/shm/<name>) mapped
// into this process.
//
// Note [Segment lifetime]
// The set's rank 0 creates the segment under a random per-job name, every
// rank maps it, and once every rank has mapped it the name is unlinked, so
// that from then on the memory lives only as long as some process maps it:
// a crash (even SIGKILL) leaves nothing in /dev/shm. Only the few
// milliseconds between creation and the last rank's mapping can leak a name
// if rank 0 dies exactly then; the creator unlinks it on every error path.
// Memory is reserved at creation (posix_fallocate), so a /dev/shm that is too
// small is an error here rather than a SIGBUS at the first touch of a page.
//
// Thread safety: a SharedSegment is immutable after creation; the memory it
// maps is shared by the processes (and threads) that map it.
#ifndef KOLO_OPS_SHM_SEGMENT_H_
#define KOLO_OPS_SHM_SEGMENT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kolo {
namespace shm {

class SharedSegment {
 public:
  // Creates `name` ("/kolo-...") with `bytes` of reserved, zeroed memory
  // and maps it. ResourceExhausted (with the free space of /dev/shm) when
  // the memory cannot be reserved; the name is removed again on any error.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Create(
      const std::string& name, size_t bytes);
  // Maps the existing segment `name`, which must be `bytes` long.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Open(
      const std::string& name, size_t bytes);
  // Removes `name` from /dev/shm (mappings stay valid). Absent is fine.
  static absl::Status Unlink(const std::string& name);
  // "/kolo-<pid>-<16 random hex digits>": unguessable, and the pid tells
  // whose segment a leftover entry was.
  static std::string RandomName();

  ~SharedSegment();
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  SharedSegment(void* data, size_t size) : data_(data), size_(size) {}
  void* const data_;
  const size_t size_;
};

}  // namespace shm
}  // namespace kolo

#endif  // KOLO_OPS_SHM_SEGMENT_H_
