// The TCP store's server under load and attack (Note [One thread for every
// store connection] in runtime/rendezvous/tcp_store.h): connections cost no
// thread, unauthenticated ones are bounded and timed out, parked requests
// are answered by changes from anywhere, in order, and Stop() ends them.
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
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
#include "runtime/rendezvous/in_memory_store.h"
#include "runtime/rendezvous/tcp_store.h"
#include "runtime/wire.pb.h"
#include "tests/runtime/rendezvous/tcp_store_testing.h"
#include "tests/testing/raw_protocol.h"
#include "tests/testing/threads.h"

namespace kolo {
namespace rendezvous {
namespace {

using ::kolo::testing::BigEndian;
using ::kolo::testing::EncodeFrame;

using ::kolo::rendezvous::testing::Connect;
using ::kolo::rendezvous::testing::kSecret;
using ::kolo::rendezvous::testing::StartServer;
using ::kolo::testing::ThreadCount;

absl::Time In(absl::Duration d) { return absl::Now() + d; }

// Waits for a condition that another thread brings about (the server's
// stats), checking every millisecond; false at the deadline.
bool WaitUntil(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = In(timeout);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

net::Socket RawConnect(const TcpStoreServer& server) {
  absl::StatusOr<net::Socket> socket =
      net::Socket::Connect("127.0.0.1", server.port(), In(absl::Seconds(10)));
  EXPECT_TRUE(socket.ok()) << socket.status();
  return socket.ok() ? std::move(*socket) : net::Socket();
}

// True if the server closes `socket` before `deadline` (bytes the server
// sent before closing are skipped).
bool ClosedBy(net::Socket& socket, absl::Time deadline) {
  char buf[256];
  for (;;) {
    absl::Status st = socket.WaitReadable(deadline);
    if (!st.ok()) return false;
    ssize_t n = recv(socket.fd(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
  }
}

void SendRaw(net::Socket& socket, const std::string& bytes) {
  ASSERT_TRUE(
      socket.SendAll(bytes.data(), bytes.size(), In(absl::Seconds(10))).ok());
}

// A client speaking the protocol by hand (tests/testing/raw_protocol.h).
struct RawClient {
  net::Socket socket;
  std::string key;
  uint64_t send_seq = 0;
  uint64_t recv_seq = 0;

  std::string Frame(const wire::StoreRequest& request) {
    std::string bytes;
    request.SerializeToString(&bytes);
    return EncodeFrame(key, 1, send_seq++, bytes);
  }
  // Reads one response frame and checks its MAC and sequence by hand.
  wire::StoreResponse Read() {
    wire::StoreResponse response;
    char header[12];
    const absl::Time deadline = In(absl::Seconds(30));
    if (!socket.RecvAll(header, sizeof(header), deadline).ok()) {
      ADD_FAILURE() << "no response";
      return response;
    }
    uint64_t length = 0;
    for (int i = 0; i < 4; ++i) {
      length = (length << 8) | static_cast<unsigned char>(header[i]);
    }
    std::string rest(length + 32, '\0');
    EXPECT_TRUE(socket.RecvAll(&rest[0], rest.size(), deadline).ok());
    const std::string payload = rest.substr(0, length);
    EXPECT_EQ(std::string(header, 12) + rest,
              EncodeFrame(key, 2, recv_seq++, payload));
    EXPECT_TRUE(response.ParseFromString(payload));
    return response;
  }
};

RawClient RawAuthenticated(const TcpStoreServer& server) {
  RawClient client;
  client.socket = RawConnect(server);
  client.key = ::kolo::testing::RawClientHandshake(client.socket, kSecret);
  EXPECT_FALSE(client.key.empty());
  return client;
}

wire::StoreRequest Request(wire::StoreOp op, const std::string& key,
                           const std::string& value = "") {
  wire::StoreRequest request;
  request.set_op(op);
  request.set_key(key);
  request.set_value(value);
  request.set_timeout_ms(30000);
  return request;
}

TEST(TcpStoreServerTest, HeldUnauthenticatedConnectionsCostNoThread) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  const int threads_before = ThreadCount();
  // More than the 256 pending handshakes the server holds.
  constexpr int kHeld = 400;
  std::vector<net::Socket> held;
  std::vector<absl::Time> opened;
  for (int i = 0; i < kHeld; ++i) {
    held.push_back(RawConnect(*server));
    opened.push_back(absl::Now());
    char nonce[32];
    // Each is accepted and gets its nonce (the newest within ~0.1 s, when
    // the oldest is old enough to make room).
    ASSERT_TRUE(
        held.back().RecvAll(nonce, sizeof(nonce), In(absl::Seconds(10))).ok())
        << i;
  }
  EXPECT_EQ(ThreadCount(), threads_before);
  EXPECT_LE(server->stats().pending_handshakes, 256);
  int closed = 0;
  absl::Duration first_closed_after;
  for (int i = 0; i < kHeld; ++i) {
    // Closed at the handshake timeout at the latest (3 s after its accept,
    // which follows its connect closely).
    if (ClosedBy(held[i], opened[i] + kHandshakeTimeout + absl::Seconds(1))) {
      ++closed;
    }
    if (i == 0) first_closed_after = absl::Now() - opened[0];
  }
  std::printf("closed %d of %d held connections; the oldest after %s\n", closed,
              kHeld, absl::FormatDuration(first_closed_after).c_str());
  EXPECT_EQ(closed, kHeld);
  // The oldest made room for newer ones long before its timeout.
  EXPECT_LT(first_closed_after, kHandshakeTimeout - absl::Seconds(1));
  EXPECT_TRUE(WaitUntil([&] { return server->stats().pending_handshakes == 0; },
                        absl::Seconds(5)));
  EXPECT_EQ(ThreadCount(), threads_before);
}

// Connect/close churn and 1,500 held connections at once; an authenticated
// client (one connected before, and new ones) still gets every answer.
TEST(TcpStoreServerTest, FloodDoesNotStopAuthenticatedClients) {
  struct rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_cur < 4096 && limit.rlim_max >= 4096) {
    limit.rlim_cur = 4096;
    ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::shared_ptr<Store> before = Connect(*server);
  ASSERT_NE(before, nullptr);
  const int threads_before = ThreadCount();

  std::atomic<bool> stop{false};
  std::atomic<int64_t> churned{0};
  std::vector<std::thread> attackers;
  for (int t = 0; t < 2; ++t) {
    attackers.emplace_back([&] {
      while (!stop.load()) {
        absl::StatusOr<net::Socket> s = net::Socket::Connect(
            "127.0.0.1", server->port(), In(absl::Seconds(5)));
        if (s.ok()) ++churned;
      }
    });
  }
  std::atomic<int> held_count{0};
  attackers.emplace_back([&] {
    std::vector<net::Socket> held;
    while (held.size() < 1500 && !stop.load()) {
      absl::StatusOr<net::Socket> s = net::Socket::Connect(
          "127.0.0.1", server->port(), In(absl::Seconds(10)));
      if (s.ok()) held.push_back(std::move(*s));
      held_count = static_cast<int>(held.size());
    }
    while (!stop.load()) absl::SleepFor(absl::Milliseconds(5));
  });

  int rounds = 0;
  int max_threads = 0;
  const absl::Time end = In(absl::Seconds(3));
  while (absl::Now() < end || rounds < 3) {
    std::shared_ptr<Store> fresh = Connect(*server);
    ASSERT_NE(fresh, nullptr) << "round " << rounds;
    for (Store* store : {before.get(), fresh.get()}) {
      const std::string key =
          absl::StrCat("k", rounds, "-", store == fresh.get());
      ASSERT_TRUE(store->Set(key, "v").ok());
      absl::StatusOr<std::string> got = store->Get(key, absl::Seconds(10));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, "v");
      ASSERT_TRUE(store->Wait({key}, absl::Seconds(10)).ok());
    }
    max_threads = std::max(max_threads, ThreadCount());
    ++rounds;
  }
  stop = true;
  for (std::thread& t : attackers) t.join();
  std::printf(
      "%d rounds of SET/GET/WAIT on an old and a new connection "
      "during %lld connects/closes and %d held connections\n",
      rounds, static_cast<long long>(churned.load()), held_count.load());
  // The test's own three attackers; nothing of the server's.
  EXPECT_EQ(max_threads, threads_before + 3);
  EXPECT_GT(churned.load(), 1000);
}

TEST(TcpStoreServerTest, ParkedGetIsAnsweredBySetFromAnotherConnection) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  std::shared_ptr<Store> getter = Connect(*server);
  std::shared_ptr<Store> setter = Connect(*server);
  ASSERT_TRUE(getter && setter);
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread waiting([&] { got = getter->Get("k", absl::Seconds(60)); });
  ASSERT_TRUE(WaitUntil([&] { return server->stats().parked_requests == 1; },
                        absl::Seconds(10)));
  const absl::Time set_at = absl::Now();
  ASSERT_TRUE(setter->Set("k", "from another connection").ok());
  waiting.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "from another connection");
  EXPECT_LT(absl::Now() - set_at, absl::Seconds(10));
  EXPECT_EQ(server->stats().parked_requests, 0);
}

TEST(TcpStoreServerTest, ParkedWaitIsAnsweredBySetThroughLocal) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  std::shared_ptr<Store> waiter = Connect(*server);
  ASSERT_NE(waiter, nullptr);
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiting([&] {
    waited = waiter->Wait({"a", "b"}, absl::Seconds(60));
  });
  ASSERT_TRUE(WaitUntil([&] { return server->stats().parked_requests == 1; },
                        absl::Seconds(10)));
  ASSERT_TRUE(server->local()->Set("a", "1").ok());
  EXPECT_EQ(server->stats().parked_requests, 1);  // "b" is still missing.
  ASSERT_TRUE(server->local()->Set("b", "2").ok());
  waiting.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

// A connection's next frames wait while its request is parked: the SET
// sent right behind a parked GET takes effect only after the GET's answer,
// and the answers come in request order.
TEST(TcpStoreServerTest, RequestsBehindAParkedOneWait) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  RawClient raw = RawAuthenticated(*server);
  std::string bytes = raw.Frame(Request(wire::STORE_GET, "k"));
  bytes += raw.Frame(Request(wire::STORE_SET, "after", "x"));
  SendRaw(raw.socket, bytes);  // Both frames in one segment.
  ASSERT_TRUE(WaitUntil([&] { return server->stats().parked_requests == 1; },
                        absl::Seconds(10)));
  EXPECT_FALSE(*server->local()->Check("after"));
  ASSERT_TRUE(server->local()->Set("k", "v").ok());
  wire::StoreResponse first = raw.Read();
  EXPECT_EQ(first.code(), 0) << first.message();
  EXPECT_EQ(first.value(), "v");
  wire::StoreResponse second = raw.Read();
  EXPECT_EQ(second.code(), 0) << second.message();
  EXPECT_EQ(*server->local()->Get("after", absl::Seconds(10)), "x");
}

TEST(TcpStoreServerTest, PipelinedRequestsAreAnsweredInOrder) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  RawClient raw = RawAuthenticated(*server);
  std::string bytes;
  constexpr int kPairs = 200;
  for (int i = 0; i < kPairs; ++i) {
    bytes += raw.Frame(
        Request(wire::STORE_SET, absl::StrCat("k", i), absl::StrCat("v", i)));
    bytes += raw.Frame(Request(wire::STORE_GET, absl::StrCat("k", i)));
  }
  SendRaw(raw.socket, bytes);
  for (int i = 0; i < kPairs; ++i) {
    EXPECT_EQ(raw.Read().code(), 0);
    wire::StoreResponse got = raw.Read();
    ASSERT_EQ(got.code(), 0) << got.message();
    EXPECT_EQ(got.value(), absl::StrCat("v", i));
  }
}

