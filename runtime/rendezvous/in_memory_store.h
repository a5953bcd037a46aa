// InMemoryStore: the Store shared by ranks running as threads of one process
// (tests), and the data behind the TCP store's server.
//
// Thread safety: every method is thread-safe. Get/Wait park on a condition
// variable woken by every change; nothing polls. A server that parks
// requests itself (TcpStoreServer) uses the non-blocking TryGet/MissingKeys
// and learns of changes through `on_change`.
#ifndef KOLO_RUNTIME_RENDEZVOUS_IN_MEMORY_STORE_H_
#define KOLO_RUNTIME_RENDEZVOUS_IN_MEMORY_STORE_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kolo/store.h"
#include "runtime/sync/mutex.h"

namespace kolo {

class InMemoryStore : public Store {
 public:
  InMemoryStore() = default;
  // `on_change` runs after every successful Set and Add, on the thread that
  // made the change, outside the store's lock.
  explicit InMemoryStore(std::function<void()> on_change)
      : on_change_(std::move(on_change)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::string& key) override;

  // Non-blocking: the value of `key` if it is set.
  std::optional<std::string> TryGet(const std::string& key);
  // Non-blocking: the keys of `keys` that are not set, in their order.
  std::vector<std::string> MissingKeys(const std::vector<std::string>& keys);

  // Wakes every parked Get/Wait, which then fail with Unavailable (so that a
  // server can stop without waiting out timeouts).
  void Shutdown();

 private:
  // The end of a wait of `timeout` (kForever: none).
  static absl::Time DeadlineAfter(absl::Duration timeout);
  bool AllPresentLocked(const std::vector<std::string>& keys) const
      KOLO_REQUIRES(mu_);

  void Changed();

  const std::function<void()> on_change_;
  Mutex mu_;
  CondVar changed_;
  std::map<std::string, std::string> data_ KOLO_GUARDED_BY(mu_);
  bool shut_down_ KOLO_GUARDED_BY(mu_) = false;
};

// The errors of InMemoryStore's Get and Wait when they time out or the store
// shuts down, for servers that wait on its behalf.
absl::Status StoreGetTimedOut(const std::string& key, absl::Duration timeout);
absl::Status StoreWaitTimedOut(const std::vector<std::string>& missing,
                               absl::Duration timeout);
absl::Status StoreShuttingDown();

}  // namespace kolo

#endif  // KOLO_RUNTIME_RENDEZVOUS_IN_MEMORY_STORE_H_
