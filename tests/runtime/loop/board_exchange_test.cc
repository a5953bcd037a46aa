// BoardExchange on its own (runtime/loop/board_exchange.h): two ranks'
// exchanges over one hit board in this process, with rank 0's real
// Coordinator, a control link that keeps what it is asked to send and
// ring, and a runner that keeps what it is asked to execute. Ids every
// rank set become one record every rank executes, with no list sent; a
// hit while the board is closed goes to the coordinator in a list, and the
// board opens again only once that list has arrived; a response list runs
// at its marker in the log and not before, on a caller's turn only where
// the runner lets it; closing the board makes a
// half-set id the coordinator's, named as pending there.
#include "runtime/loop/board_exchange.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kolo/types.h"
#include "runtime/negotiation/response_cache.h"

namespace kolo {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

class KeptLink final : public ControlLink {
 public:
  absl::Status SendToCoordinator(const wire::ControlMessage& m) override {
    sent.push_back(m);
    return absl::OkStatus();
  }
  void Ring(int r) override { rings.push_back(r); }
  std::vector<wire::ControlMessage> sent;
  std::vector<int> rings;
};

class KeptRunner final : public HitExchange::Runner {
 public:
  bool IsMember(int process_set) override {
    return process_set == kGlobalProcessSet;
  }
  void ExecuteList(int process_set, const wire::ResponseList& list) override {
    lists.emplace_back(process_set, list.seq());
  }
  bool ExecuteIds(const HitBoardShared::Record& record, int64_t,
                  bool) override {
    records.emplace_back(record.ids, record.ids + record.count);
    return true;
  }
  bool CallerMayRun(const wire::ResponseList&) override {
    return caller_may_run;
  }
  bool failed() override { return !fatal.ok(); }
  void Fatal(const absl::Status& s) override {
    if (fatal.ok()) fatal = s;
  }
  bool caller_may_run = true;
  std::vector<std::pair<int, int64_t>> lists;
  std::vector<std::vector<int64_t>> records;
  absl::Status fatal;
};

wire::Request Allreduce(int rank, const std::string& name) {
  wire::Request r;
  r.set_rank(rank);
  r.set_name(name);
  r.set_type(wire::ALLREDUCE);
  r.set_dtype(static_cast<int>(DataType::kFloat32));
  r.add_shape(4);
  r.set_op(static_cast<int>(ReduceOp::kSum));
  r.set_prescale(1);
  r.set_postscale(1);
  return r;
}

Coordinator::Config GlobalConfig() {
  Coordinator::Config c;
  c.global_ranks = {0, 1};
  return c;
}

class BoardExchangeTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 2;
  BoardExchangeTest() : shared_(new HitBoardShared()), global_(GlobalConfig()) {
    HitBoard::Init(shared_.get(), kRanks, /*enabled=*/true, 1 << 20);
    for (int r = 0; r < kRanks; ++r) {
      boards_.push_back(std::make_unique<HitBoard>(shared_.get(), r, kRanks));
      exchanges_.push_back(std::make_unique<BoardExchange>(
          boards_[r].get(), &links_[r], &runners_[r],
          BoardExchange::Limits{absl::Seconds(30), absl::ZeroDuration(),
                                absl::ZeroDuration()}));
    }
  }
  // Rank r's pass: its hits of the global set.
  bool SendHits(int r, std::vector<int64_t> ids) {
    wire::RequestList list;
    list.set_process_set(kGlobalProcessSet);
    absl::StatusOr<bool> sent = exchanges_[r]->Send(
        std::move(list), &ids, r == 0 ? &global_ : nullptr, r, now_);
    EXPECT_TRUE(sent.ok()) << sent.status();
    return sent.ok() && *sent;
  }
  void Tend() {
    absl::Time next = absl::InfiniteFuture();
    exchanges_[0]->Tend(global_, now_, &next);
  }
  void Execute(int r) {
    bool done = false;
    exchanges_[r]->Execute(&done);
  }
  int64_t Hits(int r) const {
    std::map<std::string, int64_t> c;
    exchanges_[r]->AddCounters(&c);
    return c.at("board.hits");
  }

  std::unique_ptr<HitBoardShared> shared_;
  Coordinator global_;
  KeptLink links_[kRanks];
  KeptRunner runners_[kRanks];
  std::vector<std::unique_ptr<HitBoard>> boards_;
  std::vector<std::unique_ptr<BoardExchange>> exchanges_;
  absl::Time now_ = absl::Now();
};

TEST_F(BoardExchangeTest, IdsEveryRankSetAreOneRecordEveryRankExecutes) {
  Tend();  // The coordinator is quiet: the board opens.
  ASSERT_TRUE(boards_[0]->open());
  EXPECT_FALSE(SendHits(1, {7, 9}));
  EXPECT_FALSE(SendHits(0, {9, 7}));  // the last bits: rank 0 appends
  EXPECT_THAT(links_[0].rings, ElementsAre(1));
  for (int r = 0; r < kRanks; ++r) {
    Execute(r);
    ASSERT_EQ(runners_[r].records.size(), 1u) << "rank " << r;
    EXPECT_THAT(runners_[r].records[0], testing::UnorderedElementsAre(7, 9));
    EXPECT_THAT(links_[r].sent, IsEmpty());  // no list to the coordinator
    EXPECT_EQ(Hits(r), 2);
    EXPECT_TRUE(runners_[r].fatal.ok());
  }
  EXPECT_TRUE(global_.Quiet());
}

