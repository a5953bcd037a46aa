// InMemoryStore: the Store shared by ranks running as threads of one process
// (tests), and the data behind the TCP store's server.
//
// Thread safety: every method is thread-safe. Get/Wait park on a condition
// variable woken by every change; nothing polls.
#ifndef KOLO_RUNTIME_RENDEZVOUS_IN_MEMORY_STORE_H_
#define KOLO_RUNTIME_RENDEZVOUS_IN_MEMORY_STORE_H_

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kolo/store.h"

namespace kolo {

class InMemoryStore : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override;
  absl::Status Wait(const std::vector<std::string>& keys,
                    absl::Duration timeout) override;
  absl::StatusOr<bool> Check(const std::string& key) override;

  // Wakes every parked Get/Wait, which then fail with Unavailable (so that a
  // server can join its connection threads without waiting out timeouts).
  void Shutdown();

 private:
  template <typename Predicate>
  bool WaitFor(std::unique_lock<std::mutex>& lock, absl::Duration timeout,
               Predicate ready);

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;  // guarded by mu_
  bool shut_down_ = false;                   // guarded by mu_
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_RENDEZVOUS_IN_MEMORY_STORE_H_
