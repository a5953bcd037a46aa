// ProcessSets on its own (runtime/loop/process_sets.h): which sets exist,
// who is in them, their lookups' errors, their removal, and what each rank
// keeps of a set (a cache of its own, or on rank 0 the coordinator's).
#include "runtime/loop/process_sets.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "runtime/negotiation/timeline.h"

namespace kolo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ProcessSetsTest : public ::testing::Test {
 protected:
  std::unique_ptr<ProcessSets> Make(int rank, int size) {
    options_.rank = rank;
    options_.size = size;
    options_.shm = false;
    logger_ = std::make_unique<Logger>(LogLevel::kWarning, rank);
    ProcessSets::Context context;
    context.options = &options_;
    context.logger = logger_.get();
    context.timeline = &timeline_;
    context.explain_failure = [](const absl::Status& s) { return s; };
    context.fatal = [this](const absl::Status& s) { fatal_ = s; };
    return std::make_unique<ProcessSets>(std::move(context));
  }

  Options options_;
  std::unique_ptr<Logger> logger_;
  Timeline timeline_;
  absl::Status fatal_;
};

// A job of one: the global set, connected, and sets of its own.
TEST_F(ProcessSetsTest, StartCreatesTheGlobalSetConnected) {
  auto sets = Make(0, 1);
  ASSERT_TRUE(sets->Start(NewInMemoryStore()).ok());
  ProcessSetState& global = sets->global();
  EXPECT_EQ(global.id, kGlobalProcessSet);
  EXPECT_EQ(global.rank, 0);
  ASSERT_NE(global.executor, nullptr);
  // Rank 0 negotiates: the set's cache is its coordinator's.
  ASSERT_NE(global.coordinator, nullptr);
  EXPECT_EQ(global.cache, &global.coordinator->cache());
  EXPECT_TRUE(sets->CheckMember(kGlobalProcessSet, "allreduce", "t").ok());
  EXPECT_THAT(*sets->Ranks(kGlobalProcessSet), ElementsAre(0));

  auto created = sets->Create(4, {0});
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_NE((*created)->executor, nullptr);
  EXPECT_EQ(sets->Find(4), *created);
  EXPECT_EQ(*sets->Member(4, "allreduce", "t"), *created);
  EXPECT_THAT(sets->All(), ::testing::SizeIs(2));
  std::map<std::string, int64_t> counters;
  sets->AddCounters(&counters);
  EXPECT_EQ(counters.count("coordinator.requests_received"), 1u);
  EXPECT_EQ(counters.count("coordinator.cache_hits_received"), 1u);
  EXPECT_TRUE(fatal_.ok());
}

TEST_F(ProcessSetsTest, LookupsNameTheSetTheRankAndTheCall) {
  auto sets = Make(1, 3);
  // Rank 1 is not in {0, 2}: the set exists, with nothing of it kept here.
  auto other = sets->Create(5, {0, 2});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_FALSE((*other)->member());
  EXPECT_EQ((*other)->cache, nullptr);
  EXPECT_EQ((*other)->coordinator, nullptr);
  EXPECT_EQ((*other)->backend, nullptr);
  EXPECT_THAT(*sets->Ranks(5), ElementsAre(0, 2));

  absl::Status not_member = sets->CheckMember(5, "allreduce", "grad.w");
  EXPECT_TRUE(absl::IsInvalidArgument(not_member));
  EXPECT_THAT(not_member.message(),
              HasSubstr("allreduce \"grad.w\": rank 1 is not a member of "
                        "process set 5 (ranks 0, 2)"));
  absl::Status unknown = sets->Member(7, "barrier").status();
  EXPECT_TRUE(absl::IsInvalidArgument(unknown));
  EXPECT_THAT(unknown.message(), HasSubstr("barrier: unknown process set 7"));
  EXPECT_TRUE(absl::IsNotFound(sets->Ranks(7).status()));
  EXPECT_EQ(sets->Find(7), nullptr);
}

TEST_F(ProcessSetsTest, RemoveDropsASetButNeverTheGlobalOne) {
  auto sets = Make(0, 1);
  ASSERT_TRUE(sets->Start(NewInMemoryStore()).ok());
  ASSERT_TRUE(sets->Create(3, {0}).ok());

  absl::Status global = sets->Remove(kGlobalProcessSet).status();
  EXPECT_TRUE(absl::IsInvalidArgument(global));
  EXPECT_THAT(global.message(), HasSubstr("cannot be removed"));
  EXPECT_NE(sets->Find(kGlobalProcessSet), nullptr);

  auto removed = sets->Remove(3);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_EQ((*removed)->id, 3);
  EXPECT_EQ(sets->Find(3), nullptr);
  EXPECT_THAT(sets->CheckMember(3, "allreduce", "t").message(),
              HasSubstr("unknown process set 3"));
  absl::Status again = sets->Remove(3).status();
  EXPECT_TRUE(absl::IsInvalidArgument(again));
  EXPECT_THAT(again.message(), HasSubstr("unknown process set 3"));
}

}  // namespace
}  // namespace kolo