TEST_F(BoardExchangeTest, AHitWhileClosedGoesToTheCoordinatorAndHoldsTheBoard) {
  ASSERT_FALSE(boards_[0]->open());
  EXPECT_TRUE(SendHits(1, {7}));
  ASSERT_EQ(links_[1].sent.size(), 1u);
  const wire::RequestList& list = links_[1].sent[0].request_list();
  EXPECT_EQ(list.process_set(), kGlobalProcessSet);
  std::vector<int64_t> hits;
  ForEachCacheHit(list, [&](int64_t id) { hits.push_back(id); });
  EXPECT_THAT(hits, ElementsAre(7));
  EXPECT_EQ(Hits(1), 0);
  // The list is on its way: the board stays closed until it arrived.
  Tend();
  EXPECT_FALSE(boards_[0]->open());
  exchanges_[0]->Received(global_, 1, now_);
  Tend();
  EXPECT_TRUE(boards_[0]->open());
}

TEST_F(BoardExchangeTest, AResponseListRunsAtItsMarkerAndNotBefore) {
  Tend();
  wire::ResponseList list;
  list.set_process_set(kGlobalProcessSet);
  list.set_seq(1);
  list.set_shutdown(true);
  exchanges_[1]->Hold(list);
  Execute(1);
  EXPECT_THAT(runners_[1].lists, IsEmpty());  // no marker yet
  ASSERT_TRUE(exchanges_[0]->ListMade(list, kGlobalProcessSet, global_));
  exchanges_[0]->ListExecuted();
  bool done = false;
  exchanges_[1]->Execute(&done);
  EXPECT_THAT(runners_[1].lists,
              ElementsAre(std::make_pair(kGlobalProcessSet, int64_t{1})));
  EXPECT_TRUE(done);  // the job's final list
  EXPECT_FALSE(exchanges_[1]->Behind());
}

TEST_F(BoardExchangeTest, ACallerRunsAListAtItsMarkerOnlyWhereTheRunnerLetsIt) {
  Tend();
  for (int64_t seq = 1; seq <= 2; ++seq) {
    wire::ResponseList list;
    list.set_process_set(kGlobalProcessSet);
    list.set_seq(seq);
    ASSERT_TRUE(exchanges_[0]->ListMade(list, kGlobalProcessSet, global_));
    exchanges_[0]->ListExecuted();
    if (seq == 1) exchanges_[1]->Hold(list);
  }
  // A caller's turn (Note [Caller turns]) runs the first list at its
  // marker and stops at the second's until it is here.
  bool done = false, handed_back = false;
  exchanges_[1]->Execute(&done, &handed_back);
  EXPECT_FALSE(handed_back);
  EXPECT_THAT(runners_[1].lists,
              ElementsAre(std::make_pair(kGlobalProcessSet, int64_t{1})));
  EXPECT_TRUE(exchanges_[1]->Behind());
  // A list only the thread may run is handed back, unexecuted.
  wire::ResponseList second;
  second.set_process_set(kGlobalProcessSet);
  second.set_seq(2);
  exchanges_[1]->Hold(second);
  runners_[1].caller_may_run = false;
  exchanges_[1]->Execute(&done, &handed_back);
  EXPECT_TRUE(handed_back);
  EXPECT_EQ(runners_[1].lists.size(), 1u);
  // The thread runs it.
  exchanges_[1]->Execute(&done);
  EXPECT_EQ(runners_[1].lists.size(), 2u);
  EXPECT_FALSE(exchanges_[1]->Behind());
  EXPECT_FALSE(done);
}

TEST_F(BoardExchangeTest, ClosingTheBoardMakesAHalfSetIdTheCoordinators) {
  // The name is negotiated once, the slow way: both caches know it.
  for (int r = 0; r < kRanks; ++r) {
    wire::RequestList list;
    *list.add_requests() = Allreduce(r, "grad.w");
    global_.AddRequests(r, std::move(list), now_);
  }
  ASSERT_TRUE(global_.HasReady());
  global_.TakeResponseList();
  const int64_t id = global_.cache().Lookup(Allreduce(0, "grad.w"));
  ASSERT_GE(id, 0);
  // Once the ranks acked the list the coordinator is quiet: the board opens.
  for (int r = 0; r < kRanks; ++r) {
    wire::RequestList ack;
    ack.set_acked_seq(1);
    global_.AddRequests(r, std::move(ack), now_);
  }
  Tend();
  ASSERT_TRUE(boards_[0]->open());
  EXPECT_FALSE(SendHits(1, {id}));  // half set: rank 0 has not
  EXPECT_THAT(global_.PendingNames(), IsEmpty());
  // A list from rank 1 comes (say, a new name): the board closes first,
  // and rank 1's bit becomes its hit at the coordinator.
  exchanges_[0]->Received(global_, 1, now_);
  EXPECT_FALSE(boards_[0]->open());
  EXPECT_THAT(global_.PendingNames(), ElementsAre("grad.w"));
  for (int r = 0; r < kRanks; ++r) {
    Execute(r);
    EXPECT_THAT(runners_[r].records, IsEmpty());
  }
}

}  // namespace
}  // namespace kolo