// Timed-out GET and WAIT say what InMemoryStore says.
TEST(TcpStoreServerTest, TimeoutsKeepTheInMemoryStatusAndMessage) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  InMemoryStore memory;
  ASSERT_TRUE(client->Set("present", "1").ok());
  ASSERT_TRUE(memory.Set("present", "1").ok());
  for (absl::Duration timeout :
       {absl::ZeroDuration(), absl::Milliseconds(150)}) {
    SCOPED_TRACE(absl::FormatDuration(timeout));
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> over_tcp = client->Get("missing", timeout);
    EXPECT_GE(absl::Now() - start, timeout);
    absl::StatusOr<std::string> in_memory = memory.Get("missing", timeout);
    EXPECT_EQ(over_tcp.status(), in_memory.status());
    EXPECT_TRUE(absl::IsDeadlineExceeded(over_tcp.status()));
    absl::Status waited_tcp =
        client->Wait({"present", "absent-1", "absent-2"}, timeout);
    absl::Status waited_memory =
        memory.Wait({"present", "absent-1", "absent-2"}, timeout);
    EXPECT_EQ(waited_tcp, waited_memory);
    EXPECT_TRUE(absl::IsDeadlineExceeded(waited_tcp));
  }
  EXPECT_EQ(server->stats().parked_requests, 0);
}

