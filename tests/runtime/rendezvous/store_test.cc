// InMemoryStore and PrefixStore.
#include "kolo/store.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/runtime/rendezvous/store_contract.h"

namespace kolo {
namespace testing {
namespace {

class InMemoryEnv : public StoreEnv {
 public:
  std::shared_ptr<Store> NewHandle() override { return store_; }

 private:
  std::shared_ptr<Store> store_ = NewInMemoryStore();
};

// Every handle is its own PrefixStore over one base, with a second prefix
// sharing the base so that leaks between namespaces would show.
class PrefixEnv : public StoreEnv {
 public:
  PrefixEnv() { noise_->Set("k", "from another prefix").IgnoreError(); }
  std::shared_ptr<Store> NewHandle() override {
    return NewPrefixStore("job", base_);
  }

 private:
  std::shared_ptr<Store> base_ = NewInMemoryStore();
  std::shared_ptr<Store> noise_ = NewPrefixStore("other", base_);
};

INSTANTIATE_TEST_SUITE_P(
    Stores, StoreContractTest,
    ::testing::Values(
        StoreParam{"InMemory", [] { return std::make_unique<InMemoryEnv>(); }},
        StoreParam{"Prefix", [] { return std::make_unique<PrefixEnv>(); }}),
    StoreParamName);

TEST(InMemoryStoreTest, InfiniteTimeoutWaitsForTheSet) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread getter([&] { got = store->Get("k", absl::InfiniteDuration()); });
  ASSERT_TRUE(store->Set("k", "v").ok());
  getter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

TEST(InMemoryStoreTest, ZeroAndNegativeTimeoutsReturnAtOnce) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(store->Get("k", absl::ZeroDuration()).status()));
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(store->Get("k", absl::Seconds(-1)).status()));
  ASSERT_TRUE(store->Set("k", "v").ok());
  EXPECT_EQ(*store->Get("k", absl::Seconds(-1)), "v");
}

TEST(InMemoryStoreTest, AddWakesWaiters) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  absl::Status waited = absl::UnknownError("not run");
  std::thread waiter([&] { waited = store->Wait({"n"}, absl::Seconds(60)); });
  ASSERT_TRUE(store->Add("n", 1).ok());
  waiter.join();
  EXPECT_TRUE(waited.ok()) << waited;
}

TEST(PrefixStoreTest, NamespacesAreIsolated) {
  std::shared_ptr<Store> base = NewInMemoryStore();
  std::shared_ptr<Store> a = NewPrefixStore("a", base);
  std::shared_ptr<Store> b = NewPrefixStore("b", base);
  ASSERT_TRUE(a->Set("key", "from a").ok());
  ASSERT_TRUE(b->Set("key", "from b").ok());
  EXPECT_EQ(*a->Get("key", absl::Seconds(1)), "from a");
  EXPECT_EQ(*b->Get("key", absl::Seconds(1)), "from b");
  EXPECT_EQ(*base->Get("a/key", absl::Seconds(1)), "from a");
  EXPECT_EQ(*base->Get("b/key", absl::Seconds(1)), "from b");
  EXPECT_FALSE(*base->Check("key"));

  EXPECT_EQ(*a->Add("n", 3), 3);
  EXPECT_FALSE(*b->Check("n"));
  EXPECT_TRUE(absl::IsDeadlineExceeded(b->Wait({"n"}, absl::Milliseconds(50))));
  EXPECT_TRUE(a->Wait({"n", "key"}, absl::Seconds(1)).ok());
}

TEST(PrefixStoreTest, NestedPrefixes) {
  std::shared_ptr<Store> base = NewInMemoryStore();
  std::shared_ptr<Store> inner =
      NewPrefixStore("inner", NewPrefixStore("outer", base));
  ASSERT_TRUE(inner->Set("k", "v").ok());
  EXPECT_EQ(*base->Get("outer/inner/k", absl::Seconds(1)), "v");
}

TEST(PrefixStoreTest, TimeoutNamesTheKey) {
  std::shared_ptr<Store> store = NewPrefixStore("job", NewInMemoryStore());
  absl::StatusOr<std::string> got = store->Get("rank0", absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status()));
  EXPECT_TRUE(absl::StrContains(got.status().message(), "rank0"))
      << got.status();
}

}  // namespace
}  // namespace testing
}  // namespace kolo
