// The behaviour every kolo::Store promises (kolo/store.h), as a
// value-parameterized suite: each implementation's test instantiates it
// with a factory, so in-memory, prefix and TCP stores are held to the same
// contract.
#ifndef KOLO_TESTS_RUNTIME_RENDEZVOUS_STORE_CONTRACT_H_
#define KOLO_TESTS_RUNTIME_RENDEZVOUS_STORE_CONTRACT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "kolo/store.h"

namespace kolo {
namespace testing {

// Owns whatever a store needs (a server, say) and hands out handles that
// all see the same data: for the TCP store each is its own connection.
class StoreEnv {
 public:
  virtual ~StoreEnv() = default;
  virtual std::shared_ptr<Store> NewHandle() = 0;
};

struct StoreParam {
  std::string name;
  std::function<std::unique_ptr<StoreEnv>()> make_env;
};

inline std::string StoreParamName(
    const ::testing::TestParamInfo<StoreParam>& info) {
  return info.param.name;
}

class StoreContractTest : public ::testing::TestWithParam<StoreParam> {
 protected:
  void SetUp() override {
    env_ = GetParam().make_env();
    store_ = env_->NewHandle();
    ASSERT_NE(store_, nullptr);
  }

  std::unique_ptr<StoreEnv> env_;
  std::shared_ptr<Store> store_;
};

TEST_P(StoreContractTest, SetGetOverwrite) {
  ASSERT_TRUE(store_->Set("k", "v1").ok());
  absl::StatusOr<std::string> got = store_->Get("k", absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v1");
  ASSERT_TRUE(store_->Set("k", "v2").ok());
  EXPECT_EQ(*store_->Get("k", absl::ZeroDuration()), "v2");
}

TEST_P(StoreContractTest, BinaryValuesAndEmptyValues) {
  const std::string binary("\0\xff\x01zero", 7);
  ASSERT_TRUE(store_->Set("bin", binary).ok());
  ASSERT_TRUE(store_->Set("empty", "").ok());
  EXPECT_EQ(*store_->Get("bin", absl::Seconds(1)), binary);
  EXPECT_EQ(*store_->Get("empty", absl::Seconds(1)), "");
  EXPECT_TRUE(*store_->Check("empty"));
}

TEST_P(StoreContractTest, GetTimeoutNamesTheKey) {
  absl::Time start = absl::Now();
  absl::StatusOr<std::string> got =
      store_->Get("missing-key", absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "missing-key"))
      << got.status();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(190));
  // The handle still works after a timeout.
  ASSERT_TRUE(store_->Set("after", "ok").ok());
  EXPECT_EQ(*store_->Get("after", absl::Seconds(1)), "ok");
}

TEST_P(StoreContractTest, Add) {
  EXPECT_EQ(*store_->Add("counter", 5), 5);  // Absent counts as 0.
  EXPECT_EQ(*store_->Add("counter", -7), -2);
  EXPECT_EQ(*store_->Get("counter", absl::Seconds(1)), "-2");
  ASSERT_TRUE(store_->Set("preset", "40").ok());
  EXPECT_EQ(*store_->Add("preset", 2), 42);
}

TEST_P(StoreContractTest, AddOnANonIntegerIsInvalidArgument) {
  ASSERT_TRUE(store_->Set("text", "hello").ok());
  absl::StatusOr<int64_t> got = store_->Add("text", 1);
  EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
  EXPECT_TRUE(absl::StrContains(got.status().message(), "text"))
      << got.status();
  EXPECT_EQ(*store_->Get("text", absl::Seconds(1)), "hello");  // Unchanged.
}

TEST_P(StoreContractTest, AddOverflowIsInvalidArgument) {
  ASSERT_TRUE(
      store_->Set("big", std::to_string(std::numeric_limits<int64_t>::max()))
          .ok());
  EXPECT_TRUE(absl::IsInvalidArgument(store_->Add("big", 1).status()));
}

TEST_P(StoreContractTest, Check) {
  EXPECT_FALSE(*store_->Check("c"));
  ASSERT_TRUE(store_->Set("c", "1").ok());
  EXPECT_TRUE(*store_->Check("c"));
}

TEST_P(StoreContractTest, WaitForSetKeys) {
  ASSERT_TRUE(store_->Set("a", "1").ok());
  ASSERT_TRUE(store_->Set("b", "2").ok());
  EXPECT_TRUE(store_->Wait({"a", "b"}, absl::Seconds(5)).ok());
  EXPECT_TRUE(store_->Wait({}, absl::ZeroDuration()).ok());
}

TEST_P(StoreContractTest, WaitTimeoutNamesOnlyTheMissingKeys) {
  ASSERT_TRUE(store_->Set("present", "1").ok());
  absl::Status st = store_->Wait({"present", "absent-1", "absent-2"},
                                 absl::Milliseconds(100));
  EXPECT_TRUE(absl::IsDeadlineExceeded(st)) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "absent-1")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "absent-2")) << st;
  EXPECT_FALSE(absl::StrContains(st.message(), "\"present\"")) << st;
}

