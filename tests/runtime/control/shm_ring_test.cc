// ShmRing and ShmControlSegment (runtime/control/shm_ring.h): order,
// wraparound, fragmentation, full rings that time out or are cancelled,
// malformed data, and the segment's lifetime.
#include "runtime/control/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace kolo {
namespace {

// A ring in ordinary memory (the ring does not care where it lives).
struct TestRing {
  explicit TestRing(size_t capacity, size_t max_message = 1 << 20)
      : data(capacity),
        ring(std::make_unique<ShmRing>(&header, data.data(), capacity,
                                       max_message)) {}
  ShmRingHeader header{};
  std::vector<uint8_t> data;
  std::unique_ptr<ShmRing> ring;
};

std::string Message(int i, size_t bytes) {
  std::string m(bytes, '\0');
  for (size_t k = 0; k < bytes; ++k)
    m[k] = static_cast<char>((i * 131 + k) & 0xff);
  return m;
}

const absl::Time kFar = absl::InfiniteFuture();

TEST(ShmRingTest, MessagesArriveInOrder) {
  TestRing t(1024);
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(t.ring->Write(Message(i, i * 10), kFar, nullptr).ok());
  }
  std::vector<std::string> out;
  ASSERT_TRUE(t.ring->ReadAll(&out).ok());
  ASSERT_EQ(out.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(out[i], Message(i, i * 10));
  EXPECT_FALSE(t.ring->HasData());
  out.clear();
  ASSERT_TRUE(t.ring->ReadAll(&out).ok());
  EXPECT_TRUE(out.empty());
}

TEST(ShmRingTest, WrapsAroundAndSplitsLargeMessages) {
  // 1 KiB ring, messages up to 5 KiB (fragments of at most 248 bytes),
  // producer and consumer on two threads: every byte arrives, in order.
  TestRing t(1024);
  constexpr int kMessages = 3000;
  std::thread producer([&] {
    for (int i = 0; i < kMessages; ++i) {
      const size_t bytes = (i * 37) % 5000;
      ASSERT_TRUE(t.ring
                      ->Write(Message(i, bytes),
                              absl::Now() + absl::Seconds(30),
                              [] { return true; })
                      .ok());
    }
  });
  int next = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (next < kMessages && absl::Now() < deadline) {
    std::vector<std::string> out;
    ASSERT_TRUE(t.ring->ReadAll(&out).ok());
    for (const std::string& m : out) {
      ASSERT_EQ(m, Message(next, (next * 37) % 5000)) << "message " << next;
      ++next;
    }
    if (out.empty()) std::this_thread::yield();
  }
  producer.join();
  EXPECT_EQ(next, kMessages);
}

TEST(ShmRingTest, FullRingTimesOut) {
  // Nobody reads (a dead or stopped peer): the writer gives up at its
  // deadline instead of waiting forever.
  TestRing t(256);
  const absl::Time start = absl::Now();
  absl::Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) {
    s = t.ring->Write(Message(i, 40), start + absl::Milliseconds(200),
                      [] { return true; });
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(ShmRingTest, FullRingStopsWhenCancelled) {
  // The control plane was closed or lost a peer: the writer stops at once,
  // long before its deadline.
  TestRing t(256);
  std::atomic<bool> keep{true};
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    keep = false;
  });
  const absl::Time start = absl::Now();
  absl::Status s;
  for (int i = 0; i < 100 && s.ok(); ++i) {
    s = t.ring->Write(Message(i, 40), start + absl::Seconds(60),
                      [&] { return keep.load(); });
  }
  closer.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(ShmRingTest, MalformedDataIsRejected) {
  TestRing t(1024, /*max_message=*/100);
  // A fragment header claiming more than the ring holds.
  const uint32_t frame[2] = {100000, 1};
  std::memcpy(t.data.data(), frame, sizeof(frame));
  t.header.head.store(64);
  std::vector<std::string> out;
  EXPECT_EQ(t.ring->ReadAll(&out).code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(out.empty());
  // A message over the size limit.
  TestRing u(1024, /*max_message=*/100);
  ASSERT_TRUE(u.ring->Write(std::string(200, 'x'), kFar, nullptr).ok());
  EXPECT_EQ(u.ring->ReadAll(&out).code(), absl::StatusCode::kDataLoss);
}

bool NameExists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return false;
  close(fd);
  return true;
}

TEST(ShmControlSegmentTest, RanksTalkThroughOneSegment) {
  std::string name;
  auto coordinator = ShmControlSegment::Create(0, 3, 1 << 20, &name);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto rank1 = ShmControlSegment::Open(name, 1, 3, 1 << 20);
  auto rank2 = ShmControlSegment::Open(name, 2, 3, 1 << 20);
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_TRUE(rank2.ok()) << rank2.status();
  // Wrong rank count: refused.
  EXPECT_FALSE(ShmControlSegment::Open(name, 1, 4, 1 << 20).ok());
  ShmControlSegment::Unlink(name);
  EXPECT_FALSE(NameExists(name));  // Nothing left in /dev/shm.
  EXPECT_FALSE(ShmControlSegment::Open(name, 1, 3, 1 << 20).ok());

  // Rank 2 -> coordinator, with the coordinator's doorbell.
  const uint32_t epoch = (*coordinator)->doorbell().Epoch();
  ASSERT_TRUE((*rank2)->up(2).Write("request", kFar, nullptr).ok());
  (*rank2)->Notify(0);
  EXPECT_TRUE(
      (*coordinator)
          ->doorbell()
          .Wait(epoch, absl::Now() + absl::Seconds(10), absl::ZeroDuration()));
  std::vector<std::string> out;
  ASSERT_TRUE((*coordinator)->up(2).ReadAll(&out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], "request");
  out.clear();
  ASSERT_TRUE((*coordinator)->up(1).ReadAll(&out).ok());
  EXPECT_TRUE(out.empty());

  // Coordinator -> rank 1 only.
  ASSERT_TRUE((*coordinator)->down(1).Write("response", kFar, nullptr).ok());
  ASSERT_TRUE((*rank1)->down(1).ReadAll(&out).ok());
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], "response");
  EXPECT_FALSE((*rank2)->down(2).HasData());

  // Leaving flags are seen by every mapping.
  EXPECT_FALSE((*coordinator)->leaving(1));
  (*rank1)->SetLeaving(1);
  EXPECT_TRUE((*coordinator)->leaving(1));
  EXPECT_FALSE((*rank1)->coordinator_done());
  (*coordinator)->SetCoordinatorDone();
  EXPECT_TRUE((*rank2)->coordinator_done());
}

