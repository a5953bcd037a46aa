// kolo/store.h on its own.
#include "kolo/store.h"

#include <memory>

#include "gtest/gtest.h"

namespace {

TEST(HeaderAlone, Store) {
  std::shared_ptr<kolo::Store> base = kolo::NewInMemoryStore();
  std::shared_ptr<kolo::Store> store = kolo::NewPrefixStore("job", base);
  ASSERT_TRUE(store->Set("key", "value").ok());
  EXPECT_EQ(base->Get("job/key", absl::ZeroDuration()).value(), "value");
}

}  // namespace
