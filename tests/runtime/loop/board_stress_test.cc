// The hit board (Note [Hits on the board] in runtime/control/hit_board.h)
// inside real Runtimes (threads of one process, one host: the board is on),
// driven by a random program per seed: cached names that come and go
// between steps, new names, a cached name resized on every rank, a shape
// that differs on one rank (an error for that step only), cached
// broadcasts with a moving root, every rank submitting in its own order,
// then a join while the others go on. Each step checks every result
// bitwise and every error's message; nothing may hang (every wait has a
// deadline). The same program with the board off gives the reference
// counts of the slow path.
#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/control/hit_board.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace {

using testing::Counts;
using ::testing::HasSubstr;
using testing::OnEachRank;

struct Op {
  enum Kind { kAllreduce, kBroadcast } kind = kAllreduce;
  std::string name;
  int64_t len = 0;
  int odd_rank = -1;  // this rank submits len + 1: a shape mismatch
  int root = 0;
  int process_set = kGlobalProcessSet;  // 1: ranks 0 and 1 only
};

constexpr int kPairSet = 1;  // the startup set {0, 1}
bool InSet(const Op& op, int rank) {
  return op.process_set == kGlobalProcessSet || rank < 2;
}

// The program: the same for every rank (drawn from `seed` alone).
std::vector<std::vector<Op>> Program(int n, uint32_t seed, int steps) {
  std::mt19937 rng(seed);
  auto chance = [&](double p) {
    return std::uniform_real_distribution<double>(0, 1)(rng) < p;
  };
  const int cached = 24;
  std::vector<int64_t> len(cached);
  for (int k = 0; k < cached; ++k) len[k] = 1 + k % 7 * 13;
  std::vector<std::vector<Op>> program(steps);
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < cached; ++k) {
      if (s > 0 && !chance(0.85)) continue;  // a name skips this step
      Op op;
      op.name = absl::StrCat("g/", k);
      if (chance(0.03)) len[k] += 5;  // resized on every rank from now on
      op.len = len[k];
      if (s > 1 && chance(0.02)) op.odd_rank = static_cast<int>(rng() % n);
      program[s].push_back(op);
    }
    if (chance(0.15)) {
      Op op;
      op.name = absl::StrCat("new/", s);
      op.len = 3 + s;
      program[s].push_back(op);
    }
    for (int k = 0; k < 4; ++k) {
      // Collectives of another set between the global set's: every rank
      // must run the two sets' collectives in one order, or two ranks
      // block in different ones.
      if (s > 0 && !chance(0.8)) continue;
      Op op;
      op.name = absl::StrCat("s/", k);
      op.len = 2 + k;
      op.process_set = kPairSet;
      program[s].push_back(op);
    }
    for (int k = 0; k < 3; ++k) {
      if (s > 0 && !chance(0.7)) continue;
      Op op;
      op.kind = Op::kBroadcast;
      op.name = absl::StrCat("b/", k);
      op.len = 8 + k;
      op.root = (s / 6 + k) % n;  // a new root renegotiates
      program[s].push_back(op);
    }
  }
  return program;
}

float Value(int rank, int step, int64_t i) {
  return static_cast<float>(rank + 1 + step + i % 3);
}

