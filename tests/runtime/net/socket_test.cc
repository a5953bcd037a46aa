#include "runtime/net/socket.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace kolo {
namespace net {
namespace {

absl::Time In(absl::Duration d) { return absl::Now() + d; }

struct Pair {
  Listener listener;
  Socket client;
  Socket server;
};

Pair Connected(const std::string& addr = "127.0.0.1") {
  Pair pair;
  absl::StatusOr<Listener> listener = Listener::Bind(addr, 0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  pair.listener = std::move(*listener);
  absl::StatusOr<Socket> client =
      Socket::Connect(addr, pair.listener.port(), In(absl::Seconds(10)));
  EXPECT_TRUE(client.ok()) << client.status();
  absl::StatusOr<Socket> server = pair.listener.Accept(In(absl::Seconds(10)));
  EXPECT_TRUE(server.ok()) << server.status();
  pair.client = std::move(*client);
  pair.server = std::move(*server);
  return pair;
}

// A port nobody listens on: bound, then released.
int UnusedPort() {
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  return listener->port();  // Closed when `listener` goes out of scope.
}

TEST(SocketTest, RoundTrip) {
  Pair pair = Connected();
  const std::string message = "hello, kolo";
  ASSERT_TRUE(
      pair.client.SendAll(message.data(), message.size(), In(absl::Seconds(5)))
          .ok());
  std::string got(message.size(), '\0');
  ASSERT_TRUE(
      pair.server.RecvAll(&got[0], got.size(), In(absl::Seconds(5))).ok());
  EXPECT_EQ(got, message);
  EXPECT_TRUE(absl::StartsWith(pair.server.PeerAddress(), "127.0.0.1:"))
      << pair.server.PeerAddress();
  EXPECT_EQ(pair.client.PeerAddress(),
            absl::StrCat("127.0.0.1:", pair.listener.port()));
}

TEST(SocketTest, LargeTransferWithConcurrentReader) {
  Pair pair = Connected();
  // Larger than any socket buffer: exercises partial sends and EAGAIN.
  std::string data(16 << 20, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  std::string got(data.size(), '\0');
  absl::Status recv_status;
  std::thread reader([&] {
    recv_status =
        pair.server.RecvAll(&got[0], got.size(), In(absl::Seconds(30)));
  });
  absl::Status send_status =
      pair.client.SendAll(data.data(), data.size(), In(absl::Seconds(30)));
  reader.join();
  ASSERT_TRUE(send_status.ok()) << send_status;
  ASSERT_TRUE(recv_status.ok()) << recv_status;
  EXPECT_TRUE(got == data);
}

TEST(SocketTest, RecvDeadline) {
  Pair pair = Connected();
  char byte;
  absl::Time start = absl::Now();
  absl::Status st =
      pair.server.RecvAll(&byte, 1, start + absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
}

TEST(SocketTest, WaitReadableDeadlineThenData) {
  Pair pair = Connected();
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      pair.server.WaitReadable(In(absl::Milliseconds(50)))));
  char byte = 'x';
  ASSERT_TRUE(pair.client.SendAll(&byte, 1, In(absl::Seconds(5))).ok());
  EXPECT_TRUE(pair.server.WaitReadable(In(absl::Seconds(5))).ok());
}

TEST(SocketTest, RecvEofIsUnavailable) {
  Pair pair = Connected();
  pair.client.Close();
  char buf[4];
  absl::Status st = pair.server.RecvAll(buf, sizeof(buf), In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "connection closed")) << st;
}

TEST(SocketTest, EofInTheMiddleOfAMessage) {
  Pair pair = Connected();
  ASSERT_TRUE(pair.client.SendAll("ab", 2, In(absl::Seconds(5))).ok());
  pair.client.Close();
  char buf[4];
  absl::Status st = pair.server.RecvAll(buf, sizeof(buf), In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
}

TEST(SocketTest, SendToClosedPeerIsUnavailableNotSigpipe) {
  Pair pair = Connected();
  pair.server.Close();
  std::string data(1 << 20, 'x');
  absl::Status st;
  // The first send may still land in the kernel buffer before the RST.
  for (int i = 0; i < 100 && st.ok(); ++i) {
    st = pair.client.SendAll(data.data(), data.size(), In(absl::Seconds(5)));
  }
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
}

TEST(SocketTest, ShutdownBothUnblocksReader) {
  Pair pair = Connected();
  absl::Status st;
  std::thread reader([&] {
    char byte;
    st = pair.server.RecvAll(&byte, 1, absl::InfiniteFuture());
  });
  pair.server.ShutdownBoth();
  reader.join();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
}

TEST(SocketTest, ConnectRefusedUntilDeadlineNamesHostPort) {
  const int port = UnusedPort();
  absl::Time start = absl::Now();
  absl::StatusOr<Socket> socket =
      Socket::Connect("127.0.0.1", port, start + absl::Milliseconds(300));
  ASSERT_FALSE(socket.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(socket.status())) << socket.status();
  EXPECT_TRUE(absl::StrContains(socket.status().message(),
                                absl::StrCat("127.0.0.1:", port)))
      << socket.status();
  // It kept retrying rather than failing on the first refusal.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(290));
}

TEST(SocketTest, ConnectRetriesUntilTheListenerIsUp) {
  const int port = UnusedPort();
  absl::StatusOr<Socket> client = absl::UnknownError("not run");
  std::thread connecter([&] {
    client = Socket::Connect("127.0.0.1", port, In(absl::Seconds(20)));
  });
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", port);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<Socket> server = listener->Accept(In(absl::Seconds(20)));
  connecter.join();
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
}

TEST(SocketTest, UnresolvableHostIsUnavailable) {
  absl::StatusOr<Socket> socket =
      Socket::Connect("no-such-host.invalid", 1234, In(absl::Seconds(5)));
  ASSERT_FALSE(socket.ok());
  EXPECT_TRUE(
      absl::StrContains(socket.status().message(), "no-such-host.invalid:1234"))
      << socket.status();
}

TEST(SocketTest, ConnectByHostName) {
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  // "localhost" may resolve to ::1 first; Connect must go on to 127.0.0.1.
  absl::StatusOr<Socket> client =
      Socket::Connect("localhost", listener->port(), In(absl::Seconds(10)));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(listener->Accept(In(absl::Seconds(10))).ok());
}

TEST(SocketTest, Ipv6Loopback) {
  absl::StatusOr<Listener> listener = Listener::Bind("::1", 0);
  if (!listener.ok()) GTEST_SKIP() << "no IPv6 loopback: " << listener.status();
  absl::StatusOr<Socket> client =
      Socket::Connect("::1", listener->port(), In(absl::Seconds(10)));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ(client->PeerAddress(), absl::StrCat("[::1]:", listener->port()));
  absl::StatusOr<Socket> server = listener->Accept(In(absl::Seconds(10)));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client->SendAll("6", 1, In(absl::Seconds(5))).ok());
  char byte = 0;
  ASSERT_TRUE(server->RecvAll(&byte, 1, In(absl::Seconds(5))).ok());
  EXPECT_EQ(byte, '6');
}

TEST(SocketTest, BindRejectsNamesAndEmptyAddress) {
  EXPECT_TRUE(absl::IsInvalidArgument(Listener::Bind("", 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(Listener::Bind("localhost", 0).status()));
}

TEST(SocketTest, AllFdsAreCloseOnExec) {
  Pair pair = Connected();
  for (int fd : {pair.client.fd(), pair.server.fd()}) {
    int flags = fcntl(fd, F_GETFD);
    ASSERT_GE(flags, 0);
    EXPECT_TRUE(flags & FD_CLOEXEC) << "fd " << fd;
  }
}

// The peer resets the connection (SO_LINGER 0): getpeername() fails from
// then on, yet the error still names the peer.
TEST(SocketTest, ResetByPeerNamesThePeer) {
  Pair pair = Connected();
  const std::string peer = pair.server.PeerAddress();
  ASSERT_TRUE(absl::StartsWith(peer, "127.0.0.1:")) << peer;
  struct linger abort_on_close = {1, 0};
  ASSERT_EQ(setsockopt(pair.client.fd(), SOL_SOCKET, SO_LINGER, &abort_on_close,
                       sizeof(abort_on_close)),
            0);
  pair.client.Close();
  char byte;
  absl::Status st = pair.server.RecvAll(&byte, 1, In(absl::Seconds(10)));
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "reset")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), peer)) << st;
  st = pair.server.SendAll("x", 1, In(absl::Seconds(10)));
  EXPECT_TRUE(absl::StrContains(st.message(), peer)) << st;
}

