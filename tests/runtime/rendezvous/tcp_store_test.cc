#include "runtime/rendezvous/tcp_store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "runtime/net/socket.h"
#include "tests/runtime/rendezvous/store_contract.h"
#include "tests/runtime/rendezvous/tcp_store_testing.h"
#include "tests/testing/threads.h"

namespace kolo {
namespace rendezvous {
namespace {

using ::kolo::testing::StoreContractTest;
using ::kolo::testing::StoreEnv;
using ::kolo::testing::StoreParam;

using ::kolo::rendezvous::testing::Connect;
using ::kolo::rendezvous::testing::kSecret;
using ::kolo::rendezvous::testing::StartServer;
using ::kolo::testing::ThreadCount;

// Every handle is its own authenticated connection to one server.
class TcpEnv : public StoreEnv {
 public:
  TcpEnv() : server_(StartServer()) {}
  std::shared_ptr<Store> NewHandle() override { return Connect(*server_); }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

INSTANTIATE_TEST_SUITE_P(Tcp, StoreContractTest,
                         ::testing::Values(StoreParam{
                             "Tcp", [] { return std::make_unique<TcpEnv>(); }}),
                         ::kolo::testing::StoreParamName);

TEST(TcpStoreTest, ClientsAndLocalAccessShareData) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(server->local()->Set("from-local", "1").ok());
  EXPECT_EQ(*client->Get("from-local", absl::Seconds(5)), "1");
  ASSERT_TRUE(client->Set("from-client", "2").ok());
  EXPECT_EQ(*server->local()->Get("from-client", absl::Seconds(5)), "2");
}

TEST(TcpStoreTest, LargeValue) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  std::string value(8 << 20, 'v');
  ASSERT_TRUE(client->Set("big", value).ok());
  EXPECT_TRUE(*client->Get("big", absl::Seconds(10)) == value);
  // Over the store's frame cap: refused locally, connection still usable.
  absl::Status st =
      client->Set("huge", std::string(kMaxStoreFrameBytes + 1, 'h'));
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_TRUE(client->Set("small", "ok").ok());
}

TEST(TcpStoreTest, WrongSecretIsRejectedAndCounted) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->auth_failures(), 0);
  absl::StatusOr<std::shared_ptr<Store>> client = ConnectTcpStore(
      "127.0.0.1", server->port(), "not-the-secret", absl::Seconds(10));
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(client.status())) << client.status();
  EXPECT_TRUE(
      absl::StartsWith(client.status().message(), "authentication failed"))
      << client.status();
  EXPECT_FALSE(absl::StrContains(client.status().message(), kSecret));
  // The server counts the failure before it closes the connection, and the
  // client saw the close.
  EXPECT_EQ(server->auth_failures(), 1);
  // Good clients are unaffected.
  std::shared_ptr<Store> good = Connect(*server);
  ASSERT_NE(good, nullptr);
  EXPECT_TRUE(good->Set("k", "v").ok());
  EXPECT_EQ(server->auth_failures(), 1);
}

TEST(TcpStoreTest, SilentConnectionIsClosedAfterTheHandshakeTimeout) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  absl::Time start = absl::Now();
  absl::StatusOr<net::Socket> socket = net::Socket::Connect(
      "127.0.0.1", server->port(), start + absl::Seconds(10));
  ASSERT_TRUE(socket.ok()) << socket.status();
  char nonce[32];
  ASSERT_TRUE(
      socket->RecvAll(nonce, sizeof(nonce), start + absl::Seconds(10)).ok());
  // Send nothing; the server must hang up on its own.
  char byte;
  absl::Status st = socket->RecvAll(&byte, 1, start + absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  absl::Duration elapsed = absl::Now() - start;
  EXPECT_GE(elapsed, kHandshakeTimeout - absl::Milliseconds(100));
  EXPECT_LT(elapsed, absl::Seconds(10));
}

TEST(TcpStoreTest, SlowClientDoesNotBlockOthers) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  // A connection that never handshakes...
  absl::StatusOr<net::Socket> idle = net::Socket::Connect(
      "127.0.0.1", server->port(), absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(idle.ok()) << idle.status();
  // ...does not delay a real client.
  absl::Time start = absl::Now();
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Set("k", "v").ok());
  EXPECT_LT(absl::Now() - start, kHandshakeTimeout);
}

TEST(TcpStoreTest, StopWhileAClientIsBlockedInGet) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread getter([&] {
    // Stop may already cut the SET's reply; the GET must fail either way.
    client->Set("getter-ready", "1").IgnoreError();
    got = client->Get("never-set", absl::Seconds(300));
  });
  // The getter's GET follows its SET on the same connection, so it is on
  // its way (or parked) by now; Stop must end it either way.
  ASSERT_TRUE(server->local()->Get("getter-ready", absl::Seconds(30)).ok());
  absl::Time start = absl::Now();
  server->Stop();
  getter.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  // Later calls fail fast and name the store.
  absl::Status st = client->Set("after-stop", "1");
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(
      st.message(),
      absl::StrCat("rendezvous store at 127.0.0.1:", server->port())))
      << st;
}