TEST(TcpStoreServerTest, StopWithParkedRequestsReturnsPromptly) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  constexpr int kWaiters = 3;
  std::vector<std::shared_ptr<Store>> clients;
  for (int i = 0; i < kWaiters; ++i) clients.push_back(Connect(*server));
  std::vector<absl::Status> results(kWaiters, absl::UnknownError("not run"));
  std::vector<std::thread> waiting;
  for (int i = 0; i < kWaiters; ++i) {
    waiting.emplace_back([&, i] {
      results[i] = i == 0
                       ? clients[i]->Get("never", absl::Seconds(300)).status()
                       : clients[i]->Wait({"never"}, absl::Seconds(300));
    });
  }
  absl::Status local_result = absl::UnknownError("not run");
  std::shared_ptr<Store> local = server->local();
  std::thread local_waiting(
      [&] { local_result = local->Get("never", absl::Seconds(300)).status(); });
  ASSERT_TRUE(
      WaitUntil([&] { return server->stats().parked_requests == kWaiters; },
                absl::Seconds(10)));
  const absl::Time start = absl::Now();
  server->Stop();
  for (std::thread& t : waiting) t.join();
  local_waiting.join();
  const absl::Duration took = absl::Now() - start;
  std::printf("Stop() and the parked requests' answers took %s\n",
              absl::FormatDuration(took).c_str());
  EXPECT_LT(took, absl::Seconds(5));
  for (const absl::Status& st : results) {
    EXPECT_TRUE(absl::IsUnavailable(st)) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "shutting down")) << st;
  }
  EXPECT_TRUE(absl::IsUnavailable(local_result)) << local_result;
}