// Runs the program on every rank; returns the job's stats per rank.
std::vector<Counts> RunProgram(int n, uint32_t seed, bool board) {
  const int steps = 30;
  const std::vector<std::vector<Op>> program = Program(n, seed, steps);
  auto rts = testing::StartJob(n, [&](Options& o) {
    o.negotiate_within_hosts = board;
    o.process_sets = {{0, 1}};
  });
  OnEachRank(n, [&](int r) {
    Runtime& rt = *rts[r];
    std::mt19937 order_rng(seed * 977 + r);
    for (int s = 0; s < steps; ++s) {
      const std::vector<Op>& ops = program[s];
      std::vector<size_t> order(ops.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), order_rng);
      std::vector<std::vector<float>> data(ops.size());
      std::vector<Work> works(ops.size());
      for (size_t i : order) {
        const Op& op = ops[i];
        if (!InSet(op, r)) continue;
        const int64_t len = op.len + (op.odd_rank == r ? 1 : 0);
        data[i].resize(len);
        for (int64_t e = 0; e < len; ++e) data[i][e] = Value(r, s, e);
        TensorView view(data[i].data(), DataType::kFloat32, {len});
        absl::StatusOr<Work> w;
        if (op.kind == Op::kAllreduce) {
          AllreduceRequest req;
          req.name = op.name;
          req.input = req.output = view;
          req.process_set = op.process_set;
          w = rt.Allreduce(req);
        } else {
          BroadcastRequest req;
          req.name = op.name;
          req.tensor = view;
          req.root = op.root;
          w = rt.Broadcast(req);
        }
        ASSERT_TRUE(w.ok()) << "rank " << r << " step " << s << " " << op.name
                            << ": " << w.status();
        works[i] = *w;
        // Vary the interleaving (not a synchronization).
        for (uint32_t y = order_rng() % 4; y > 0; --y)
          std::this_thread::yield();
      }
      for (size_t i = 0; i < ops.size(); ++i) {
        const Op& op = ops[i];
        if (!InSet(op, r)) continue;
        const absl::Status st = works[i].Wait(absl::Seconds(30));
        const std::string where =
            absl::StrCat("rank ", r, " step ", s, " ", op.name);
        if (op.odd_rank >= 0) {
          EXPECT_FALSE(st.ok()) << where;
          EXPECT_THAT(std::string(st.message()), HasSubstr("shape mismatch"))
              << where;
          EXPECT_THAT(std::string(st.message()), HasSubstr(op.name)) << where;
          continue;
        }
        ASSERT_TRUE(st.ok()) << where << ": " << st;
        for (int64_t e = 0; e < op.len; ++e) {
          float want = 0;
          if (op.kind == Op::kAllreduce) {
            const int members = op.process_set == kGlobalProcessSet ? n : 2;
            for (int q = 0; q < members; ++q) want += Value(q, s, e);
          } else {
            want = Value(op.root, s, e);
          }
          ASSERT_EQ(data[i][e], want) << where << " [" << e << "]";
        }
      }
    }
    // The last rank joins; the others run three more steps of cached
    // names (it contributes zeros), then join too.
    if (r == n - 1) {
      auto last = rt.Join();
      ASSERT_TRUE(last.ok()) << last.status();
      return;
    }
    for (int s = steps; s < steps + 3; ++s) {
      std::vector<std::vector<float>> data(4, std::vector<float>(5));
      std::vector<Work> works;
      for (int k = 0; k < 4; ++k) {
        for (int64_t e = 0; e < 5; ++e) data[k][e] = Value(r, s, e);
        AllreduceRequest req;
        req.name = absl::StrCat("j/", k);
        req.input = req.output =
            TensorView(data[k].data(), DataType::kFloat32, {5});
        auto w = rt.Allreduce(req);
        ASSERT_TRUE(w.ok()) << w.status();
        works.push_back(*w);
      }
      for (int k = 0; k < 4; ++k) {
        ASSERT_TRUE(works[k].Wait(absl::Seconds(30)).ok()) << works[k].status();
        for (int64_t e = 0; e < 5; ++e) {
          float want = 0;
          for (int q = 0; q < n - 1; ++q) want += Value(q, s, e);
          ASSERT_EQ(data[k][e], want) << "rank " << r << " join step " << s;
        }
      }
    }
    auto last = rt.Join();
    ASSERT_TRUE(last.ok()) << last.status();
  });
  std::vector<Counts> stats;
  for (auto& rt : rts) {
    stats.push_back(rt->Counters());
    stats.back()["tensors_executed"] = rt->stats().tensors_executed;
  }
  testing::ShutdownJob(rts);
  return stats;
}

// Lists of a set enter the log too, and ranks outside the set must pass
// their markers: 300 collectives of ranks 0 and 1 (more than the log's
// records) while ranks 2 and 3 make no call at all.
TEST(BoardLog, ASetRunsWhileTheRanksOutsideItAreIdle) {
  const int n = 4, ops = 3 * HitBoardShared::kRecords;
  auto rts = testing::StartJob(n, [](Options& o) {
    o.process_sets = {{0, 1}};
  });
  OnEachRank(2, [&](int r) {
    std::vector<float> v(4);
    for (int i = 0; i < ops; ++i) {
      std::fill(v.begin(), v.end(), static_cast<float>(r + i));
      AllreduceRequest req;
      req.name = absl::StrCat("pair/", i % 7);
      req.process_set = kPairSet;
      req.input = req.output = TensorView(v.data(), DataType::kFloat32, {4});
      auto w = rts[r]->Allreduce(req);
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_TRUE(w->Wait(absl::Seconds(30)).ok())
          << "op " << i << ": " << w->status();
      ASSERT_EQ(v[0], static_cast<float>(1 + 2 * i));
    }
  });
  testing::ShutdownJob(rts);
}

struct Case {
  int ranks;
  uint32_t seed;
};

class BoardStress : public ::testing::TestWithParam<Case> {};

TEST_P(BoardStress, RandomProgramGivesExactResultsWithAndWithoutTheBoard) {
  const Case c = GetParam();
  const std::vector<Counts> on = RunProgram(c.ranks, c.seed, /*board=*/true);
  if (HasFatalFailure()) return;
  const std::vector<Counts> off = RunProgram(c.ranks, c.seed, /*board=*/false);
  int64_t board_hits = 0;
  for (int r = 0; r < c.ranks; ++r) {
    // The same tensors ran either way; the board took hits only when on.
    EXPECT_EQ(on[r].at("tensors_executed"), off[r].at("tensors_executed"))
        << "rank " << r;
    EXPECT_EQ(off[r].at("board.hits"), 0);
    board_hits += on[r].at("board.hits");
  }
  EXPECT_GT(board_hits, 0);
  std::printf("ranks %d seed %u: %lld of %lld hits on the board\n", c.ranks,
              c.seed, static_cast<long long>(board_hits),
              static_cast<long long>([&] {
                int64_t h = 0;
                for (const auto& s : on)
                  h += s.at("negotiation.cache_hits_sent");
                return h;
              }()));
}

INSTANTIATE_TEST_SUITE_P(Seeds, BoardStress,
                         ::testing::Values(Case{2, 1}, Case{3, 2}, Case{3, 3},
                                           Case{5, 4}, Case{2, 5}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.ranks, "ranks_seed",
                                               info.param.seed);
                         });

}  // namespace
}  // namespace kolo
