// Store: the key-value store through which ranks rendezvous.
//
// Implementations: InMemoryStore (tests, threads of one process), PrefixStore
// (a namespace inside another store) and TcpStoreClient (authenticated TCP,
// served by TcpStoreServer in kolorun or in rank 0). Options::store takes
// any implementation of one's own.
//
// Thread safety: all methods are thread-safe (an implementation must make
// them so) and every blocking call takes a timeout.
//
// Errors: DeadlineExceeded naming the key(s) when a timeout passes,
// InvalidArgument for a bad value, Unavailable when a remote store cannot be
// reached.
#ifndef KOLO_STORE_H_
#define KOLO_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kolo {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any earlier value, and wakes waiters.
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;

  // Returns the value of `key`, waiting up to `timeout` for it to be set.
  // DeadlineExceeded (naming the key) if it is not set in time.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;

  // Atomically adds `delta` to the integer stored at `key` (absent = 0) and
  // returns the new value. InvalidArgument if the value is not an integer.
  virtual absl::StatusOr<int64_t> Add(const std::string& key,
                                      int64_t delta) = 0;

  // Waits until every key in `keys` is set. DeadlineExceeded naming the
  // missing keys if `timeout` passes first.
  virtual absl::Status Wait(const std::vector<std::string>& keys,
                            absl::Duration timeout) = 0;

  // Non-blocking: whether `key` is set.
  virtual absl::StatusOr<bool> Check(const std::string& key) = 0;
};

// Thread-safe in-process store.
std::shared_ptr<Store> NewInMemoryStore();

// Prepends `prefix` + "/" to every key of `base`.
std::shared_ptr<Store> NewPrefixStore(std::string prefix,
                                      std::shared_ptr<Store> base);

}  // namespace kolo

#endif  // KOLO_STORE_H_