// Each attack closes its own connection only: an authenticated client and
// a parked request on other connections carry on.
TEST(TcpStoreServerTest, HostileBytesCloseOnlyTheirConnection) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  std::shared_ptr<Store> good = Connect(*server);
  std::shared_ptr<Store> parked = Connect(*server);
  ASSERT_TRUE(good && parked);
  absl::StatusOr<std::string> parked_got = absl::UnknownError("not run");
  std::thread waiting(
      [&] { parked_got = parked->Get("later", absl::Seconds(60)); });
  ASSERT_TRUE(WaitUntil([&] { return server->stats().parked_requests == 1; },
                        absl::Seconds(10)));

  {  // Garbage instead of the handshake's answer.
    net::Socket s = RawConnect(*server);
    char nonce[32];
    ASSERT_TRUE(s.RecvAll(nonce, 32, In(absl::Seconds(10))).ok());
    SendRaw(s, std::string(64, '\x5a'));
    EXPECT_TRUE(ClosedBy(s, In(absl::Seconds(1)))) << "garbage answer";
    EXPECT_EQ(server->auth_failures(), 1);
  }
  {  // A length prefix of 2^31-1.
    RawClient raw = RawAuthenticated(*server);
    SendRaw(raw.socket, BigEndian(0x7fffffff, 4) + BigEndian(0, 8));
    EXPECT_TRUE(ClosedBy(raw.socket, In(absl::Seconds(1)))) << "huge length";
  }
  {  // Just over the store's 16 MiB cap.
    RawClient raw = RawAuthenticated(*server);
    SendRaw(raw.socket,
            BigEndian(kMaxStoreFrameBytes + 1, 4) + BigEndian(0, 8));
    EXPECT_TRUE(ClosedBy(raw.socket, In(absl::Seconds(1)))) << "over the cap";
  }
  {  // A wrong MAC.
    RawClient raw = RawAuthenticated(*server);
    std::string frame = raw.Frame(Request(wire::STORE_SET, "evil", "1"));
    frame.back() ^= 1;
    SendRaw(raw.socket, frame);
    EXPECT_TRUE(ClosedBy(raw.socket, In(absl::Seconds(1)))) << "wrong MAC";
  }
  {  // A replayed frame: answered once, then the connection closes.
    RawClient raw = RawAuthenticated(*server);
    const std::string frame = raw.Frame(Request(wire::STORE_SET, "once", "1"));
    SendRaw(raw.socket, frame);
    EXPECT_EQ(raw.Read().code(), 0);
    SendRaw(raw.socket, frame);
    EXPECT_TRUE(ClosedBy(raw.socket, In(absl::Seconds(1)))) << "replayed";
  }
  {  // Authenticated garbage is answered (InvalidArgument), not fatal.
    RawClient raw = RawAuthenticated(*server);
    SendRaw(raw.socket,
            EncodeFrame(raw.key, 1, raw.send_seq++, "\xff\xff\xff"));
    wire::StoreResponse response = raw.Read();
    EXPECT_EQ(response.code(),
              static_cast<int>(absl::StatusCode::kInvalidArgument));
    SendRaw(raw.socket, raw.Frame(Request(wire::STORE_CHECK, "k")));
    EXPECT_EQ(raw.Read().code(), 0);
  }
  EXPECT_FALSE(*server->local()->Check("evil"));
  EXPECT_EQ(server->stats().parked_requests, 1);
  ASSERT_TRUE(good->Set("later", "still here").ok());
  waiting.join();
  ASSERT_TRUE(parked_got.ok()) << parked_got.status();
  EXPECT_EQ(*parked_got, "still here");
}

