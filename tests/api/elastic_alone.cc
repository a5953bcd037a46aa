// kolo/elastic.h on its own.
#include "kolo/elastic.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace {

TEST(HeaderAlone, Elastic) {
  kolo::elastic::Assignment a;
  a.generation = 3;
  a.member = true;
  a.rank = 1;
  a.size = 2;
  std::string members = kolo::elastic::FormatMembers({{7, a}});
  auto parsed = kolo::elastic::ParseMembers(members, 3, 7);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->member);
  EXPECT_EQ(parsed->rank, 1);
  EXPECT_EQ(parsed->size, 2);
}

}  // namespace
