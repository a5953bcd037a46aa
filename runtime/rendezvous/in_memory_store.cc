// InMemoryStore: the Store that ranks running as threads of one process
// share (tests), and the model the TCP store's server follows.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "kolo/store.h"

namespace kolo {
namespace {

// Timeouts at least this long wait forever: adding them to steady_clock's
// now() would overflow.
constexpr absl::Duration kForever = absl::Hours(24 * 365 * 100);

class InMemoryStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    changed_.notify_all();
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto present = [&] { return data_.count(key) > 0; };
    if (!WaitFor(lock, timeout, present)) {
      return absl::DeadlineExceededError(
          absl::StrCat("timed out after ", absl::FormatDuration(timeout),
                       " waiting for store key \"", key, "\""));
    }
    return data_[key];
  }

  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !absl::SimpleAtoi(it->second, &current)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "store key \"", key, "\" holds a value that is not an integer (",
            it->second.size(), " bytes); cannot add ", delta, " to it"));
      }
      if (__builtin_add_overflow(current, delta, &result)) {
        return absl::InvalidArgumentError(
            absl::StrCat("adding ", delta, " to store key \"", key,
                         "\" (value ", current, ") overflows int64"));
      }
      data_[key] = absl::StrCat(result);
    }
    changed_.notify_all();
    return result;
  }

  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override {
    std::unique_lock<std::mutex> lock(mu_);
    auto all_present = [&] {
      for (const std::string& key : keys) {
        if (data_.count(key) == 0) return false;
      }
      return true;
    };
    if (WaitFor(lock, timeout, all_present)) return absl::OkStatus();
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (data_.count(key) == 0)
        missing.push_back(absl::StrCat("\"", key, "\""));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "timed out after ", absl::FormatDuration(timeout),
        " waiting for store keys; missing: ", absl::StrJoin(missing, ", ")));
  }

  absl::StatusOr<bool> Check(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.count(key) > 0;
  }

 private:
  // Waits on changed_ until `ready` holds or `timeout` passes; false on
  // timeout. The condition variable wakes waiters on every change, so no
  // waiter polls.
  template <typename Predicate>
  bool WaitFor(std::unique_lock<std::mutex>& lock, absl::Duration timeout,
               Predicate ready) {
    if (timeout >= kForever) {
      changed_.wait(lock, ready);
      return true;
    }
    if (timeout < absl::ZeroDuration()) timeout = absl::ZeroDuration();
    const auto deadline =
        std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(timeout);
    return changed_.wait_until(lock, deadline, ready);
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;  // guarded by mu_
};

}  // namespace

std::shared_ptr<Store> NewInMemoryStore() {
  return std::make_shared<InMemoryStore>();
}

}  // namespace kolo