TEST(TcpStoreServerTest, OnChangeRunsAfterEverySetAndAdd) {
  std::atomic<int> changes{0};
  ServerOptions options;
  options.on_change = [&] { ++changes; };
  std::unique_ptr<TcpStoreServer> server = StartServer(0, options);
  std::shared_ptr<Store> client = Connect(*server);
  ASSERT_NE(client, nullptr);
  // Called before the response goes out: counted when the call returns.
  ASSERT_TRUE(client->Set("k", "v").ok());
  EXPECT_EQ(changes.load(), 1);
  ASSERT_TRUE(client->Add("n", 2).ok());
  EXPECT_EQ(changes.load(), 2);
  EXPECT_FALSE(client->Add("k", 1).ok());  // Not an integer: no change.
  ASSERT_TRUE(client->Get("k", absl::Seconds(1)).ok());
  ASSERT_TRUE(client->Check("k").ok());
  ASSERT_TRUE(client->Wait({"k"}, absl::Seconds(1)).ok());
  EXPECT_EQ(changes.load(), 2);
  std::shared_ptr<Store> local = server->local();
  ASSERT_TRUE(local->Set("l", "1").ok());  // On this thread, synchronously.
  EXPECT_EQ(changes.load(), 3);
  server->Stop();
  ASSERT_TRUE(local->Set("after-stop", "1").ok());
  EXPECT_EQ(changes.load(), 3);
}

// Out of descriptors, the server rests instead of spinning on the queued
// connection, and takes it once descriptors are free again.
TEST(TcpStoreServerTest, OutOfDescriptorsPausesAccepting) {
  std::unique_ptr<TcpStoreServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = 256;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  std::vector<int> fillers;
  for (int fd = dup(0); fd >= 0; fd = dup(0)) fillers.push_back(fd);
  ASSERT_FALSE(fillers.empty());
  close(fillers.back());  // One for the client's socket.
  fillers.pop_back();
  net::Socket client = RawConnect(*server);
  ASSERT_TRUE(client.valid());

  struct timespec cpu0, cpu1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
  // The server cannot accept: no nonce within a second.
  char nonce[32];
  absl::Status st = client.RecvAll(nonce, sizeof(nonce), In(absl::Seconds(1)));
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
  for (int fd : fillers) close(fd);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  const double cpu_s =
      (cpu1.tv_sec - cpu0.tv_sec) + (cpu1.tv_nsec - cpu0.tv_nsec) / 1e9;
  std::printf("CPU used in 1 s out of descriptors: %.3f s\n", cpu_s);
  EXPECT_LT(cpu_s, 0.2);
  // Descriptors again: the connection is taken and gets its nonce.
  st = client.RecvAll(nonce, sizeof(nonce), In(absl::Seconds(5)));
  EXPECT_TRUE(st.ok()) << st;
  std::shared_ptr<Store> store = Connect(*server);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->Set("k", "v").ok());
}

}  // namespace
}  // namespace rendezvous
}  // namespace kolo