TEST_P(StoreContractTest, ConcurrentWaitersWokenBySetFromAnotherThread) {
  constexpr int kWaiters = 6;
  std::vector<std::thread> waiters;
  std::vector<absl::StatusOr<std::string>> got(kWaiters,
                                               absl::UnknownError("not run"));
  std::vector<absl::Status> waited(kWaiters, absl::UnknownError("not run"));
  std::atomic<int> started{0};
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      std::shared_ptr<Store> handle = env_->NewHandle();
      ++started;
      got[i] = handle->Get("go", absl::Seconds(60));
      waited[i] = handle->Wait({"go", "also"}, absl::Seconds(60));
    });
  }
  // Whether a waiter is parked yet or not, the set must reach it.
  std::shared_ptr<Store> setter = env_->NewHandle();
  ASSERT_TRUE(setter->Set("go", "now").ok());
  ASSERT_TRUE(setter->Set("also", "yes").ok());
  for (std::thread& t : waiters) t.join();
  EXPECT_EQ(started.load(), kWaiters);
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(*got[i], "now");
    EXPECT_TRUE(waited[i].ok()) << waited[i];
  }
}

TEST_P(StoreContractTest, ConcurrentAddsAreAtomic) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 50;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::shared_ptr<Store> handle = env_->NewHandle();
      for (int j = 0; j < kAddsPerThread; ++j) {
        ASSERT_TRUE(handle->Add("counter", 1).ok());
      }
      ASSERT_TRUE(handle->Set(absl::StrCat("done/", i), "1").ok());
    });
  }
  std::vector<std::string> done;
  for (int i = 0; i < kThreads; ++i) done.push_back(absl::StrCat("done/", i));
  EXPECT_TRUE(store_->Wait(done, absl::Seconds(60)).ok());
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(*store_->Add("counter", 0), kThreads * kAddsPerThread);
}

TEST_P(StoreContractTest, RendezvousOfRanks) {
  // The pattern ranks use: each publishes its address, then reads everyone's.
  constexpr int kRanks = 5;
  std::vector<std::thread> ranks;
  std::vector<std::string> seen(kRanks);
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.emplace_back([&, rank] {
      std::shared_ptr<Store> handle = env_->NewHandle();
      ASSERT_TRUE(
          handle->Set(absl::StrCat("addr/", rank), absl::StrCat("host", rank))
              .ok());
      for (int peer = 0; peer < kRanks; ++peer) {
        absl::StatusOr<std::string> addr =
            handle->Get(absl::StrCat("addr/", peer), absl::Seconds(60));
        ASSERT_TRUE(addr.ok()) << addr.status();
        seen[rank] += *addr;
      }
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(seen[rank], "host0host1host2host3host4");
  }
}

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_RUNTIME_RENDEZVOUS_STORE_CONTRACT_H_
