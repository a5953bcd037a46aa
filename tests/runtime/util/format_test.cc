#include "runtime/util/format.h"

#include "gtest/gtest.h"

namespace kolo {
namespace {

TEST(FormatSeconds, ThreeSignificantDigitsAndAUnit) {
  EXPECT_EQ(FormatSeconds(absl::Nanoseconds(5000111902)), "5 s");
  EXPECT_EQ(FormatSeconds(absl::Seconds(63.2)), "63.2 s");
  EXPECT_EQ(FormatSeconds(absl::Seconds(600)), "600 s");
  EXPECT_EQ(FormatSeconds(absl::Seconds(3600)), "3600 s");
  EXPECT_EQ(FormatSeconds(absl::Milliseconds(2500)), "2.5 s");
  EXPECT_EQ(FormatSeconds(absl::Milliseconds(250)), "250 ms");
  EXPECT_EQ(FormatSeconds(absl::Microseconds(1500)), "1.5 ms");
  EXPECT_EQ(FormatSeconds(absl::Microseconds(12)), "12 us");
  EXPECT_EQ(FormatSeconds(absl::Microseconds(999.8e3)), "1 s");
  EXPECT_EQ(FormatSeconds(absl::ZeroDuration()), "0 s");
  EXPECT_EQ(FormatSeconds(absl::InfiniteDuration()), "forever");
  EXPECT_EQ(FormatSeconds(-absl::Seconds(2)), "-2 s");
}

}  // namespace
}  // namespace kolo
