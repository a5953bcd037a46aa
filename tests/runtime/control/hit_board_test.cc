// HitBoard (runtime/control/hit_board.h) on its own: bits, completion,
// the log, closing and opening, a full log, the lock. The board lives in
// ordinary memory here (threads stand for ranks); the runtime's use of it
// over a shared segment is covered by negotiation_test and board_stress_test.
#include "runtime/control/hit_board.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kolo {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

struct Board {
  explicit Board(int size, bool enabled = true, int64_t threshold = 1 << 20)
      : shared(new HitBoardShared()) {
    HitBoard::Init(shared.get(), size, enabled, threshold);
    for (int r = 0; r < size; ++r) {
      ranks.push_back(std::make_unique<HitBoard>(shared.get(), r, size));
    }
  }
  HitBoard& operator[](int r) { return *ranks[r]; }
  std::unique_ptr<HitBoardShared> shared;
  std::vector<std::unique_ptr<HitBoard>> ranks;
};

bool Always() { return true; }
const absl::Time kFar = absl::InfiniteFuture();

// Sets `ids` for rank r under the lock; returns the ids completed.
std::vector<int64_t> SetAll(HitBoard& b, std::vector<int64_t> ids,
                            std::vector<int64_t>* refused = nullptr,
                            int64_t now_ns = 1000) {
  std::vector<int64_t> complete, no;
  EXPECT_TRUE(b.Lock(kFar, Always));
  b.Set(ids, now_ns, &complete, refused ? refused : &no);
  b.Unlock();
  return complete;
}

std::vector<int64_t> RecordIds(const HitBoard& b, uint64_t pos) {
  const HitBoardShared::Record& r = b.record(pos);
  EXPECT_EQ(r.kind, HitBoardShared::kIds);
  return std::vector<int64_t>(r.ids, r.ids + r.count);
}

TEST(HitBoard, EnabledOnlyForTwoToSixtyFourRanks) {
  EXPECT_TRUE(Board(2)[0].enabled());
  EXPECT_TRUE(Board(64)[0].enabled());
  EXPECT_FALSE(Board(65)[0].enabled());
  EXPECT_FALSE(Board(1)[0].enabled());
  EXPECT_FALSE(Board(4, /*enabled=*/false)[0].enabled());
  EXPECT_EQ(Board(3, true, 12345)[2].fusion_threshold_bytes(), 12345);
}

TEST(HitBoard, ClosedUntilOpenedAndOnlyPastTheOpeningPosition) {
  Board b(2);
  EXPECT_FALSE(b[0].Usable(0));
  ASSERT_TRUE(b[0].Lock(kFar, Always));
  ASSERT_TRUE(b[0].AppendList(1));  // a list made while closed
  b[0].Open();
  EXPECT_TRUE(b[0].Usable(1));
  EXPECT_FALSE(b[0].Usable(0));  // has not executed the list yet
  std::vector<HitBoard::Pulled> pulled;
  b[0].Close(&pulled);
  EXPECT_THAT(pulled, IsEmpty());
  EXPECT_FALSE(b[0].Usable(1));
  b[0].Unlock();
}

TEST(HitBoard, TheLastBitCompletesAndPublishAppendsSortedIds) {
  Board b(3);
  EXPECT_THAT(SetAll(b[0], {9, 7, 8}), IsEmpty());
  EXPECT_THAT(SetAll(b[2], {7, 9}), IsEmpty());
  EXPECT_EQ(b[0].partial(), 3);
  std::vector<int64_t> done = SetAll(b[1], {9, 8, 7});
  EXPECT_THAT(done, ElementsAre(9, 7));  // 8 still waits for rank 2
  ASSERT_TRUE(b[1].Lock(kFar, Always));
  ASSERT_TRUE(b[1].Publish(&done));
  b[1].Unlock();
  EXPECT_EQ(b[0].tail(), 1u);
  EXPECT_THAT(RecordIds(b[0], 0), ElementsAre(7, 9));
  EXPECT_EQ(b[0].partial(), 1);
  EXPECT_FALSE(b[0].ready_pending());
  // The slots are free again: the next round of the same ids starts over.
  EXPECT_THAT(SetAll(b[0], {7}), IsEmpty());
  EXPECT_THAT(SetAll(b[1], {7}), IsEmpty());
  EXPECT_THAT(SetAll(b[2], {7, 8}), ElementsAre(7, 8));
}

