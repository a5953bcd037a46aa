// kolo/runtime.h on its own; a Runtime is made only by Runtime::Create.
#include "kolo/runtime.h"

#include <memory>
#include <type_traits>

#include "gtest/gtest.h"

namespace {

static_assert(!std::is_default_constructible_v<kolo::Runtime> &&
                  !std::is_copy_constructible_v<kolo::Runtime> &&
                  !std::is_constructible_v<kolo::Runtime,
                                           std::shared_ptr<kolo::RuntimeImpl>>,
              "a Runtime comes from Runtime::Create only");

TEST(HeaderAlone, Runtime) {
  kolo::AllreduceRequest request;
  EXPECT_EQ(request.op, kolo::ReduceOp::kSum);
  EXPECT_EQ(request.process_set, kolo::kGlobalProcessSet);
  EXPECT_EQ(kolo::ReducescatterShape({5, 2}, 2, 0),
            (std::vector<int64_t>{3, 2}));
  kolo::RuntimeStats stats;
  EXPECT_EQ(stats.collectives_executed, 0);
}

}  // namespace
