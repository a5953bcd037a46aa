// LogExecutor on its own (runtime/loop/log_executor.h), in a job of one
// rank over a real gloo backend: a response list runs the collectives it
// names and completes their Works, a list made here leaves the cache to
// the coordinator, a response for a name never submitted or a list of an
// unknown set fails the job naming them, and the negotiated creation and
// removal of a process set happen where the list says.
#include "runtime/loop/log_executor.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/runtime/loop/job_of_one.h"

namespace kolo {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class LogExecutorTest : public testing::JobOfOne {
 protected:
  // Queues a float32 sum allreduce of `data` (in place) named `name`.
  std::shared_ptr<internal::WorkState> Submit(const std::string& name,
                                              std::vector<float>* data,
                                              int set = kGlobalProcessSet) {
    std::unique_ptr<TensorEntry> e = AllreduceEntry(name, data, set);
    auto work = e->work;
    EXPECT_TRUE(queue_.Add(std::move(e)).ok());
    return work;
  }
  static wire::Response Allreduce(const std::vector<std::string>& names,
                                  const std::vector<int64_t>& elements) {
    wire::Response r;
    r.set_type(wire::RESPONSE_ALLREDUCE);
    for (const std::string& n : names) r.add_names(n);
    for (int64_t e : elements) r.add_elements(e);
    r.set_dtype(static_cast<int>(DataType::kFloat32));
    r.set_op(static_cast<int>(ReduceOp::kSum));
    r.set_prescale(1);
    r.set_postscale(1);
    return r;
  }
};

TEST_F(LogExecutorTest, AListRunsItsCollectivesAndCompletesTheirWorks) {
  std::vector<float> a = {1, 2, 3}, b = {4, 5};
  auto wa = Submit("a", &a);
  auto wb = Submit("b", &b);
  wire::ResponseList list;
  list.set_process_set(kGlobalProcessSet);
  list.set_seq(1);
  *list.add_responses() = Allreduce({"a", "b"}, {3, 2});  // fused
  log_->ExecuteList(kGlobalProcessSet, list);
  ASSERT_TRUE(wa->IsCompleted());
  ASSERT_TRUE(wb->IsCompleted());
  EXPECT_TRUE(wa->Wait(absl::ZeroDuration()).ok());
  EXPECT_TRUE(wb->Wait(absl::ZeroDuration()).ok());
  EXPECT_THAT(a, ElementsAre(1, 2, 3));  // the sum over one rank
  EXPECT_THAT(b, ElementsAre(4, 5));
  EXPECT_FALSE(job_.failed());
  EXPECT_EQ(sets_->global().executed_seq, 1);
  EXPECT_EQ(log_->counters().response_lists_received, 1);
  EXPECT_EQ(log_->counters().collectives_executed, 1);
  EXPECT_EQ(log_->counters().tensors_executed, 2);
  EXPECT_EQ(queue_.size(), 0u);
}

TEST_F(LogExecutorTest, AResponseForANameNeverSubmittedFailsTheJobNamingIt) {
  wire::ResponseList list;
  list.set_process_set(kGlobalProcessSet);
  list.set_seq(1);
  *list.add_responses() = Allreduce({"grad.w"}, {4});
  log_->ExecuteList(kGlobalProcessSet, list);
  ASSERT_TRUE(job_.failed());
  EXPECT_THAT(job_.status().message(),
              HasSubstr("rank 0 received a response for \"grad.w\" that it "
                        "never submitted"));
}

TEST_F(LogExecutorTest, AListOfAnUnknownSetFailsTheJobNamingTheSet) {
  wire::ResponseList list;
  list.set_process_set(9);
  list.set_seq(3);
  log_->ExecuteList(9, list);
  ASSERT_TRUE(job_.failed());
  EXPECT_THAT(job_.status().message(),
              HasSubstr("response list 3 of process set 9"));
}

TEST_F(LogExecutorTest, SetsAreCreatedAndRemovedWhereTheListSays) {
  // The creation, as the coordinator answers add_process_set.
  auto add = std::make_unique<TensorEntry>();
  add->request.set_type(wire::ADD_PROCESS_SET);
  add->request.set_name("__kolo_process_set_0");
  add->request.set_process_set(kGlobalProcessSet);
  add->work = std::make_shared<internal::WorkState>();
  auto added = add->work;
  ASSERT_TRUE(queue_.Add(std::move(add)).ok());
  wire::ResponseList list;
  list.set_process_set(kGlobalProcessSet);
  list.set_seq(1);
  wire::Response* r = list.add_responses();
  r->set_type(wire::RESPONSE_ADD_PROCESS_SET);
  r->add_names("__kolo_process_set_0");
  r->set_new_process_set(5);
  r->add_member_ranks(0);
  log_->ExecuteList(kGlobalProcessSet, list);
  ASSERT_TRUE(added->IsCompleted());
  EXPECT_TRUE(added->Wait(absl::ZeroDuration()).ok());
  EXPECT_EQ(added->value(), 5);
  ASSERT_NE(sets_->Find(5), nullptr);
  EXPECT_NE(sets_->Find(5)->executor, nullptr);

  // Work pending in the set fails when the set is removed.
  std::vector<float> x = {1};
  auto pending = Submit("x", &x, 5);
  list.Clear();
  list.set_process_set(kGlobalProcessSet);
  list.set_seq(2);
  r = list.add_responses();
  r->set_type(wire::RESPONSE_REMOVE_PROCESS_SET);
  r->add_names("__kolo_remove_process_set_0");
  r->set_target_process_set(5);
  log_->ExecuteList(kGlobalProcessSet, list);
  EXPECT_EQ(sets_->Find(5), nullptr);
  ASSERT_TRUE(pending->IsCompleted());
  absl::Status failed = pending->Wait(absl::ZeroDuration());
  EXPECT_TRUE(absl::IsAborted(failed));
  EXPECT_THAT(failed.message(), HasSubstr("process set 5 was removed"));
  EXPECT_FALSE(job_.failed());
}

}  // namespace
}  // namespace kolo