// Note [Rank 0's store at shutdown]: a client whose parked GET ends because
// the store stopped may connect again at once; it must be refused (and so
// retry until the next store is up), never accepted by the listener that is
// going away and then reset.
TEST(TcpStoreTest, AGetEndedByStopFindsTheListenerClosed) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  int connect_errno = 0;
  std::thread getter([&] {
    client->Set("getter-ready", "1").IgnoreError();
    got = client->Get("never-set", absl::Seconds(300));
    // At once, as a rank joining again does.
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connect_errno = ::connect(fd, reinterpret_cast<struct sockaddr*>(&addr),
                              sizeof(addr)) == 0
                        ? 0
                        : errno;
    ::close(fd);
  });
  ASSERT_TRUE(server->local()->Get("getter-ready", absl::Seconds(30)).ok());
  server->Stop();
  getter.join();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(connect_errno, ECONNREFUSED)
      << "connect after the GET ended: " << std::strerror(connect_errno);
}

TEST(TcpStoreTest, LostConnectionIsUnavailable) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const int port = server->port();
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  server.reset();  // Destruction stops the server too.
  absl::StatusOr<bool> st = client->Check("k");
  EXPECT_TRUE(absl::IsUnavailable(st.status())) << st.status();
  EXPECT_TRUE(absl::StrContains(
      st.status().message(),
      absl::StrCat("lost connection to the rendezvous store at 127.0.0.1:",
                   port)))
      << st.status();
}

TEST(TcpStoreTest, StopJoinsEveryThread) {
  const int before = ThreadCount();
  {
    std::unique_ptr<TcpStoreServer> server = StartServer();
    ASSERT_NE(server, nullptr);
    // Many short connections (each a thread that must be reaped) and some
    // that are still open, one mid-handshake, when Stop runs.
    for (int i = 0; i < 50; ++i) {
      std::shared_ptr<Store> client = Connect(*server);
      ASSERT_NE(client, nullptr);
      ASSERT_TRUE(client->Set(absl::StrCat("k", i), "v").ok());
    }
    std::vector<std::shared_ptr<Store>> open;
    for (int i = 0; i < 3; ++i) open.push_back(Connect(*server));
    absl::StatusOr<net::Socket> half_open = net::Socket::Connect(
        "127.0.0.1", server->port(), absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(half_open.ok());
    server->Stop();
    server->Stop();  // Idempotent.
  }
  EXPECT_EQ(ThreadCount(), before);
}

TEST(TcpStoreTest, ConnectWaitsForTheServerToComeUp) {
  int port;
  {
    absl::StatusOr<net::Listener> probe = net::Listener::Bind("127.0.0.1", 0);
    ASSERT_TRUE(probe.ok());
    port = probe->port();
  }
  absl::StatusOr<std::shared_ptr<Store>> client = absl::UnknownError("not run");
  std::thread connecter([&] {
    client = ConnectTcpStore("127.0.0.1", port, kSecret, absl::Seconds(30));
  });
  std::unique_ptr<TcpStoreServer> server = StartServer(port);
  connecter.join();
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Set("k", "v").ok());
}

TEST(TcpStoreTest, ConnectTimeoutNamesTheAddress) {
  int port;
  {
    absl::StatusOr<net::Listener> probe = net::Listener::Bind("127.0.0.1", 0);
    ASSERT_TRUE(probe.ok());
    port = probe->port();
  }
  absl::StatusOr<std::shared_ptr<Store>> client =
      ConnectTcpStore("127.0.0.1", port, kSecret, absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(client.status())) << client.status();
  EXPECT_TRUE(absl::StrContains(client.status().message(),
                                absl::StrCat("127.0.0.1:", port)))
      << client.status();
}

TEST(TcpStoreTest, PrefixStoreOverTcp) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  std::shared_ptr<Store> prefixed = NewPrefixStore("round1", client);
  ASSERT_TRUE(prefixed->Set("k", "v").ok());
  EXPECT_EQ(*server->local()->Get("round1/k", absl::Seconds(5)), "v");
}

TEST(TcpStoreTest, StartRejectsEmptySecretAndBadAddress) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      TcpStoreServer::Start("127.0.0.1", 0, "").status()));
  EXPECT_FALSE(TcpStoreServer::Start("not-an-address", 0, kSecret).ok());
}

}  // namespace
}  // namespace rendezvous
}  // namespace kolo
