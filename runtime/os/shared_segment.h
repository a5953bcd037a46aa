// SharedSegment: one POSIX shared-memory object (/dev/shm/<name>) mapped
// into this process. The shm backend's data segment (ops/shm) and the
// control plane's rings (runtime/control/shm_ring.h) are both one.
//
// Note [Segment lifetime]
// One rank creates the segment under a random name, every rank maps it, and
// once every rank has mapped it the name is unlinked, so that from then on
// the memory lives only as long as some process maps it: a crash (even
// SIGKILL) leaves nothing in /dev/shm. Only the few milliseconds between
// creation and the last rank's mapping can leak a name if the creator dies
// exactly then; the creator unlinks it on every error path. Memory is
// reserved at creation (posix_fallocate), so a /dev/shm that is too small
// is an error here rather than a SIGBUS at the first touch of a page. Mode
// 0600: only the job's user maps it.
//
// Errors, by what the caller should do:
//   Unavailable        the name cannot be created or opened (taken, absent:
//                      for Open, usually a creator on another host or in
//                      another /dev/shm namespace): use another transport.
//   ResourceExhausted  the memory cannot be reserved or mapped; the message
//                      has the free space of /dev/shm: make room or ask for
//                      less.
//   FailedPrecondition Open() found a segment of another size: not the one
//                      the caller was told about.
//   Internal           fstat or shm_unlink failed otherwise (a bug).
//
// Thread safety: a SharedSegment is immutable after creation; the memory it
// maps is shared by the processes (and threads) that map it, which
// synchronise through it as they see fit.
#ifndef KOLO_RUNTIME_OS_SHARED_SEGMENT_H_
#define KOLO_RUNTIME_OS_SHARED_SEGMENT_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kolo {
namespace os {

class SharedSegment {
 public:
  // Creates `name` ("/kolo-...", which must not exist) with `bytes` of
  // reserved, zeroed memory and maps it. The name is removed again on any
  // error.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Create(
      const std::string& name, size_t bytes);
  // Maps the existing segment `name`, which must be `bytes` long.
  static absl::StatusOr<std::unique_ptr<SharedSegment>> Open(
      const std::string& name, size_t bytes);
  // Removes `name` from /dev/shm (mappings stay valid). Absent is fine.
  static absl::Status Unlink(const std::string& name);
  // "/<prefix>-<pid>-<16 random hex digits>": unguessable, and the pid
  // tells whose segment a leftover entry was.
  static std::string RandomName(absl::string_view prefix);

  ~SharedSegment();  // Unmaps.
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

  // Maps every page of the segment into this process now (best effort), so
  // that its first use costs no page fault: a control segment's rings and
  // board are small and on the latency path, where a fault (1-3 us on a
  // VM) is more than a small collective.
  void Populate();

 private:
  SharedSegment(void* data, size_t size) : data_(data), size_(size) {}
  void* const data_;
  const size_t size_;
};

}  // namespace os
}  // namespace kolo

#endif  // KOLO_RUNTIME_OS_SHARED_SEGMENT_H_