TEST(HitBoard, AnIdWhoseSlotAnotherIdHoldsIsRefused) {
  Board b(2);
  const int64_t other = 5 + HitBoardShared::kSlots;  // same slot as 5
  std::vector<int64_t> refused;
  EXPECT_THAT(SetAll(b[0], {5}), IsEmpty());
  EXPECT_THAT(SetAll(b[1], {other}, &refused), IsEmpty());
  EXPECT_THAT(refused, ElementsAre(other));
  EXPECT_THAT(SetAll(b[1], {5}), ElementsAre(5));
}

TEST(HitBoard, CloseTakesEveryBitWithItsFirstTime) {
  Board b(3);
  SetAll(b[0], {1, 2}, nullptr, /*now_ns=*/100);
  SetAll(b[2], {2}, nullptr, /*now_ns=*/300);
  SetAll(b[1], {3}, nullptr, /*now_ns=*/200);
  EXPECT_EQ(b[0].oldest_ns(), 100);
  std::vector<HitBoard::Pulled> pulled;
  ASSERT_TRUE(b[0].Lock(kFar, Always));
  b[0].Close(&pulled);
  b[0].Unlock();
  std::vector<std::tuple<int, int64_t, int64_t>> got;
  for (const auto& p : pulled) got.emplace_back(p.rank, p.id, p.first_ns);
  EXPECT_THAT(got, UnorderedElementsAre(
                       std::make_tuple(0, 1, 100), std::make_tuple(0, 2, 100),
                       std::make_tuple(2, 2, 100), std::make_tuple(1, 3, 200)));
  EXPECT_EQ(b[0].partial(), 0);
  EXPECT_EQ(b[0].oldest_ns(), std::numeric_limits<int64_t>::max());
}

TEST(HitBoard, RescanFindsTheOldestPartialId) {
  Board b(2);
  SetAll(b[0], {1}, nullptr, 100);
  SetAll(b[0], {2}, nullptr, 200);
  SetAll(b[1], {1}, nullptr, 300);  // 1 completes (not published: ready)
  ASSERT_TRUE(b[0].Lock(kFar, Always));
  std::vector<int64_t> one = {1};
  ASSERT_TRUE(b[0].Publish(&one));
  EXPECT_EQ(b[0].oldest_ns(), 100);  // a bound, not exact
  EXPECT_EQ(b[0].RescanOldest(), 200);
  EXPECT_EQ(b[0].oldest_ns(), 200);
  b[0].Unlock();
}

TEST(HitBoard, AFullLogKeepsCompleteIdsReadyUntilThereIsRoom) {
  Board b(2);
  // Fill the log with markers nobody has executed.
  ASSERT_TRUE(b[0].Lock(kFar, Always));
  for (int i = 0; i < HitBoardShared::kRecords; ++i) {
    ASSERT_TRUE(b[0].AppendList(i + 1));
  }
  EXPECT_FALSE(b[0].AppendList(999));
  EXPECT_FALSE(b[0].HasRoom(1));
  b[0].Unlock();
  SetAll(b[0], {4, 3});
  std::vector<int64_t> done = SetAll(b[1], {3, 4});
  ASSERT_TRUE(b[1].Lock(kFar, Always));
  EXPECT_FALSE(b[1].Publish(&done));
  EXPECT_FALSE(b[1].FlushReady());
  b[1].Unlock();
  EXPECT_TRUE(b[0].ready_pending());
  // Rank 0 has executed everything, rank 1 one record: room for one,
  // which ids leave to the coordinator's next marker.
  b[0].Executed(HitBoardShared::kRecords);
  b[1].Executed(1);
  ASSERT_TRUE(b[0].Lock(kFar, Always));
  EXPECT_FALSE(b[0].FlushReady());
  EXPECT_TRUE(b[0].HasRoom(1));
  b[0].Unlock();
  b[1].Executed(2);
  ASSERT_TRUE(b[0].Lock(kFar, Always));
  EXPECT_TRUE(b[0].FlushReady());
  b[0].Unlock();
  EXPECT_FALSE(b[0].ready_pending());
  EXPECT_EQ(b[0].tail(), static_cast<uint64_t>(HitBoardShared::kRecords) + 1);
  EXPECT_TRUE(b[0].HasRoom(1));  // still one for a marker
  EXPECT_THAT(RecordIds(b[0], HitBoardShared::kRecords), ElementsAre(3, 4));
  EXPECT_EQ(b[0].partial(), 0);
}

