// The runtime's operating-system primitives (runtime/os/): the owning
// descriptor, pipes, errno text, poll timeouts, futex wait and wake, and
// shared-memory segments with their error codes.
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/futex.h"
#include "runtime/os/poll_timeout.h"
#include "runtime/os/shared_segment.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace os {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

bool IsOpen(int fd) { return fcntl(fd, F_GETFD) >= 0; }

// A descriptor of our own (not one gtest or Bazel uses).
int OpenDevNull() {
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0) << ErrnoText(errno);
  return fd;
}

// ---- UniqueFd ----------------------------------------------------------

TEST(UniqueFd, DefaultAndNegativeHoldNothing) {
  UniqueFd none;
  EXPECT_FALSE(none.valid());
  EXPECT_EQ(none.get(), -1);
  UniqueFd negative(-7);
  EXPECT_FALSE(negative.valid());
  EXPECT_EQ(negative.get(), -1);
  negative.reset();  // Closes nothing.
  EXPECT_EQ(negative.release(), -1);
}

TEST(UniqueFd, ClosesInItsDestructor) {
  const int fd = OpenDevNull();
  {
    UniqueFd owner(fd);
    EXPECT_TRUE(owner.valid());
    EXPECT_EQ(owner.get(), fd);
    EXPECT_TRUE(IsOpen(fd));
  }
  EXPECT_FALSE(IsOpen(fd));
}

TEST(UniqueFd, ClosesOnceWhenMoved) {
  const int fd = OpenDevNull();
  UniqueFd moved_from(fd);
  {
    UniqueFd owner(std::move(moved_from));
    EXPECT_FALSE(moved_from.valid());  // NOLINT(bugprone-use-after-move)
    EXPECT_EQ(owner.get(), fd);
  }
  EXPECT_FALSE(IsOpen(fd));
  // The number is free again, and the next open takes it: the moved-from
  // owner must not close what now lives there.
  const int reused = OpenDevNull();
  ASSERT_EQ(reused, fd);
  moved_from.reset();
  { UniqueFd gone(std::move(moved_from)); }
  EXPECT_TRUE(IsOpen(reused));
  close(reused);
}

TEST(UniqueFd, MoveAssignmentClosesWhatItHeld) {
  const int first = OpenDevNull();
  const int second = OpenDevNull();
  UniqueFd a(first);
  UniqueFd b(second);
  a = std::move(b);
  EXPECT_FALSE(IsOpen(first));
  EXPECT_TRUE(IsOpen(second));
  EXPECT_EQ(a.get(), second);
  EXPECT_FALSE(b.valid());  // NOLINT(bugprone-use-after-move)
  UniqueFd& alias = a;
  a = std::move(alias);  // Self-move keeps it.
  EXPECT_EQ(a.get(), second);
  EXPECT_TRUE(IsOpen(second));
}

TEST(UniqueFd, ReleaseGivesUpOwnershipWithoutClosing) {
  const int fd = OpenDevNull();
  int released = -1;
  {
    UniqueFd owner(fd);
    released = owner.release();
    EXPECT_FALSE(owner.valid());
  }
  EXPECT_EQ(released, fd);
  EXPECT_TRUE(IsOpen(fd));
  close(fd);
}

TEST(UniqueFd, ResetClosesTheOldAndTakesTheNew) {
  const int first = OpenDevNull();
  const int second = OpenDevNull();
  UniqueFd owner(first);
  owner.reset(second);
  EXPECT_FALSE(IsOpen(first));
  EXPECT_EQ(owner.get(), second);
  owner.reset(second);  // The same descriptor: kept open.
  EXPECT_TRUE(IsOpen(second));
  owner.reset();
  EXPECT_FALSE(owner.valid());
  EXPECT_FALSE(IsOpen(second));
}

TEST(UniqueFd, ClosingKeepsErrno) {
  UniqueFd owner(OpenDevNull());
  errno = ENOENT;
  owner.reset();
  EXPECT_EQ(errno, ENOENT);
  // Even when close itself fails (EBADF: someone closed it behind our back).
  const int fd = OpenDevNull();
  UniqueFd stale(fd);
  close(fd);
  errno = EAGAIN;
  stale.reset();
  EXPECT_EQ(errno, EAGAIN);
}

// ---- MakePipe ----------------------------------------------------------

