// The worker's side of elastic jobs (kolo/elastic.h) and generations in the
// runtime (Note [Generations] in runtime_impl.cc): assignments read from the
// store, the lost rank passed on, a torn-down generation leaving no thread or
// descriptor behind, the next generation forming in the same store, and a
// worker of another generation never joining one.
#include "kolo/elastic.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kolo/runtime.h"
#include "kolo/store.h"
#include "kolo/work.h"
#include "tests/testing/local_job.h"
#include "tests/testing/threads.h"

namespace kolo {
namespace {

using elastic::Assignment;
using elastic::Membership;

// This process's open descriptors, each as "fd -> target".
std::vector<std::string> Descriptors() {
  std::vector<std::string> out;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return out;
  const int own = dirfd(dir);
  while (struct dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.' || std::atoi(entry->d_name) == own) continue;
    char target[512] = {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    const ssize_t n = readlink(path.c_str(), target, sizeof(target) - 1);
    out.push_back(std::string(entry->d_name) + " -> " +
                  (n > 0 ? std::string(target, n) : std::string("?")));
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

Options WorkerOptions(int64_t id, int64_t generation, int rank, int size) {
  Options o;
  o.elastic_id = id;
  o.generation = generation;
  o.rank = rank;
  o.size = size;
  o.elastic_timeout = absl::Seconds(10);
  return o;
}

TEST(ElasticMembersTest, FormatsAndParsesAssignments) {
  Assignment a;
  a.rank = 1;
  a.size = 3;
  a.local_rank = 1;
  a.local_size = 2;
  a.cross_rank = 0;
  a.cross_size = 2;
  Assignment b;
  b.rank = 2;
  b.size = 3;
  b.local_rank = 0;
  b.local_size = 1;
  b.cross_rank = 1;
  b.cross_size = 2;
  const std::string value = elastic::FormatMembers({{7, a}, {9, b}});
  EXPECT_EQ(value, "7 1 3 1 2 0 2;9 2 3 0 1 1 2");
  absl::StatusOr<Assignment> mine = elastic::ParseMembers(value, 4, 9);
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_TRUE(mine->member);
  EXPECT_EQ(mine->generation, 4);
  EXPECT_EQ(mine->rank, 2);
  EXPECT_EQ(mine->cross_rank, 1);
  absl::StatusOr<Assignment> other = elastic::ParseMembers(value, 4, 8);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(other->member);
  absl::StatusOr<Assignment> done = elastic::ParseMembers("done", 5, 7);
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(done->member);
  for (const char* bad :
       {"7 1 3", "7 3 3 0 1 0 1", "x 0 1 0 1 0 1", "7 0 1 0 1 0 1 5"}) {
    absl::StatusOr<Assignment> parsed = elastic::ParseMembers(bad, 2, 7);
    EXPECT_TRUE(absl::IsInvalidArgument(parsed.status())) << bad;
    EXPECT_NE(parsed.status().message().find("generation 2"), std::string::npos)
        << parsed.status();
  }
}

TEST(ElasticMembershipTest, LeavesWithTheLostRankAndTakesTheNextAssignment) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  std::unique_ptr<Membership> m =
      Membership::ForStore(store, WorkerOptions(5, 0, 3, 4));
  absl::StatusOr<bool> requested = m->ReformRequested();
  ASSERT_TRUE(requested.ok());
  EXPECT_FALSE(*requested);
  ASSERT_TRUE(store->Set("elastic/0/closing", "rank 1 lost").ok());
  requested = m->ReformRequested();
  ASSERT_TRUE(requested.ok());
  EXPECT_TRUE(*requested);

  // What a lost peer's status carries, as the runtime reports it.
  absl::Status lost = absl::UnavailableError("rank 1 lost: connection closed");
  lost.SetPayload(kLostRankPayload, absl::Cord("1"));
  EXPECT_EQ(LostRank(lost), 1);
  EXPECT_EQ(LostRank(absl::UnavailableError("rank 1 lost")), -1);

  std::thread launcher([&] {
    absl::StatusOr<std::string> left =
        store->Get("elastic/0/left/5", absl::Seconds(10));
    ASSERT_TRUE(left.ok()) << left.status();
    EXPECT_EQ(*left, "1 rank 1 lost: connection closed");
    Assignment mine;
    mine.rank = 2;
    mine.size = 3;
    mine.local_rank = 2;
    mine.local_size = 3;
    ASSERT_TRUE(
        store->Set("elastic/1/members", elastic::FormatMembers({{5, mine}}))
            .ok());
  });
  absl::StatusOr<Assignment> next = m->Next(lost);
  launcher.join();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->member);
  EXPECT_EQ(next->generation, 1);
  EXPECT_EQ(m->options().generation, 1);
  EXPECT_EQ(m->options().rank, 2);
  EXPECT_EQ(m->options().size, 3);
  EXPECT_EQ(m->options().local_size, 3);

  // A generation superseded before the worker read it is skipped.
  ASSERT_TRUE(store->Set("elastic/2/members", "5 0 1 0 1 0 1").ok());
  ASSERT_TRUE(
      store->Set("elastic/3/members", "5 0 2 0 2 0 1;6 1 2 1 2 0 1").ok());
  ASSERT_TRUE(store->Set("elastic/generation", "3").ok());
  next = m->Next(absl::OkStatus());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->generation, 3);
  EXPECT_EQ(m->options().size, 2);
  absl::StatusOr<std::string> left =
      store->Get("elastic/1/left/5", absl::ZeroDuration());
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(*left, "-1 re-forming");

  // Removed: not listed.
  ASSERT_TRUE(store->Set("elastic/4/members", "6 0 1 0 1 0 1").ok());
  next = m->Next(absl::OkStatus());
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->member);
}

TEST(ElasticMembershipTest, NoNextGenerationIsAnErrorNamingIt) {
  Options o = WorkerOptions(2, 6, 0, 2);
  o.elastic_timeout = absl::Milliseconds(200);
  std::unique_ptr<Membership> m = Membership::ForStore(NewInMemoryStore(), o);
  absl::StatusOr<Assignment> next = m->Next(absl::OkStatus());
  EXPECT_TRUE(absl::IsDeadlineExceeded(next.status())) << next.status();
  EXPECT_NE(next.status().message().find("no generation 7"), std::string::npos)
      << next.status();
}

TEST(ElasticMembershipTest, ConnectNeedsAnElasticJob) {
  Options o;
  absl::StatusOr<std::unique_ptr<Membership>> m = Membership::Connect(o);
  EXPECT_TRUE(absl::IsFailedPrecondition(m.status())) << m.status();
}

// Starts `size` runtimes of `generation` on `store`; statuses per rank.
std::vector<absl::StatusOr<std::unique_ptr<Runtime>>> StartGeneration(
    std::shared_ptr<Store> store, int size, std::vector<int64_t> generations,
    absl::Duration start_timeout = absl::Seconds(30)) {
  std::vector<absl::StatusOr<std::unique_ptr<Runtime>>> out(size);
  testing::OnEachRank(size, [&](int r) {
    Options o = testing::JobOptions(r, size, store);
    o.generation = generations[r];
    o.start_timeout = start_timeout;
    o.op_timeout = absl::Seconds(8);
    out[r] = Runtime::Create(o);
  });
  return out;
}

TEST(ElasticGenerationsTest, ALostRankEndsTheGenerationAndTheNextFormsCleanly) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  const int threads_before = testing::ThreadCount();
  const std::vector<std::string> fds_before = Descriptors();
  {
    auto first = StartGeneration(store, 3, {0, 0, 0});
    for (auto& rt : first) ASSERT_TRUE(rt.ok()) << rt.status();
    // Rank 2 goes away as a killed worker would: its connections close.
    (*first[2])->Abort();
    for (int r = 0; r < 2; ++r) {
      float x = 1;
      AllreduceRequest req;
      req.name = "after_loss";
      req.input = TensorView(&x, DataType::kFloat32, {1});
      req.output = req.input;
      absl::StatusOr<Work> w = (*first[r])->Allreduce(req);
      absl::Status s = w.ok() ? w->Wait(absl::Seconds(20)) : w.status();
      EXPECT_TRUE(absl::IsUnavailable(s)) << "rank " << r << ": " << s;
      absl::Status cause = (*first[r])->status();
      EXPECT_EQ(LostRank(cause), 2) << "rank " << r << ": " << cause;
      (*first[r])->Abort();
    }
  }
  // The survivors' runtimes are gone with everything they held.
  EXPECT_EQ(testing::ThreadCount(), threads_before);
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
  // TSan keeps the pipes to the symbolizer it started to match a
  // suppression (tools/tsan.supp) against a stack of the loss: its own.
  const bool own_descriptors_only = false;
#else
  const bool own_descriptors_only = true;
#endif
#else
  const bool own_descriptors_only = true;
#endif
  if (own_descriptors_only) EXPECT_EQ(Descriptors(), fds_before);

