// kolo/types.h on its own.
#include "kolo/types.h"

#include <string>

#include "gtest/gtest.h"

namespace {

TEST(HeaderAlone, Types) {
  EXPECT_EQ(kolo::DataTypeSize(kolo::DataType::kBfloat16), 2u);
  EXPECT_EQ(std::string(kolo::DataTypeName(kolo::DataType::kInt64)), "int64");
  EXPECT_TRUE(kolo::IsFloatingPoint(kolo::DataType::kFloat16));
  EXPECT_EQ(std::string(kolo::ReduceOpName(kolo::ReduceOp::kMax)), "max");
  EXPECT_EQ(kolo::Device::Cuda(1).ToString(), "cuda:1");
}

}  // namespace
