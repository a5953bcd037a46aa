#include "runtime/tensor_queue.h"

#include "absl/strings/str_cat.h"
#include "runtime/controller.h"

namespace kolo {

std::string QueueKey(int process_set, const std::string& name) {
  return absl::StrCat(process_set, "/", name);
}

void TensorEntry::Complete(const absl::Status& status,
                           std::vector<int64_t> splits) {
  if (!work->Complete(status, std::move(splits)) || !group) return;
  bool last = false;
  absl::Status final_status;
  {
    std::lock_guard<std::mutex> lock(group->mu);
    if (group->status.ok() && !status.ok()) group->status = status;
    last = --group->remaining == 0;
    final_status = group->status;
  }
  if (last) group->work->Complete(final_status);
}

absl::Status TensorQueue::Add(TensorEntry entry) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_.ok()) return closed_;
    const std::string& name = entry.request.name();
    const std::string key = QueueKey(entry.request.process_set(), name);
    auto it = table_.find(key);
    if (it != table_.end() && !it->second->scratch) {
      return absl::AlreadyExistsError(absl::StrCat(
          CollectiveName(entry.request.type()), " \"", name,
          "\": a collective with this name is already in flight on rank ",
          entry.request.rank(), "; wait for it before reusing the name"));
    }
    if (it != table_.end()) {
      // A timed-out entry still waits for its late response under this name.
      return absl::FailedPreconditionError(absl::StrCat(
          CollectiveName(entry.request.type()), " \"", name,
          "\": an earlier collective with this name timed out and has not "
          "been resolved by the other ranks yet"));
    }
    // The background thread takes all new requests at once: it needs a
    // wake-up only for the first one since it last took them, which saves
    // a system call per tensor when many are submitted in a burst.
    first = new_requests_.empty();
    new_requests_.push_back(entry.request);
    table_.emplace(key, std::make_unique<TensorEntry>(std::move(entry)));
  }
  if (first) notify_();
  return absl::OkStatus();
}

std::vector<wire::Request> TensorQueue::TakeNewRequests() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<wire::Request> out;
  out.swap(new_requests_);
  return out;
}

std::unique_ptr<TensorEntry> TensorQueue::Take(int process_set,
                                               const std::string& name) {
  std::unique_ptr<TensorEntry> entry;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = table_.find(QueueKey(process_set, name));
    if (it == table_.end()) return nullptr;
    entry = std::move(it->second);
    table_.erase(it);
    drained_cv_.notify_all();
  }
  return entry;
}

absl::Time TensorQueue::ExpireLocal(absl::Time now, absl::Duration op_timeout) {
  absl::Time next = absl::InfiniteFuture();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, e] : table_) {
    if (e->scratch) continue;
    if (e->deadline > now) {
      next = std::min(next, e->deadline);
      continue;
    }
    const int64_t bytes = e->input.ByteSize();
    e->scratch = std::make_shared<std::vector<uint8_t>>(bytes);
    e->input.data = e->scratch->data();
    e->output = e->input;
    e->allocator = [scratch = std::make_shared<std::vector<uint8_t>>(),
                    dtype = e->input.dtype](const std::vector<int64_t>& shape)
        -> absl::StatusOr<void*> {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      scratch->resize(n * DataTypeSize(dtype));
      return static_cast<void*>(scratch->data());
    };
    // Completing under the lock is safe: it only wakes waiters.
    e->Complete(absl::DeadlineExceededError(absl::StrCat(
        CollectiveName(e->request.type()), " \"", e->request.name(),
        "\": no response from the coordinator within ",
        absl::FormatDuration(op_timeout),
        " (KOLO_OP_TIMEOUT); is rank 0 alive and reachable?")));
  }
  return next;
}

void TensorQueue::Close(const absl::Status& status) {
  std::map<std::string, std::unique_ptr<TensorEntry>> table;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.ok()) closed_ = status;
    table.swap(table_);
    new_requests_.clear();
    drained_cv_.notify_all();
  }
  for (auto& [key, e] : table) {
    e->Complete(absl::Status(
        status.code(),
        absl::StrCat(CollectiveName(e->request.type()), " \"",
                     e->request.name(), "\" failed: ", status.message())));
  }
}

bool TensorQueue::WaitDrained(absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto drained = [&] {
    for (auto& [name, e] : table_) {
      if (!e->scratch) return false;
    }
    return true;
  };
  while (!drained()) {
    if (drained_cv_.wait_for(
            lock, absl::ToChronoNanoseconds(deadline - absl::Now())) ==
            std::cv_status::timeout &&
        absl::Now() >= deadline) {
      return drained();
    }
  }
  return true;
}

size_t TensorQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return table_.size();
}

absl::Status TensorQueue::closed_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

}  // namespace kolo