TEST(HitBoard, ManyIdsSpanRecordsInOrder) {
  Board b(2);
  std::vector<int64_t> ids;
  for (int i = 0; i < HitBoardShared::kRecordIds + 10; ++i) ids.push_back(i);
  SetAll(b[0], ids);
  std::vector<int64_t> done = SetAll(b[1], ids);
  ASSERT_EQ(done.size(), ids.size());
  ASSERT_TRUE(b[1].Lock(kFar, Always));
  ASSERT_TRUE(b[1].Publish(&done));
  b[1].Unlock();
  ASSERT_EQ(b[0].tail(), 2u);
  std::vector<int64_t> got = RecordIds(b[0], 0), second = RecordIds(b[0], 1);
  EXPECT_EQ(got.size(), static_cast<size_t>(HitBoardShared::kRecordIds));
  got.insert(got.end(), second.begin(), second.end());
  EXPECT_EQ(got, ids);
}

TEST(HitBoard, LockGivesUpWhenTheJobEndsOrTheDeadlinePasses) {
  Board b(2);
  ASSERT_TRUE(b[0].Lock(kFar, Always));
  std::atomic<bool> stop{false};
  std::thread waiter(
      [&] { EXPECT_FALSE(b[1].Lock(kFar, [&] { return !stop.load(); })); });
  stop = true;
  waiter.join();
  EXPECT_FALSE(b[1].Lock(absl::Now() + absl::Milliseconds(30), Always));
  b[0].Unlock();
  EXPECT_TRUE(b[1].Lock(absl::Now() + absl::Seconds(5), Always));
  b[1].Unlock();
}

// Threads as ranks, each setting the same ids round after round (in its
// own order) and reading the log as it goes, with a log small enough to
// fill: every id completes exactly once, and every rank reads the same
// ids in the same order.
TEST(HitBoard, ConcurrentRanksCompleteEachIdOnceAndReadOneLog) {
  const int n = 4, rounds = 300, ids_per_round = 16;
  const size_t total = rounds * ids_per_round;
  Board b(n);
  std::vector<std::vector<int64_t>> read(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      HitBoard& me = b[r];
      uint64_t cursor = 0;
      auto read_log = [&] {
        const uint64_t tail = me.tail();
        for (; cursor < tail; ++cursor) {
          const HitBoardShared::Record& rec = me.record(cursor);
          read[r].insert(read[r].end(), rec.ids, rec.ids + rec.count);
        }
        me.Executed(cursor);
      };
      // Ids whose slot still held an id of a round far behind (a thread
      // may run hundreds of rounds ahead) are set again later.
      std::vector<int64_t> todo;
      const absl::Time deadline = absl::Now() + absl::Seconds(60);
      for (int round = 0;
           (round < rounds || !todo.empty() || read[r].size() < total) &&
           absl::Now() < deadline;
           ++round) {
        for (int i = 0; round < rounds && i < ids_per_round; ++i) {
          todo.push_back(round * ids_per_round +
                         (i * (2 * r + 1)) % ids_per_round);
        }
        std::vector<int64_t> complete, refused;
        ASSERT_TRUE(me.Lock(deadline, Always));
        if (!todo.empty()) me.Set(todo, round, &complete, &refused);
        if (!complete.empty()) me.Publish(&complete);
        me.FlushReady();
        me.Unlock();
        todo.swap(refused);
        read_log();
        if (round >= rounds) std::this_thread::yield();
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(read[0].size(), total);
  for (int r = 1; r < n; ++r) EXPECT_EQ(read[r], read[0]) << "rank " << r;
  std::vector<int64_t> sorted = read[0];
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < total; ++i)
    ASSERT_EQ(sorted[i], static_cast<int64_t>(i));
  EXPECT_EQ(b[0].partial(), 0);
  EXPECT_FALSE(b[0].ready_pending());
}

}  // namespace
}  // namespace kolo
