// TensorQueue: hand-off from caller threads to the background thread, and
// the table of this rank's in-flight collectives.
//
// Callers Add() entries (never blocks on the network; rejects a name that is
// already in flight at once). The background thread takes the new requests
// to send to the coordinator, then Take()s entries by name when their
// response arrives. Any thread may FailAll() on a fatal error.
//
// Thread safety: all methods are thread-safe (one mutex).
#ifndef KOLO_RUNTIME_LOOP_TENSOR_QUEUE_H_
#define KOLO_RUNTIME_LOOP_TENSOR_QUEUE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "kolo/runtime.h"
#include "kolo/work.h"
#include "runtime/api/work_state.h"
#include "runtime/sync/mutex.h"
#include "runtime/wire.pb.h"

namespace kolo {

// Completion of a grouped allreduce: one Work for all members; the first
// error wins.
struct GroupCompletion {
  explicit GroupCompletion(int members) : remaining(members) {}
  Mutex mu;
  int remaining KOLO_GUARDED_BY(mu) = 0;
  absl::Status status KOLO_GUARDED_BY(mu);
  std::shared_ptr<internal::WorkState> work;
};

struct TensorEntry {
  wire::Request request;      // What the coordinator sees.
  TensorView input;           // Allreduce/allgather input; broadcast tensor.
  TensorView output;          // Allreduce output.
  OutputAllocator allocator;  // Allgather.
  std::shared_ptr<internal::WorkState> work;
  std::shared_ptr<GroupCompletion> group;  // grouped allreduce only
  // Local backstop for the op timeout; set when the request is taken for
  // sending (TakeNewRequests) unless the submitter set one.
  absl::Time deadline = absl::InfiniteFuture();
  // Set once the entry timed out locally: the caller's memory is no longer
  // ours, so a late response runs on this zero-filled scratch instead.
  std::shared_ptr<std::vector<uint8_t>> scratch;
  // Its request was handed to the background thread (TensorQueue's lock).
  bool sent = false;

  // Completes this entry's Work (and its group's, once every member is
  // done). Later calls are ignored.
  void Complete(const absl::Status& status, std::vector<int64_t> splits = {});

  // Forgets the collective (Note [Entries recycled]): drops every reference
  // it holds but its completed Work state (Note [Works recycled]), keeps
  // the storage of its strings and vectors.
  void Reset();
};

class TensorQueue {
 public:
  // `notify` is called (without locks held) after an Add that found no new
  // requests waiting, to wake the background thread (which takes them all).
  explicit TensorQueue(std::function<void()> notify)
      : notify_(std::move(notify)) {}

  // AlreadyExists if the name is in flight; the failure status if the queue
  // was closed.
  absl::Status Add(std::unique_ptr<TensorEntry> entry);
  // Add without the wake-up: for a caller that runs the loop's turn itself
  // next, or wakes the background thread if it cannot (Note [Caller
  // turns] in runtime/loop/background_loop.cc).
  absl::Status AddQuietly(std::unique_ptr<TensorEntry> entry);
  // Adds every entry or none, under one lock and with at most one
  // wake-up: the first that Add would refuse (or a name twice in
  // `entries`) fails the call and leaves `entries` as they were. On
  // success `entries` is emptied.
  absl::Status AddAll(std::vector<std::unique_ptr<TensorEntry>>* entries);

  // Note [Entries recycled]: an entry the background thread is done with
  // comes back here (Recycle) and serves a later submission (NewEntry),
  // with the storage of its name, shape and request: a training step
  // submits the same tensors every time, so in steady state a submission
  // allocates nothing for its entry. At most kMaxFreeEntries are kept.
  std::unique_ptr<TensorEntry> NewEntry();
  void NewEntries(size_t n, std::vector<std::unique_ptr<TensorEntry>>* out);
  // Takes back completed entries (null ones and any not completed are
  // left to be destroyed); `entries` is emptied.
  void Recycle(std::vector<std::unique_ptr<TensorEntry>>* entries);
  static constexpr size_t kMaxFreeEntries = 4096;
  size_t free_entries() const;
  // Renews `e`'s completed state if nothing else shares it, else drops it
  // (Note [Works recycled]).
  static void ReuseWork(TensorEntry* e);

  // Calls `fn` with each request added since the last call, in submission
  // order, without copies and outside the queue's lock (Note [Taking
  // without the lock]; one take at a time, in the loop's turn, and `fn`
  // must not take again).
  // Entries added without a deadline get `from` plus their request's
  // timeout (`op_timeout` where it has none: Note [Request timeouts]): one
  // clock read per take instead of one per submission.
  void TakeNewRequests(absl::Time from, absl::Duration op_timeout,
                       const std::function<void(const wire::Request&)>& fn);
  // Without the lock: whether requests wait to be taken, and how many
  // were ever added (a change means a submission came).
  bool has_new_requests() const {
    return has_new_.load(std::memory_order_acquire);
  }
  uint64_t adds() const { return adds_.load(std::memory_order_acquire); }

