// kolo/options.h on its own.
#include "kolo/options.h"

#include "gtest/gtest.h"

namespace {

TEST(HeaderAlone, Options) {
  kolo::Options options;
  EXPECT_EQ(options.size, 1);
  EXPECT_EQ(options.store, nullptr);
  EXPECT_EQ(options.fusion_threshold_bytes, 64 << 20);
  EXPECT_EQ(options.log_level, kolo::LogLevel::kWarning);
}

}  // namespace
