// A TCP store server on an ephemeral loopback port and clients of it, for
// the TCP store's tests.
#ifndef KOLO_TESTS_RUNTIME_RENDEZVOUS_TCP_STORE_TESTING_H_
#define KOLO_TESTS_RUNTIME_RENDEZVOUS_TCP_STORE_TESTING_H_

#include <memory>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "runtime/rendezvous/tcp_store.h"

namespace kolo {
namespace rendezvous {
namespace testing {

inline constexpr char kSecret[] = "tcp-store-test-secret";

inline std::unique_ptr<TcpStoreServer> StartServer(
    int port = 0, ServerOptions options = ServerOptions()) {
  absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
      TcpStoreServer::Start("127.0.0.1", port, kSecret, std::move(options));
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? std::move(*server) : nullptr;
}

inline std::shared_ptr<Store> Connect(const TcpStoreServer& server,
                                      const std::string& secret = kSecret) {
  absl::StatusOr<std::shared_ptr<Store>> client =
      ConnectTcpStore("127.0.0.1", server.port(), secret, absl::Seconds(10));
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *client : nullptr;
}

}  // namespace testing
}  // namespace rendezvous
}  // namespace kolo

#endif  // KOLO_TESTS_RUNTIME_RENDEZVOUS_TCP_STORE_TESTING_H_