TEST(MakePipe, BothEndsWorkWithTheirFlags) {
  absl::StatusOr<Pipe> pipe = MakePipe(O_CLOEXEC | O_NONBLOCK);
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  for (const UniqueFd* end : {&pipe->read_end, &pipe->write_end}) {
    EXPECT_TRUE(fcntl(end->get(), F_GETFD) & FD_CLOEXEC);
    EXPECT_TRUE(fcntl(end->get(), F_GETFL) & O_NONBLOCK);
  }
  char byte = 0;
  EXPECT_EQ(read(pipe->read_end.get(), &byte, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(write(pipe->write_end.get(), "x", 1), 1);
  ASSERT_EQ(read(pipe->read_end.get(), &byte, 1), 1);
  EXPECT_EQ(byte, 'x');
  pipe->write_end.reset();
  EXPECT_EQ(read(pipe->read_end.get(), &byte, 1), 0);  // EOF
}

TEST(MakePipe, WithoutFlagsIsBlockingAndInherited) {
  absl::StatusOr<Pipe> pipe = MakePipe(0);
  ASSERT_TRUE(pipe.ok()) << pipe.status();
  EXPECT_FALSE(fcntl(pipe->read_end.get(), F_GETFD) & FD_CLOEXEC);
  EXPECT_FALSE(fcntl(pipe->write_end.get(), F_GETFL) & O_NONBLOCK);
}

TEST(MakePipe, OutOfDescriptorsIsResourceExhausted) {
  // The lowest free number: every one below it is taken, so a limit there
  // leaves no descriptor to give.
  const int lowest_free = OpenDevNull();
  close(lowest_free);
  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit tight = saved;
  tight.rlim_cur = static_cast<rlim_t>(lowest_free);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &tight), 0) << ErrnoText(errno);
  absl::StatusOr<Pipe> pipe = MakePipe();
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_FALSE(pipe.ok());
  EXPECT_EQ(pipe.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(pipe.status().message()),
              HasSubstr(ErrnoText(EMFILE)));
}

// ---- ErrnoText ---------------------------------------------------------

TEST(ErrnoText, NamesTheError) {
  EXPECT_EQ(ErrnoText(ENOENT), std::strerror(ENOENT));
  EXPECT_EQ(ErrnoText(EMFILE), "Too many open files");
  EXPECT_THAT(ErrnoText(4242), HasSubstr("4242"));
}

// ---- PollTimeoutMs -----------------------------------------------------

TEST(PollTimeoutMs, ForeverAndPast) {
  const absl::Time now = absl::FromUnixSeconds(1000000);
  EXPECT_EQ(PollTimeoutMs(absl::InfiniteFuture(), now), -1);
  EXPECT_EQ(PollTimeoutMs(now, now), 0);
  EXPECT_EQ(PollTimeoutMs(now - absl::Nanoseconds(1), now), 0);
  EXPECT_EQ(PollTimeoutMs(absl::InfinitePast(), now), 0);
}

TEST(PollTimeoutMs, RoundsUpSoThatPollNeverWakesEarly) {
  const absl::Time now = absl::FromUnixSeconds(1000000);
  EXPECT_EQ(PollTimeoutMs(now + absl::Nanoseconds(1), now), 1);
  EXPECT_EQ(PollTimeoutMs(now + absl::Microseconds(999), now), 1);
  EXPECT_EQ(PollTimeoutMs(now + absl::Milliseconds(1), now), 1);
  EXPECT_EQ(
      PollTimeoutMs(now + absl::Milliseconds(1) + absl::Nanoseconds(1), now),
      2);
  EXPECT_EQ(PollTimeoutMs(now + absl::Milliseconds(1500), now), 1500);
}

TEST(PollTimeoutMs, FarDeadlinesAreCappedAtIntMax) {
  const absl::Time now = absl::FromUnixSeconds(1000000);
  EXPECT_EQ(PollTimeoutMs(now + absl::Hours(24 * 100), now), INT_MAX);
  EXPECT_EQ(PollTimeoutMs(now + absl::Milliseconds(INT_MAX), now), INT_MAX);
}

TEST(PollTimeoutMs, FromNow) {
  EXPECT_EQ(PollTimeoutMs(absl::InfiniteFuture()), -1);
  EXPECT_EQ(PollTimeoutMs(absl::Now() - absl::Seconds(1)), 0);
  const int ms = PollTimeoutMs(absl::Now() + absl::Seconds(10));
  EXPECT_GT(ms, 9000);
  EXPECT_LE(ms, 10000);
}

// ---- Futex -------------------------------------------------------------

