#include "runtime/rendezvous/in_memory_store.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/format.h"

namespace kolo {
namespace {

// Timeouts at least this long wait forever: adding them to steady_clock's
// now() would overflow.
constexpr absl::Duration kForever = absl::Hours(24 * 365 * 100);

}  // namespace

absl::Status StoreShuttingDown() {
  return absl::UnavailableError("the rendezvous store is shutting down");
}

absl::Status StoreGetTimedOut(const std::string& key, absl::Duration timeout) {
  return absl::DeadlineExceededError(
      absl::StrCat("timed out after ", FormatSeconds(timeout),
                   " waiting for store key \"", key, "\""));
}

absl::Status StoreWaitTimedOut(const std::vector<std::string>& missing,
                               absl::Duration timeout) {
  std::vector<std::string> quoted;
  for (const std::string& key : missing) {
    quoted.push_back(absl::StrCat("\"", key, "\""));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "timed out after ", FormatSeconds(timeout),
      " waiting for store keys; missing: ", absl::StrJoin(quoted, ", ")));
}

void InMemoryStore::Changed() {
  changed_.NotifyAll();
  if (on_change_) on_change_();
}

absl::Time InMemoryStore::DeadlineAfter(absl::Duration timeout) {
  if (timeout >= kForever) return absl::InfiniteFuture();
  return absl::Now() + std::max(timeout, absl::ZeroDuration());
}

bool InMemoryStore::AllPresentLocked(
    const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (data_.count(key) == 0) return false;
  }
  return true;
}

absl::Status InMemoryStore::Set(const std::string& key,
                                const std::string& value) {
  {
    MutexLock lock(&mu_);
    data_[key] = value;
  }
  Changed();
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key,
                                               absl::Duration timeout) {
  MutexLock lock(&mu_);
  const absl::Time deadline = DeadlineAfter(timeout);
  while (data_.count(key) == 0 && !shut_down_ &&
         changed_.WaitUntil(&mu_, deadline)) {
  }
  if (data_.count(key) > 0) return data_[key];
  if (shut_down_) return StoreShuttingDown();
  return StoreGetTimedOut(key, timeout);
}

absl::StatusOr<int64_t> InMemoryStore::Add(const std::string& key,
                                           int64_t delta) {
  int64_t result = 0;
  {
    MutexLock lock(&mu_);
    int64_t current = 0;
    auto it = data_.find(key);
    if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "store key \"", key, "\" holds a value that is not an integer (",
          it->second.size(), " bytes); cannot add ", delta, " to it"));
    }
    if (__builtin_add_overflow(current, delta, &result)) {
      return absl::InvalidArgumentError(
          absl::StrCat("adding ", delta, " to store key \"", key, "\" (value ",
                       current, ") overflows int64"));
    }
    data_[key] = absl::StrCat(result);
  }
  Changed();
  return result;
}

absl::Status InMemoryStore::Wait(const std::vector<std::string>& keys,
                                 absl::Duration timeout) {
  MutexLock lock(&mu_);
  const absl::Time deadline = DeadlineAfter(timeout);
  while (!AllPresentLocked(keys) && !shut_down_ &&
         changed_.WaitUntil(&mu_, deadline)) {
  }
  if (AllPresentLocked(keys)) return absl::OkStatus();
  if (shut_down_) return StoreShuttingDown();
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  return StoreWaitTimedOut(missing, timeout);
}

absl::StatusOr<bool> InMemoryStore::Check(const std::string& key) {
  MutexLock lock(&mu_);
  return data_.count(key) > 0;
}

std::optional<std::string> InMemoryStore::TryGet(const std::string& key) {
  MutexLock lock(&mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::string> InMemoryStore::MissingKeys(
    const std::vector<std::string>& keys) {
  MutexLock lock(&mu_);
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (data_.count(key) == 0) missing.push_back(key);
  }
  return missing;
}

void InMemoryStore::Shutdown() {
  {
    MutexLock lock(&mu_);
    shut_down_ = true;
  }
  changed_.NotifyAll();
}

std::shared_ptr<Store> NewInMemoryStore() {
  return std::make_shared<InMemoryStore>();
}

}  // namespace kolo
