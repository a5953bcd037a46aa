// ControlPlane over shared memory (Note [Control over shared memory] in
// runtime/control/shm_ring.h): lists travel through the rings and ring the
// receiver's doorbell; a rank whose connection closes is still reported
// lost, unless it said goodbye first; without EnableSharedMemory, TCP.
#include "runtime/control/control_plane.h"

#include <atomic>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace {

using ::testing::HasSubstr;

constexpr char kSecret[] = "control-plane-test-secret-0123456789";

struct Plane {
  std::unique_ptr<ControlPlane> plane;
  std::atomic<int> notified{0};
  Mutex mu;
  absl::Status fatal KOLO_GUARDED_BY(mu);
  absl::Status Fatal() {
    MutexLock lock(&mu);
    return fatal;
  }
};

// Creates `size` planes concurrently (creation is collective), optionally
// with shared memory.
std::vector<std::unique_ptr<Plane>> Start(int size, bool shm) {
  auto store = NewInMemoryStore();
  std::vector<std::unique_ptr<Plane>> planes;
  for (int r = 0; r < size; ++r) planes.push_back(std::make_unique<Plane>());
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      Plane& p = *planes[r];
      ControlCallbacks callbacks;
      callbacks.notify = [&p] { p.notified.fetch_add(1); };
      callbacks.on_fatal = [&p](const absl::Status& s) {
        MutexLock lock(&p.mu);
        if (p.fatal.ok()) p.fatal = s;
      };
      Liveness liveness;
      liveness.heartbeat_interval = absl::Milliseconds(100);
      liveness.heartbeat_timeout = absl::Seconds(5);
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      auto created = ControlPlane::Create(r, size, store, kSecret, "127.0.0.1",
                                          deadline, callbacks, liveness);
      ASSERT_TRUE(created.ok()) << created.status();
      p.plane = std::move(*created);
      if (shm) {
        ASSERT_TRUE(p.plane->EnableSharedMemory(*store, deadline).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  return planes;
}

wire::ControlMessage RequestList(bool shutdown = false) {
  wire::ControlMessage m;
  m.mutable_request_list()->set_process_set(0);
  m.mutable_request_list()->add_cached_ids(42);
  m.mutable_request_list()->set_shutdown(shutdown);
  return m;
}

// Polls TakeEvents (as the background loop does after its wake-up) until
// one arrives or 10 s pass.
std::vector<ControlEvent> NextEvents(ControlPlane& plane) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    auto events = plane.TakeEvents();
    if (!events.empty()) return events;
    if (Wakeup* bell = plane.doorbell()) {
      bell->Wait(bell->Epoch(), absl::Now() + absl::Milliseconds(10),
                 absl::ZeroDuration());
    } else {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  return {};
}

TEST(ControlPlaneShm, ListsTravelThroughSharedMemory) {
  auto planes = Start(3, /*shm=*/true);
  for (auto& p : planes) ASSERT_TRUE(p->plane->shared_memory());
  ControlPlane& coordinator = *planes[0]->plane;
  const uint32_t epoch = coordinator.doorbell()->Epoch();
  ASSERT_TRUE(planes[2]->plane->SendToCoordinator(RequestList()).ok());
  EXPECT_NE(coordinator.doorbell()->Epoch(), epoch);  // rang
  auto events = NextEvents(coordinator);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].from_rank, 2);
  ASSERT_TRUE(events[0].message.has_request_list());
  EXPECT_EQ(events[0].message.request_list().cached_ids(0), 42);

  wire::ControlMessage response;
  response.mutable_response_list()->set_seq(7);
  ASSERT_TRUE(coordinator.SendTo({1, 2}, response).ok());
  for (int r : {1, 2}) {
    auto got = NextEvents(*planes[r]->plane);
    ASSERT_EQ(got.size(), 1u) << "rank " << r;
    EXPECT_EQ(got[0].from_rank, 0);
    EXPECT_EQ(got[0].message.response_list().seq(), 7);
  }
  // A list far larger than a ring goes through in fragments.
  wire::ControlMessage big = RequestList();
  for (int i = 0; i < 200000; ++i)
    big.mutable_request_list()->add_cached_ids(i);
  std::thread sender(
      [&] { EXPECT_TRUE(planes[1]->plane->SendToCoordinator(big).ok()); });
  auto got = NextEvents(coordinator);
  std::vector<ControlEvent> all = got;
  while (all.empty()) all = NextEvents(coordinator);
  sender.join();
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].message.request_list().cached_ids_size(), 200001);
  for (auto& p : planes) EXPECT_TRUE(p->Fatal().ok()) << p->Fatal();
  for (auto& p : planes) p->plane->Close();
}

TEST(ControlPlaneShm, ClosedRankIsReportedLost) {
  auto planes = Start(3, /*shm=*/true);
  planes[2]->plane->Close();  // as if the process died: its socket closes
  ASSERT_TRUE(planes[0]->plane->WaitConnectionsEnded(
      1, absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(absl::IsUnavailable(planes[0]->Fatal())) << planes[0]->Fatal();
  EXPECT_THAT(std::string(planes[0]->Fatal().message()),
              HasSubstr("rank 2 lost"));
  for (auto& p : planes) p->plane->Close();
}

TEST(ControlPlaneShm, RankThatSaidGoodbyeIsNotLost) {
  // Its shutdown request may still sit in the ring when its connection
  // closes: the flag it set before sending tells the coordinator.
  auto planes = Start(2, /*shm=*/true);
  ASSERT_TRUE(planes[1]->plane->SendToCoordinator(RequestList(true)).ok());
  planes[1]->plane->Close();
  // Once the coordinator has handled the closed connection, it has decided
  // (not lost: the goodbye flag) and reported nothing.
  ASSERT_TRUE(planes[0]->plane->WaitConnectionsEnded(
      1, absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(planes[0]->plane->connections_ended(), 1);
  EXPECT_TRUE(planes[0]->Fatal().ok()) << planes[0]->Fatal();
  auto events = NextEvents(*planes[0]->plane);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_TRUE(events[0].message.request_list().shutdown());
  planes[0]->plane->Close();
}

TEST(ControlPlaneShm, WithoutSharedMemoryListsUseTcp) {
  auto planes = Start(2, /*shm=*/false);
  EXPECT_FALSE(planes[0]->plane->shared_memory());
  EXPECT_EQ(planes[0]->plane->doorbell(), nullptr);
  ASSERT_TRUE(planes[1]->plane->SendToCoordinator(RequestList()).ok());
  auto events = NextEvents(*planes[0]->plane);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_GE(planes[0]->notified.load(), 1);  // the reader thread's notify
  for (auto& p : planes) p->plane->Close();
}

}  // namespace
}  // namespace kolo