TEST(Futex, WaitReturnsAtOnceWhenTheWordDiffers) {
  std::atomic<uint32_t> word{1};
  const absl::Time start = absl::Now();
  FutexWait(&word, 0, absl::Seconds(30), FutexScope::kPrivate);
  FutexWait(&word, 0, absl::Seconds(30), FutexScope::kShared);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(Futex, WaitEndsAtItsTimeout) {
  std::atomic<uint32_t> word{0};
  const absl::Time start = absl::Now();
  FutexWait(&word, 0, absl::Milliseconds(20), FutexScope::kPrivate);
  FutexWait(&word, 0, -absl::Seconds(1), FutexScope::kPrivate);  // At once.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(19));
}

TEST(Futex, WakeAllEndsEverySleeper) {
  for (FutexScope scope : {FutexScope::kPrivate, FutexScope::kShared}) {
    std::atomic<uint32_t> word{0};
    std::atomic<int> done{0};
    auto sleeper = [&] {
      // Far beyond the test's own timeout: only a wake-up ends it in time.
      while (word.load() == 0) FutexWait(&word, 0, absl::Hours(1), scope);
      done.fetch_add(1);
    };
    std::thread a(sleeper), b(sleeper);
    // Whether a sleeper is already inside FUTEX_WAIT or not, it ends: it
    // either sees the new value or is woken.
    word.store(1);
    FutexWakeAll(&word, scope);
    a.join();
    b.join();
    EXPECT_EQ(done.load(), 2);
  }
}

TEST(Futex, CpuPauseReturns) {
  for (int i = 0; i < 1000; ++i) CpuPause();
}

// ---- SharedSegment -----------------------------------------------------

bool Named(const std::string& name) {
  return access(("/dev/shm" + name).c_str(), F_OK) == 0;
}

TEST(SharedSegment, RandomNamesAreDistinctAndCarryThePid) {
  const std::string a = SharedSegment::RandomName("kolo-test");
  const std::string b = SharedSegment::RandomName("kolo-test");
  EXPECT_NE(a, b);
  EXPECT_THAT(a, MatchesRegex("/kolo-test-[0-9]+-[0-9a-f]{16}"));
  EXPECT_TRUE(
      absl::StartsWith(a, "/kolo-test-" + std::to_string(getpid()) + "-"));
}

TEST(SharedSegment, CreateOpenUnlink) {
  const std::string name = SharedSegment::RandomName("kolo-test");
  auto created = SharedSegment::Create(name, 8192);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ((*created)->size(), 8192u);
  EXPECT_TRUE(Named(name));
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);  // Only the job's user maps it.
  auto* created_bytes = static_cast<uint8_t*>((*created)->data());
  for (size_t i = 0; i < 8192; ++i) ASSERT_EQ(created_bytes[i], 0) << i;
  created_bytes[0] = 42;
  created_bytes[8191] = 7;

  auto opened = SharedSegment::Open(name, 8192);
  ASSERT_TRUE(opened.ok()) << opened.status();
  auto* opened_bytes = static_cast<uint8_t*>((*opened)->data());
  EXPECT_NE(opened_bytes, created_bytes);  // Two mappings, one memory.
  EXPECT_EQ(opened_bytes[0], 42);
  EXPECT_EQ(opened_bytes[8191], 7);

  // Note [Segment lifetime]: unlinked, the mappings stay valid and shared.
  EXPECT_TRUE(SharedSegment::Unlink(name).ok());
  EXPECT_FALSE(Named(name));
  opened_bytes[1] = 9;
  EXPECT_EQ(created_bytes[1], 9);
  EXPECT_TRUE(SharedSegment::Unlink(name).ok());  // Absent is fine.

  auto gone = SharedSegment::Open(name, 8192);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr(name));
}

TEST(SharedSegment, CreateOverAnExistingNameIsUnavailableAndKeepsIt) {
  const std::string name = SharedSegment::RandomName("kolo-test");
  auto first = SharedSegment::Create(name, 4096);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = SharedSegment::Create(name, 4096);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr(ErrnoText(EEXIST)));
  EXPECT_TRUE(Named(name));  // The first one's name is not removed.
  EXPECT_TRUE(SharedSegment::Open(name, 4096).ok());
  EXPECT_TRUE(SharedSegment::Unlink(name).ok());
}

TEST(SharedSegment, OpenOfAnotherSizeIsFailedPrecondition) {
  const std::string name = SharedSegment::RandomName("kolo-test");
  auto created = SharedSegment::Create(name, 4096);
  ASSERT_TRUE(created.ok()) << created.status();
  auto opened = SharedSegment::Open(name, 8192);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(opened.status().message()),
              HasSubstr("has 4096 bytes, expected 8192"));
  EXPECT_TRUE(SharedSegment::Unlink(name).ok());
}

TEST(SharedSegment, TooLargeIsResourceExhaustedAndLeavesNoName) {
  const std::string name = SharedSegment::RandomName("kolo-test");
  // 4 TiB: more than any /dev/shm this runs on.
  auto created = SharedSegment::Create(name, size_t{1} << 42);
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(created.status().message()),
              HasSubstr("/dev/shm has"));
  EXPECT_FALSE(Named(name));
}

TEST(SharedSegment, OpenOfAnAbsentNameIsUnavailable) {
  auto opened =
      SharedSegment::Open(SharedSegment::RandomName("kolo-test"), 4096);
  ASSERT_FALSE(opened.ok());
  EXPECT_EQ(opened.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(opened.status().message()),
              HasSubstr(ErrnoText(ENOENT)));
}

}  // namespace
}  // namespace os
}  // namespace kolo