  // Generation 1 of the two survivors, in the same store.
  auto second = StartGeneration(store, 2, {1, 1});
  for (auto& rt : second) ASSERT_TRUE(rt.ok()) << rt.status();
  testing::OnEachRank(2, [&](int r) {
    float x = static_cast<float>(r + 1);
    AllreduceRequest req;
    req.name = "after_loss";  // The old generation's name again.
    req.op = ReduceOp::kSum;
    req.input = TensorView(&x, DataType::kFloat32, {1});
    req.output = req.input;
    absl::StatusOr<Work> w = (*second[r])->Allreduce(req);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Wait(absl::Seconds(20)).ok()) << w->status();
    EXPECT_EQ(x, 3.0f);
  });
  testing::OnEachRank(2, [&](int r) {
    EXPECT_TRUE((*second[r])->Shutdown(absl::Seconds(20)).ok());
  });
}

TEST(ElasticGenerationsTest, AWorkerOfAnotherGenerationNeverJoins) {
  std::shared_ptr<Store> store = NewInMemoryStore();
  // Rank 1 believes it is in generation 1, rank 0 in generation 2: each
  // waits in its own generation's keys, and neither forms a job.
  auto runtimes = StartGeneration(store, 2, {2, 1}, absl::Seconds(2));
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(runtimes[r].ok()) << "rank " << r << " joined";
    EXPECT_TRUE(absl::IsDeadlineExceeded(runtimes[r].status()))
        << runtimes[r].status();
  }
}

}  // namespace
}  // namespace kolo