TEST(ListenerTest, TryAcceptDoesNotBlock) {
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<Socket> none = listener->TryAccept();
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->valid());
  absl::StatusOr<Socket> client =
      Socket::Connect("127.0.0.1", listener->port(), In(absl::Seconds(10)));
  ASSERT_TRUE(client.ok()) << client.status();
  // The connection is queued once connect() returned.
  absl::StatusOr<Socket> accepted = listener->TryAccept();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  ASSERT_TRUE(accepted->valid());
  EXPECT_TRUE(absl::StartsWith(accepted->PeerAddress(), "127.0.0.1:"));
}

// Out of descriptors: ResourceExhausted (the caller pauses accepting), and
// the connection stays queued for later.
TEST(ListenerTest, TryAcceptOutOfDescriptorsIsResourceExhausted) {
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<Socket> client =
      Socket::Connect("127.0.0.1", listener->port(), In(absl::Seconds(10)));
  ASSERT_TRUE(client.ok()) << client.status();
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  // Use up every descriptor below a low limit.
  std::vector<int> fillers;
  struct rlimit low = saved;
  low.rlim_cur = 64;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  for (;;) {
    int fd = dup(0);
    if (fd < 0) break;
    fillers.push_back(fd);
  }
  absl::StatusOr<Socket> accepted = listener->TryAccept();
  for (int fd : fillers) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_TRUE(absl::IsResourceExhausted(accepted.status()))
      << accepted.status();
  accepted = listener->TryAccept();
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_TRUE(accepted->valid());
}

TEST(ListenerTest, AcceptDeadline) {
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::Time start = absl::Now();
  absl::StatusOr<Socket> socket =
      listener->Accept(start + absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(socket.status())) << socket.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(95));
}

TEST(ListenerTest, CloseFromAnotherThreadUnblocksAccept) {
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<Socket> accepted = absl::UnknownError("not run");
  std::thread acceptor(
      [&] { accepted = listener->Accept(absl::InfiniteFuture()); });
  listener->Close();  // Before or during Accept: either way it returns.
  acceptor.join();
  EXPECT_TRUE(absl::IsCancelled(accepted.status())) << accepted.status();
  // Closed for good.
  EXPECT_TRUE(
      absl::IsCancelled(listener->Accept(In(absl::Seconds(1))).status()));
}

TEST(ListenerTest, ClosedListenerRefusesConnections) {
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status();
  const int port = listener->port();
  listener->Close();
  absl::StatusOr<Socket> client =
      Socket::Connect("127.0.0.1", port, In(absl::Milliseconds(100)));
  EXPECT_FALSE(client.ok());
}

}  // namespace
}  // namespace net
}  // namespace kolo
