// A program that returns from main while kolo's control-plane threads still
// run (RELIABILITY.md 16): two control planes of one job in this process,
// heartbeats every millisecond, and threads sending lists both ways as fast
// as they can. The planes are leaked on purpose, as a program that gives up
// after a kolo error leaks its Runtime, so exit's atexit handlers and static
// destructors run under threads that are computing MACs and sending frames.
// Exits 0, or 1 if the job could not even start.
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/time/clock.h"
#include "kolo/store.h"
#include "runtime/control/control_plane.h"

// The planes are leaked on purpose: under ASan, no leak report for them.
extern "C" const char* __asan_default_options() { return "detect_leaks=0"; }
// Nor, under TSan, for their threads: one that ended before exit is never
// joined. One may end: a heartbeat that cannot go out within its interval
// (1 ms here, while the senders fill the socket) closes its connection, and
// the reader threads on both sides of it return.
extern "C" const char* __tsan_default_options() {
  return "report_thread_leaks=0";
}

int main() {
  std::shared_ptr<kolo::Store> store = kolo::NewInMemoryStore();
  kolo::Liveness liveness;
  liveness.heartbeat_interval = absl::Milliseconds(1);
  liveness.heartbeat_timeout = absl::Seconds(60);
  kolo::ControlCallbacks callbacks;
  callbacks.notify = [] {};
  callbacks.on_fatal = [](const absl::Status&) {};
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  kolo::ControlPlane* planes[2] = {nullptr, nullptr};
  std::thread ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    ranks[rank] = std::thread([&, rank] {
      auto plane =
          kolo::ControlPlane::Create(rank, 2, store, "exit-secret", "127.0.0.1",
                                     deadline, callbacks, liveness);
      if (plane.ok()) planes[rank] = plane->release();
    });
  }
  for (std::thread& t : ranks) t.join();
  if (planes[0] == nullptr || planes[1] == nullptr) {
    std::fprintf(stderr, "the control planes did not start\n");
    return 1;
  }
  kolo::wire::ControlMessage list;
  list.mutable_request_list()->add_cached_ids(1);
  kolo::wire::ControlMessage responses;
  responses.mutable_response_list()->set_seq(1);
  // By value: main's frame is gone while these run.
  kolo::ControlPlane* coordinator = planes[0];
  kolo::ControlPlane* rank1 = planes[1];
  std::thread([rank1, list] {
    for (;;) rank1->SendToCoordinator(list).IgnoreError();
  }).detach();
  std::thread([coordinator, responses] {
    for (;;) coordinator->Broadcast(responses).IgnoreError();
  }).detach();
  std::thread([coordinator] {
    for (;;) coordinator->TakeEvents();
  }).detach();
  // Not synchronization: lets every thread get going before main returns.
  absl::SleepFor(absl::Milliseconds(20));
  new std::shared_ptr<kolo::Store>(store);  // leaked with the planes
  return 0;
}
