// The coordinator's listener under a flood of unauthenticated connections
// (Note [Unauthenticated connections cost no thread]): they cost no thread,
// at most 256 are held, each is closed at the handshake timeout, and a rank
// that holds the secret still joins in the middle of them.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "runtime/control/control_plane.h"
#include "runtime/net/socket.h"
#include "tests/testing/threads.h"

namespace kolo {
namespace {

constexpr char kSecret[] = "control-listener-test-secret-0123456789";

using ::kolo::testing::ThreadCount;

absl::StatusOr<std::unique_ptr<ControlPlane>> CreatePlane(
    int rank, std::shared_ptr<Store> store) {
  ControlCallbacks callbacks;
  callbacks.notify = [] {};
  callbacks.on_fatal = [](const absl::Status&) {};
  return ControlPlane::Create(rank, 2, store, kSecret, "127.0.0.1",
                              absl::Now() + absl::Seconds(30), callbacks);
}

TEST(ControlPlaneListener,
     UnauthenticatedConnectionsAreBoundedAndCostNoThread) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  absl::StatusOr<std::unique_ptr<ControlPlane>> coordinator =
      absl::UnknownError("not run");
  std::thread coordinator_thread([&] { coordinator = CreatePlane(0, store); });
  absl::StatusOr<std::string> address =
      store->Get("control/address", absl::Seconds(30));
  ASSERT_TRUE(address.ok()) << address.status();
  int port = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(address->substr(address->rfind(':') + 1), &port));

  const int threads_before = ThreadCount();
  constexpr int kHeld = 400;  // more than the 256 held at once
  std::vector<net::Socket> held;
  std::vector<absl::Time> opened;
  for (int i = 0; i < kHeld; ++i) {
    absl::StatusOr<net::Socket> s = net::Socket::Connect(
        "127.0.0.1", port, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(s.ok()) << s.status();
    opened.push_back(absl::Now());
    char nonce[32];
    ASSERT_TRUE(
        s->RecvAll(nonce, sizeof(nonce), absl::Now() + absl::Seconds(10)).ok());
    held.push_back(std::move(*s));
  }
  EXPECT_EQ(ThreadCount(), threads_before);

  // A real rank joins among them.
  absl::StatusOr<std::unique_ptr<ControlPlane>> rank1 = CreatePlane(1, store);
  coordinator_thread.join();
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  wire::ControlMessage list;
  list.mutable_request_list()->add_cached_ids(7);
  ASSERT_TRUE((*rank1)->SendToCoordinator(list).ok());

  int closed = 0;
  for (int i = 0; i < kHeld; ++i) {
    char byte;
    // The handshake timeout (3 s) from its accept, with a margin.
    absl::Status st = held[i].RecvAll(&byte, 1, opened[i] + absl::Seconds(4));
    if (absl::IsUnavailable(st)) ++closed;
  }
  EXPECT_EQ(closed, kHeld);

  std::vector<ControlEvent> events;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (events.empty() && absl::Now() < deadline) {
    events = (*coordinator)->TakeEvents();
    if (events.empty()) absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].from_rank, 1);
  (*rank1)->Close();
  (*coordinator)->Close();
}

}  // namespace
}  // namespace kolo