  // Removes and returns the entry for `name` in `process_set`; null if not
  // in flight.
  std::unique_ptr<TensorEntry> Take(int process_set, const std::string& name);
  // The same for every name of a (fused) response, under one lock: out[i]
  // is names[i]'s entry or null.
  void TakeAll(int process_set,
               const google::protobuf::RepeatedPtrField<std::string>& names,
               std::vector<std::unique_ptr<TensorEntry>>* out);

  // Entries whose deadline passed are failed with DeadlineExceeded and turned
  // into scratch entries (see TensorEntry::scratch). Returns the earliest
  // deadline still pending.
  absl::Time ExpireLocal(absl::Time now, absl::Duration op_timeout);

  // Fails every pending entry with `status`; later Adds fail with
  // `status` too.
  void Close(const absl::Status& status);
  // Fails every pending entry of `process_set` with `status` (the set was
  // removed).
  void FailSet(int process_set, const absl::Status& status);

  // Blocks until no entry is in flight or `deadline`; true if drained.
  bool WaitDrained(absl::Time deadline);

  size_t size() const;
  absl::Status closed_status() const;

 private:
  const std::function<void()> notify_;
  mutable Mutex mu_;
  CondVar drained_cv_;
  // Separate from mu_: callers take entries while the background thread
  // holds mu_ to take responses' entries; on a line of its own, so that
  // taking one lock does not take the other's line from another core.
  alignas(64) mutable Mutex free_mu_;
  std::vector<std::unique_ptr<TensorEntry>> free_ KOLO_GUARDED_BY(free_mu_);
  // Add's work; *first: the background thread needs a wake-up.
  absl::Status AddImpl(std::unique_ptr<TensorEntry> owned, bool* first)
      KOLO_EXCLUDES(mu_);
  // The refusal of `request` while `holder` has its name.
  absl::Status RefusalLocked(const wire::Request& request,
                             const TensorEntry& holder) const
      KOLO_REQUIRES(mu_);
  // Moves *owned into the table under its name and into the new requests
  // (*first |= it is the first new request since the background thread
  // took them) and returns null; or, if an entry holds the name, leaves
  // *owned and returns that entry. Needs RoomForLocked(1) first.
  const TensorEntry* PlaceLocked(std::unique_ptr<TensorEntry>* owned,
                                 bool* first) KOLO_REQUIRES(mu_);
  // Room for `more` new requests (growing geometrically), so that
  // PlaceLocked does not throw once it has made a slot.
  void RoomForLocked(size_t more) KOLO_REQUIRES(mu_);
  // Process set -> name -> entry (names are unique per process set). The
  // key views the entry's own request name.
  using Table = absl::flat_hash_map<
      int,
      absl::flat_hash_map<absl::string_view, std::unique_ptr<TensorEntry>>>;
  Table table_ KOLO_GUARDED_BY(mu_);
  // Entries of table_ not sent yet, in submission order (an entry taken
  // before it was sent leaves both: ForgetUnsent; Close empties both).
  std::vector<TensorEntry*> new_entries_ KOLO_GUARDED_BY(mu_);
  std::atomic<bool> has_new_{false};  // !new_entries_.empty()
  // Note [Taking without the lock]: the entries of the take under way
  // (the taker's; storage kept from take to take), whether one is
  // under way, and the entries that Close and FailSet removed meanwhile,
  // which the take destroys once it has read them.
  std::vector<TensorEntry*> taking_;
  bool take_running_ KOLO_GUARDED_BY(mu_) = false;
  std::vector<std::unique_ptr<TensorEntry>> graveyard_ KOLO_GUARDED_BY(mu_);
  // Destroys `dead` (failed entries, out of the table), or leaves them to
  // the take under way.
  void Bury(std::vector<std::unique_ptr<TensorEntry>>* dead) KOLO_EXCLUDES(mu_);
  // Removes `e` from new_entries_ if it is there (taken before it was sent:
  // an error response for a name other ranks sent).
  void ForgetUnsent(const TensorEntry* e) KOLO_REQUIRES(mu_);
  // No entry waits for a response (timed-out ones aside).
  bool DrainedLocked() const KOLO_REQUIRES(mu_);
  std::atomic<uint64_t> adds_{0};
  // No entry's deadline is earlier (a stale value is only earlier).
  absl::Time earliest_deadline_ KOLO_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Status closed_ KOLO_GUARDED_BY(mu_);
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_TENSOR_QUEUE_H_