TEST(ShmControlSegmentTest, RingsShrinkForLargeJobs) {
  EXPECT_EQ(ShmControlSegment::RingBytes(2), size_t{256} << 10);
  EXPECT_EQ(ShmControlSegment::RingBytes(17), size_t{256} << 10);
  EXPECT_EQ(ShmControlSegment::RingBytes(18), size_t{128} << 10);
  EXPECT_EQ(ShmControlSegment::RingBytes(64), size_t{64} << 10);
  EXPECT_EQ(ShmControlSegment::RingBytes(1024), size_t{64} << 10);
  // A 64-rank job's segment maps and carries a message larger than a ring.
  std::string name;
  auto coordinator = ShmControlSegment::Create(0, 64, 1 << 20, &name);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto last = ShmControlSegment::Open(name, 63, 64, 1 << 20);
  ShmControlSegment::Unlink(name);
  ASSERT_TRUE(last.ok()) << last.status();
  const std::string big(200 << 10, 'k');
  std::thread writer([&] {
    EXPECT_TRUE(
        (*last)
            ->up(63)
            .Write(big, absl::Now() + absl::Seconds(30), [] { return true; })
            .ok());
  });
  std::vector<std::string> out;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (out.empty() && absl::Now() < deadline) {
    ASSERT_TRUE((*coordinator)->up(63).ReadAll(&out).ok());
    std::this_thread::yield();
  }
  writer.join();
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0], big);
}

}  // namespace
}  // namespace kolo
