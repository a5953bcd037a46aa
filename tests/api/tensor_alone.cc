// kolo/tensor.h on its own.
#include "kolo/tensor.h"

#include "gtest/gtest.h"

namespace {

TEST(HeaderAlone, Tensor) {
  float data[6] = {};
  kolo::TensorView view(data, kolo::DataType::kFloat32, {2, 3});
  EXPECT_EQ(view.NumElements(), 6);
  EXPECT_EQ(view.ByteSize(), 24);
  EXPECT_EQ(view.ready, nullptr);
  EXPECT_EQ(kolo::ShapeToString(view.shape), "[2,3]");
}

}  // namespace
