// kolo/work.h on its own, and opaque: a user can neither make a Work from
// a state of their own nor reach the state of one.
#include "kolo/work.h"

#include <memory>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace {

// Whether T has an accessible state() (SFINAE sees access).
template <typename T, typename = void>
struct HasState : std::false_type {};
template <typename T>
struct HasState<T, std::void_t<decltype(std::declval<const T&>().state())>>
    : std::true_type {};

static_assert(!std::is_constructible_v<
                  kolo::Work, std::shared_ptr<kolo::internal::WorkState>>,
              "Work's constructor from its state must not be public");
static_assert(!HasState<kolo::Work>::value, "Work must not expose its state");
static_assert(std::is_copy_constructible_v<kolo::Work> &&
                  std::is_default_constructible_v<kolo::Work>,
              "Work is a cheap, copyable handle");

TEST(HeaderAlone, Work) {
  kolo::Work work;  // An already-failed handle.
  EXPECT_FALSE(work.IsCompleted());
  EXPECT_EQ(work.Wait(absl::ZeroDuration()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(work.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(work.received_splits().empty());
  EXPECT_FALSE(kolo::IsWaitTimeout(absl::DeadlineExceededError("op timeout")));
  EXPECT_EQ(kolo::LostRank(absl::UnavailableError("rank 2 lost")), -1);
}

}  // namespace
