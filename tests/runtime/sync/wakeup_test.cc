// Wakeup (runtime/sync/wakeup.h): notifications are never lost, waits end
// at their deadline, sleepers are woken across threads and processes, and
// a poller leaves a sleeper asleep until it ends.
#include "runtime/sync/wakeup.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace kolo {
namespace {

TEST(WakeupTest, NotifyBeforeWaitIsNotLost) {
  Wakeup w;
  const uint32_t epoch = w.Epoch();
  w.Notify();
  EXPECT_TRUE(
      w.Wait(epoch, absl::Now() + absl::Seconds(5), absl::ZeroDuration()));
  EXPECT_EQ(w.sleeps(), 0u);
}

TEST(WakeupTest, WaitEndsAtDeadline) {
  Wakeup w;
  for (absl::Duration spin :
       {absl::ZeroDuration(), absl::Microseconds(50), absl::Seconds(10)}) {
    const absl::Time start = absl::Now();
    EXPECT_FALSE(w.Wait(w.Epoch(), start + absl::Milliseconds(30), spin));
    const absl::Duration took = absl::Now() - start;
    EXPECT_GE(took, absl::Milliseconds(30));
    EXPECT_LT(took,
              absl::Seconds(2));  // a spin longer than the deadline ends too
  }
}

TEST(WakeupTest, PastDeadlineReturnsAtOnce) {
  Wakeup w;
  EXPECT_FALSE(w.Wait(w.Epoch(), absl::InfinitePast(), absl::Seconds(1)));
}

TEST(WakeupTest, SleeperIsWokenByAnotherThread) {
  Wakeup w;
  const uint32_t epoch = w.Epoch();
  // Rings only once the waiter has gone to sleep in the kernel (sleeps()
  // counts a wait right before its FUTEX_WAIT), so the wake-up is the one
  // that ends a sleep, not a spin.
  std::atomic<bool> rang{false};
  std::thread notifier([&] {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (w.sleeps() == 0 && absl::Now() < give_up) std::this_thread::yield();
    rang = true;
    w.Notify();
  });
  EXPECT_TRUE(
      w.Wait(epoch, absl::Now() + absl::Seconds(60), absl::ZeroDuration()));
  EXPECT_TRUE(rang.load());  // Woken by the ring, not before it.
  EXPECT_EQ(w.sleeps(), 1u);
  notifier.join();
}

// Note [Polling for a sleeper]: while a poller polls, a Notify marks the
// word rather than waking the sleeper, and the end of polling wakes it for
// the rings that came after the poller last looked.
TEST(WakeupTest, APollerLeavesTheSleeperToItsEnd) {
  WakeupWord word;
  Wakeup w(&word, /*shared=*/false);
  // No sleeper: nothing to mark.
  w.BeginPolling();
  w.Notify();
  EXPECT_EQ(word.polling.load(), 1u);
  w.EndPolling(w.Epoch());
  EXPECT_EQ(word.polling.load(), 0u);
  const uint32_t epoch = w.Epoch();
  std::atomic<bool> woken{false};
  std::thread waiter([&] {
    woken =
        w.Wait(epoch, absl::Now() + absl::Seconds(60), absl::ZeroDuration());
  });
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (word.sleepers.load() == 0 && absl::Now() < give_up) {
    std::this_thread::yield();
  }
  ASSERT_EQ(word.sleepers.load(), 1u);
  // The poller's last look was before the rings: ending wakes the sleeper.
  const uint32_t seen = w.Epoch();
  w.BeginPolling();
  w.Notify();
  EXPECT_EQ(word.polling.load(), 3u);  // polled, a wake-up skipped
  w.Notify();
  EXPECT_EQ(word.polling.load(), 3u);
  w.EndPolling(seen);
  EXPECT_EQ(word.polling.load(), 0u);
  waiter.join();
  EXPECT_TRUE(woken.load());
  // A ring the poller dealt with (its last look came after it) is left
  // marked and cleared at the end; the next Notify, outside polling, wakes
  // the sleeper as before.
  const uint32_t again = w.Epoch();
  std::atomic<uint32_t> polling_after_end{1};
  std::thread notifier([&] {
    while (word.sleepers.load() == 0 && absl::Now() < give_up) {
      std::this_thread::yield();
    }
    w.BeginPolling();
    w.Notify();
    const uint32_t dealt_with = w.Epoch();
    w.EndPolling(dealt_with);
    polling_after_end = word.polling.load();
    w.Notify();
  });
  EXPECT_TRUE(
      w.Wait(again, absl::Now() + absl::Seconds(60), absl::ZeroDuration()));
  notifier.join();
  EXPECT_EQ(polling_after_end.load(), 0u);
}

TEST(WakeupTest, ManyNotifiersOneWaiterNothingLost) {
  // Every round's notification must end that round's wait, never the
  // deadline.
  Wakeup w;
  std::atomic<int> posted{0};
  constexpr int kRounds = 2000;
  std::thread notifier([&] {
    for (int i = 0; i < kRounds; ++i) {
      posted.fetch_add(1);
      w.Notify();
      if (i % 64 == 0) std::this_thread::yield();
    }
  });
  int seen = 0;
  while (seen < kRounds) {
    const uint32_t epoch = w.Epoch();
    seen = posted.load();
    if (seen >= kRounds) break;
    ASSERT_TRUE(w.Wait(epoch, absl::Now() + absl::Seconds(20),
                       absl::Microseconds(seen % 2 ? 20 : 0)))
        << "lost wake-up after " << seen << " notifications";
  }
  notifier.join();
}

TEST(WakeupTest, WakesAcrossProcesses) {
  // The word in shared memory, the waiter in a child process.
  void* mem = mmap(nullptr, sizeof(WakeupWord), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* word = new (mem) WakeupWord();
  Wakeup parent(word, /*shared=*/true);
  const uint32_t epoch = parent.Epoch();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    Wakeup waiter(word, /*shared=*/true);
    const bool woken = waiter.Wait(epoch, absl::Now() + absl::Seconds(20),
                                   absl::ZeroDuration());
    _exit(woken ? 0 : 1);
  }
  // Rings once the child has announced that it sleeps (or at the latest
  // after 30 s, when the child's own 20 s deadline has passed: then it
  // exits 1 and the test fails).
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (word->sleepers.load() == 0 && absl::Now() < give_up) {
    std::this_thread::yield();
  }
  EXPECT_GT(word->sleepers.load(), 0u);
  parent.Notify();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  munmap(mem, sizeof(WakeupWord));
}

TEST(WakeupTest, SpinUntil) {
  std::atomic<bool> flag{false};
  EXPECT_FALSE(SpinUntil([&] { return flag.load(); }, absl::Microseconds(100)));
  flag = true;
  EXPECT_TRUE(SpinUntil([&] { return flag.load(); }, absl::ZeroDuration()));
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(5));
    flag = false;
  });
  EXPECT_TRUE(SpinUntil([&] { return !flag.load(); }, absl::Seconds(20)));
  setter.join();
}

}  // namespace
}  // namespace kolo
