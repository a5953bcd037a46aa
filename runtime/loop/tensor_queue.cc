#include "runtime/loop/tensor_queue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/negotiation/collectives.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/format.h"
#include "runtime/util/status_macros.h"

namespace kolo {

void TensorEntry::Complete(const absl::Status& status,
                           std::vector<int64_t> splits) {
  if (!work->Complete(status, std::move(splits)) || !group) return;
  bool last = false;
  absl::Status final_status;
  {
    MutexLock lock(&group->mu);
    if (group->status.ok() && !status.ok()) group->status = status;
    last = --group->remaining == 0;
    final_status = group->status;
  }
  if (last) group->work->Complete(final_status);
}

void TensorEntry::Reset() {
  request.Clear();  // Keeps the name's and the shape's storage.
  input.data = output.data = nullptr;
  input.ready.reset();
  output.ready.reset();
  allocator = nullptr;
  // `work` (completed) stays: Note [Works recycled].
  group.reset();
  deadline = absl::InfiniteFuture();
  scratch.reset();
  sent = false;
}

absl::Status TensorQueue::RefusalLocked(const wire::Request& request,
                                        const TensorEntry& holder) const {
  if (!holder.scratch) {
    return absl::AlreadyExistsError(absl::StrCat(
        CollectiveName(request.type()), " \"", request.name(),
        "\": a collective with this name is already in flight on rank ",
        request.rank(), "; wait for it before reusing the name"));
  }
  // A timed-out entry still waits for its late response under this name.
  return absl::FailedPreconditionError(absl::StrCat(
      CollectiveName(request.type()), " \"", request.name(),
      "\": an earlier collective with this name timed out and has not "
      "been resolved by the other ranks yet"));
}

void TensorQueue::RoomForLocked(size_t more) {
  const size_t need = new_entries_.size() + more;
  if (need > new_entries_.capacity()) {
    new_entries_.reserve(std::max(need, 2 * new_entries_.capacity()));
  }
}

const TensorEntry* TensorQueue::PlaceLocked(std::unique_ptr<TensorEntry>* owned,
                                            bool* first) {
  // One look-up finds the name in flight or makes its slot (the key views
  // the entry's own name, which lives as long as the slot holds it).
  const wire::Request& request = (*owned)->request;
  auto [it, added] = table_[request.process_set()].try_emplace(
      absl::string_view(request.name()), nullptr);
  if (!added) return it->second.get();
  // Most entries have no deadline yet: TakeNewRequests gives them one.
  earliest_deadline_ = std::min(earliest_deadline_, (*owned)->deadline);
  // The background thread takes all new requests at once: it needs a
  // wake-up only for the first one since it last took them, which saves
  // a system call per tensor when many are submitted in a burst.
  *first |= new_entries_.empty();
  new_entries_.push_back(owned->get());  // RoomForLocked: does not throw
  it->second = std::move(*owned);
  return nullptr;
}

absl::Status TensorQueue::Add(std::unique_ptr<TensorEntry> owned) {
  bool first = false;
  KOLO_RETURN_IF_ERROR(AddImpl(std::move(owned), &first));
  if (first) notify_();
  return absl::OkStatus();
}

absl::Status TensorQueue::AddQuietly(std::unique_ptr<TensorEntry> owned) {
  bool first = false;
  return AddImpl(std::move(owned), &first);
}

absl::Status TensorQueue::AddImpl(std::unique_ptr<TensorEntry> owned,
                                  bool* first) {
  MutexLock lock(&mu_);
  if (!closed_.ok()) return closed_;
  RoomForLocked(1);
  if (const TensorEntry* holder = PlaceLocked(&owned, first)) {
    return RefusalLocked(owned->request, *holder);
  }
  has_new_.store(true, std::memory_order_release);
  adds_.fetch_add(1, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status TensorQueue::AddAll(
    std::vector<std::unique_ptr<TensorEntry>>* entries) {
  std::vector<std::unique_ptr<TensorEntry>>& batch = *entries;
  bool first = false;
  {
    MutexLock lock(&mu_);
    if (!closed_.ok()) return closed_;
    // Each entry goes into its slot as it is checked (one look-up each);
    // the first refusal takes the batch's entries out again: all or none.
    const size_t start = new_entries_.size();
    RoomForLocked(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const TensorEntry* holder = PlaceLocked(&batch[i], &first);
      if (!holder) continue;
      const wire::Request& request = batch[i]->request;
      auto earlier =
          std::find(new_entries_.begin() + start, new_entries_.end(), holder);
      absl::Status refused =
          earlier == new_entries_.end()
              ? RefusalLocked(request, *holder)
              : absl::InvalidArgumentError(absl::StrCat(
                    CollectiveName(request.type()), " \"", request.name(),
                    "\": the name is given twice in one batch (requests ",
                    earlier - (new_entries_.begin() + start), " and ", i, ")"));
      for (size_t k = start; k < new_entries_.size(); ++k) {
        const wire::Request& placed = new_entries_[k]->request;
        auto& names = table_[placed.process_set()];
        auto slot = names.find(placed.name());
        batch[k - start] = std::move(slot->second);
        names.erase(slot);
      }
      new_entries_.resize(start);
      return refused;
    }
    if (!batch.empty()) {
      has_new_.store(true, std::memory_order_release);
      adds_.fetch_add(batch.size(), std::memory_order_release);
    }
  }
  batch.clear();
  if (first) notify_();
  return absl::OkStatus();
}

// Note [Works recycled]
// A recycled entry keeps its completed WorkState. When the entry serves
// its next submission, the state is renewed for it if no Work shares it
// any more (the caller let go of the last step's handles before this
// submission), so that a steady-state submission allocates no state
// either; otherwise (a caller that replaces its list of handles only after
// submitting the next step's) the entry gets a new state and the old one
// lives on in the caller's Works. "No Work shares it" is read from the
// shared_ptr's count after taking a reference of our own, and the old
// readers' reads of the status must happen before Renew's writes: each
// dropped its Work with a release on the count; the acquire fence after
// the read of the count pairs with it (use_count() is a relaxed read).
// libstdc++'s increment of the probe is itself acquire-release, which is
// what TSan sees (it does not model fences). Only the entry can reach the
// state afterwards: the runtime hands out Works from entries, and nothing
// keeps a weak_ptr.
void TensorQueue::ReuseWork(TensorEntry* e) {
  if (!e->work) return;
  const std::shared_ptr<internal::WorkState> probe = e->work;
  if (probe.use_count() == 2) {
    std::atomic_thread_fence(std::memory_order_acquire);
    e->work->Renew();
  } else {
    e->work.reset();
  }
}

std::unique_ptr<TensorEntry> TensorQueue::NewEntry() {
  std::unique_ptr<TensorEntry> e;
  {
    MutexLock lock(&free_mu_);
    if (!free_.empty()) {
      e = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (!e) return std::make_unique<TensorEntry>();
  ReuseWork(e.get());
  return e;
}

void TensorQueue::NewEntries(size_t n,
                             std::vector<std::unique_ptr<TensorEntry>>* out) {
  out->clear();
  out->reserve(n);
  {
    MutexLock lock(&free_mu_);
    while (out->size() < n && !free_.empty()) {
      out->push_back(std::move(free_.back()));
      free_.pop_back();
    }
  }
  for (auto& e : *out) ReuseWork(e.get());
  while (out->size() < n) out->push_back(std::make_unique<TensorEntry>());
}

void TensorQueue::Recycle(std::vector<std::unique_ptr<TensorEntry>>* entries) {
  size_t kept = 0;
  for (auto& e : *entries) {
    // An entry not completed is not ours to forget (its Work would never
    // complete): it is destroyed as before recycling existed.
    if (!e || (e->work && !e->work->IsCompleted())) continue;
    e->Reset();
    (*entries)[kept++] = std::move(e);
  }
  entries->resize(kept);
  if (kept > 0) {
    MutexLock lock(&free_mu_);
    for (auto& e : *entries) {
      if (free_.size() >= kMaxFreeEntries) break;
      free_.push_back(std::move(e));
    }
  }
  entries->clear();
}

size_t TensorQueue::free_entries() const {
  MutexLock lock(&free_mu_);
  return free_.size();
}

// Note [Taking without the lock]
// The loop's turn (the background thread's, or a caller's) reads a take's
// requests (cache look-ups, copies into request lists: tens of
// microseconds for a step's gradients) after letting go of the queue's
// lock, so that a caller adding the burst's next tensors meanwhile does
// not wait for it. With the loop on a core of its own (a GPU job's spare
// cores) the loop takes a long burst in parts, and callers waiting for
// each part's reading cost about 0.4 us a tensor of a 200-tensor step
// (docs/benchmarks.md, round 9). Under the lock the take only swaps the
// list of new entries for an empty one and marks them sent. The entries
// stay alive while it reads them: in the course of a job only the loop's
// turn removes entries from the table (responses, time-outs), and Close
// and FailSet, which fail entries from other threads, leave the entries
// they removed during a take to the take to destroy (Bury). A request is
// not written once added, so reading it outside the lock is safe.
void TensorQueue::TakeNewRequests(
    absl::Time from, absl::Duration op_timeout,
    const std::function<void(const wire::Request&)>& fn) {
  {
    MutexLock lock(&mu_);
    if (new_entries_.empty()) return;
    for (TensorEntry* e : new_entries_) {
      e->sent = true;
      if (e->deadline != absl::InfiniteFuture()) continue;
      e->deadline = from + RequestTimeout(e->request, op_timeout);
      earliest_deadline_ = std::min(earliest_deadline_, e->deadline);
    }
    taking_.swap(new_entries_);  // new_entries_: the last take's storage
    has_new_.store(false, std::memory_order_release);
    take_running_ = true;
  }
  for (const TensorEntry* e : taking_) fn(e->request);
  std::vector<std::unique_ptr<TensorEntry>> dead;
  {
    MutexLock lock(&mu_);
    take_running_ = false;
    dead.swap(graveyard_);
  }
  taking_.clear();
}

void TensorQueue::Bury(std::vector<std::unique_ptr<TensorEntry>>* dead) {
  {
    MutexLock lock(&mu_);
    if (take_running_) {
      for (auto& e : *dead) graveyard_.push_back(std::move(e));
    }
  }
  dead->clear();
}

std::unique_ptr<TensorEntry> TensorQueue::Take(int process_set,
                                               const std::string& name) {
  std::unique_ptr<TensorEntry> entry;
  {
    MutexLock lock(&mu_);
    auto set = table_.find(process_set);
    if (set == table_.end()) return nullptr;
    auto it = set->second.find(name);
    if (it == set->second.end()) return nullptr;
    entry = std::move(it->second);
    set->second.erase(it);
    ForgetUnsent(entry.get());
    drained_cv_.NotifyAll();
  }
  return entry;
}

void TensorQueue::ForgetUnsent(const TensorEntry* e) {
  if (e->sent) return;
  new_entries_.erase(std::remove(new_entries_.begin(), new_entries_.end(), e),
                     new_entries_.end());
  has_new_.store(!new_entries_.empty(), std::memory_order_release);
}

void TensorQueue::TakeAll(
    int process_set,
    const google::protobuf::RepeatedPtrField<std::string>& names,
    std::vector<std::unique_ptr<TensorEntry>>* out) {
  out->clear();
  out->resize(names.size());
  MutexLock lock(&mu_);
  auto set = table_.find(process_set);
  if (set == table_.end()) return;
  for (int i = 0; i < names.size(); ++i) {
    auto it = set->second.find(names.Get(i));
    if (it == set->second.end()) continue;
    (*out)[i] = std::move(it->second);
    set->second.erase(it);
    ForgetUnsent((*out)[i].get());
  }
  drained_cv_.NotifyAll();
}

absl::Time TensorQueue::ExpireLocal(absl::Time now, absl::Duration op_timeout) {
  MutexLock lock(&mu_);
  // Called on every turn of the background loop: a scan only once the
  // earliest deadline (possibly of an entry already taken) has come.
  if (now < earliest_deadline_) return earliest_deadline_;
  absl::Time next = absl::InfiniteFuture();
  for (auto& [set, names] : table_) {
    for (auto& [name, e] : names) {
      if (e->scratch) continue;
      if (e->deadline > now) {
        next = std::min(next, e->deadline);
        continue;
      }
      const int64_t bytes = e->input.ByteSize();
      e->scratch = std::make_shared<std::vector<uint8_t>>(bytes);
      e->input.data = e->scratch->data();
      e->output = e->input;
      e->allocator =
          [scratch = std::make_shared<std::vector<uint8_t>>(),
           dtype = e->input.dtype](
              const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
        int64_t n = 1;
        for (int64_t d : shape) n *= d;
        scratch->resize(n * DataTypeSize(dtype));
        return static_cast<void*>(scratch->data());
      };
      // Completing under the lock is safe: it only wakes waiters.
      e->Complete(absl::DeadlineExceededError(absl::StrCat(
          CollectiveName(e->request.type()), " \"", e->request.name(),
          "\": no response from the coordinator within ",
          DescribeTimeout(e->request.timeout_us(), op_timeout),
          "; is rank 0 alive and reachable?")));
    }
  }
  earliest_deadline_ = next;
  return next;
}

void TensorQueue::Close(const absl::Status& status) {
  Table table;
  {
    MutexLock lock(&mu_);
    if (closed_.ok()) closed_ = status;
    table.swap(table_);
    new_entries_.clear();
    has_new_.store(false, std::memory_order_release);
    drained_cv_.NotifyAll();
  }
  std::vector<std::unique_ptr<TensorEntry>> dead;
  for (auto& [set, names] : table) {
    for (auto& [name, e] : names) {
      e->Complete(absl::Status(
          status.code(),
          absl::StrCat(CollectiveName(e->request.type()), " \"",
                       e->request.name(), "\" failed: ", status.message())));
      dead.push_back(std::move(e));
    }
  }
  table.clear();  // its keys viewed the names of `dead`
  Bury(&dead);
}

void TensorQueue::FailSet(int process_set, const absl::Status& status) {
  absl::flat_hash_map<absl::string_view, std::unique_ptr<TensorEntry>> names;
  {
    MutexLock lock(&mu_);
    auto it = table_.find(process_set);
    if (it == table_.end()) return;
    names.swap(it->second);
    table_.erase(it);
    new_entries_.erase(std::remove_if(new_entries_.begin(), new_entries_.end(),
                                      [&](const TensorEntry* e) {
                                        return e->request.process_set() ==
                                               process_set;
                                      }),
                       new_entries_.end());
    has_new_.store(!new_entries_.empty(), std::memory_order_release);
    drained_cv_.NotifyAll();
  }
  std::vector<std::unique_ptr<TensorEntry>> dead;
  for (auto& [name, e] : names) {
    e->Complete(absl::Status(
        status.code(),
        absl::StrCat(CollectiveName(e->request.type()), " \"",
                     e->request.name(), "\" failed: ", status.message())));
    dead.push_back(std::move(e));
  }
  names.clear();
  Bury(&dead);
}

bool TensorQueue::DrainedLocked() const {
  for (auto& [set, names] : table_) {
    for (auto& [name, e] : names) {
      if (!e->scratch) return false;
    }
  }
  return true;
}

bool TensorQueue::WaitDrained(absl::Time deadline) {
  MutexLock lock(&mu_);
  while (!DrainedLocked()) {
    if (!drained_cv_.WaitUntil(&mu_, deadline)) return DrainedLocked();
  }
  return true;
}

size_t TensorQueue::size() const {
  MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [set, names] : table_) n += names.size();
  return n;
}

absl::Status TensorQueue::closed_status() const {
  MutexLock lock(&mu_);
  return closed_;
}

}  // namespace kolo
