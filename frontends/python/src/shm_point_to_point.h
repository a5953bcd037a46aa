// ShmPointToPoint: point-to-point of a process group whose ranks all run on
// one host, through a shared-memory segment of the group's own.
// Connect (the group's decision and its segment) is in shm_connect.cc; the
// engine (layout, Works, progress thread) in shm_point_to_point.cc.
//
// Note [Point-to-point over shared memory]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// The segment (an os::SharedSegment, Note [Segment lifetime]: a random
// name, mode 0600, unlinked once every rank has mapped it) holds, per rank,
// a doorbell (a Wakeup word) and a "closed" word, and per ordered pair of
// ranks (s -> d) one channel:
//   * a ring of kSlots descriptors {tag, bytes} that s writes, one per send;
//   * a ring of "clear to send" entries (the descriptor's sequence number)
//     that d writes when a recv of its own matches the descriptor;
//   * a byte ring that s fills with the payloads, in the order d cleared
//     them, and d empties into the matched recv's tensor.
// A message moves as a rendezvous, as gloo's: the sender's bytes leave its
// tensor only once the receiver has a recv for them, so nothing is buffered
// beyond the byte ring, a recv may match its tag out of the order the tags
// were sent (tags keep messages apart), and messages of one tag between two
// ranks arrive in the order they were sent (descriptors are matched in
// order). A recv from any source takes the earliest descriptor (in the
// order this rank saw them) of its tag from any rank. A send completes once
// its last byte is in the ring.
//
// One progress thread per group does all of it: it reads descriptors and
// clears, matches recvs, copies bytes, and completes Works; it sleeps on
// its doorbell, which peers ring after every write into a channel it reads
// and local callers ring after posting. Sizes must match: a recv whose
// tensor is not the message's size fails with both sizes, and the message
// is drained so that its sender completes.
//
// kolo's promises:
//   * a dead peer: while anything is pending, the thread polls a pidfd of
//     each peer every kLivenessPoll (20 ms); a peer whose process ended
//     fails every operation with it, naming it, once what it wrote before
//     it went has been taken (a recv from any source fails once no peer is
//     left);
//   * a Work's wait is bounded by the group's timeout; a timeout closes the
//     group's point-to-point on this rank (every pending and later operation
//     fails, and the wait returns once the thread let go of them: it writes
//     into no tensor after that), as gloo's context does, and sets this
//     rank's closed word, so peers fail their operations with it at once
//     instead of waiting;
//   * idle: with nothing pending the thread sleeps on its futex without a
//     deadline (Wakeup's own kMaxSleep re-check aside).
// The progress thread never takes the GIL: the tensors of ended operations
// are let go of on callers' threads.
//
// Connect's store keys carry a generation that every rank computes alike
// (a counter each rank adds 1 to), so keys of an earlier group that a store
// served under the same prefix never answer for this one.
//
// A group uses this path when every rank reports the same host as kolo's
// placement sees hosts (host name, boot, network and IPC namespaces) and
// the same pid namespace (pidfds), the segment can be
// created and opened everywhere and each peer's pidfd opened; otherwise
// (and with KOLO_SHM=0) gloo's TCP pairs (point_to_point.h). One transport
// per group: a recv from any source matches over one engine.
//
// Thread safety: Post() from any thread; the progress thread owns the
// matching state under mu_.
#ifndef KOLO_FRONTENDS_PYTHON_SRC_SHM_POINT_TO_POINT_H_
#define KOLO_FRONTENDS_PYTHON_SRC_SHM_POINT_TO_POINT_H_

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <vector>

#include "runtime/os/shared_segment.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace torch {

class ShmPointToPoint : public std::enable_shared_from_this<ShmPointToPoint> {
 public:
  // Every rank of the group calls it together. The shared-memory transport
  // for `rank` of `size`, or null (with the reason in *why_not) when the
  // group cannot use one; every rank then gets null. Store waits are
  // bounded by `timeout`; a rank that does not come is an exception.
  static std::shared_ptr<ShmPointToPoint> Connect(
      const std::string& group, int rank, int size,
      const c10::intrusive_ptr<c10d::Store>& store,
      std::chrono::milliseconds timeout, std::string* why_not);

  ~ShmPointToPoint();  // fails what is pending, stops the thread

  // Posts a send of `staged` (contiguous) to `peer`, or a recv into it from
  // `peer` (-1: any) with `tag`; a recv copies into `target` (the caller's
  // tensor) when `staged` is a contiguous stand-in for it. `what` names the
  // operation in errors; `timeout` bounds a wait.
  c10::intrusive_ptr<c10d::Work> Post(bool recv, int peer, int tag,
                                      at::Tensor target, at::Tensor staged,
                                      std::string what,
                                      std::chrono::milliseconds timeout);

  // Closes point-to-point on this rank: pending and later operations fail
  // with `error`; peers see it. Any thread.
  void Close(const std::string& error);
  // Lets go of the tensors of ended operations (Note [Tensors are let go
  // off the progress thread] in the .cc). Any thread but the progress
  // thread.
  void Collect();

  class Impl;

 private:
  // The bytes of the segment of a group of `size` ranks, and the transport
  // over a mapped one (with a pidfd of every peer): Connect's last step.
  static size_t SegmentBytes(int size);
  static std::shared_ptr<ShmPointToPoint> Start(
      const std::string& group, int rank, int size,
      std::unique_ptr<os::SharedSegment> segment,
      std::vector<os::UniqueFd> pidfds);

  explicit ShmPointToPoint(std::unique_ptr<Impl> impl);
  const std::unique_ptr<Impl> impl_;
};

}  // namespace torch
}  // namespace kolo

#endif  // KOLO_FRONTENDS_PYTHON_SRC_SHM_POINT_TO_POINT_H_
