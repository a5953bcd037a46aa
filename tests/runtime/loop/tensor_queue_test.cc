// TensorQueue on its own: the hand-off from callers to the background
// thread and the table of in-flight collectives (runtime/loop/tensor_queue.h).
#include "runtime/loop/tensor_queue.h"

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "runtime/api/work_state.h"

namespace kolo {
namespace {

std::unique_ptr<TensorEntry> Entry(
    const std::string& name, int set = 0,
    absl::Time deadline = absl::InfiniteFuture()) {
  auto e = std::make_unique<TensorEntry>();
  e->request.set_type(wire::ALLREDUCE);
  e->request.set_name(name);
  e->request.set_process_set(set);
  e->request.set_rank(3);
  e->work = std::make_shared<internal::WorkState>();
  e->deadline = deadline;
  return e;
}

std::vector<std::string> NewNames(
    TensorQueue& q, absl::Time deadline = absl::InfiniteFuture()) {
  std::vector<std::string> names;
  q.TakeNewRequests(deadline, absl::ZeroDuration(),
                    [&](const wire::Request& r) { names.push_back(r.name()); });
  return names;
}

struct QueueTest : ::testing::Test {
  std::atomic<int> notified{0};
  TensorQueue queue{[this] { notified.fetch_add(1); }};
};

TEST_F(QueueTest, NewRequestsInSubmissionOrderWithOneWakeUpPerBurst) {
  ASSERT_TRUE(queue.Add(Entry("c")).ok());
  ASSERT_TRUE(queue.Add(Entry("a")).ok());
  ASSERT_TRUE(queue.Add(Entry("b")).ok());
  EXPECT_EQ(notified.load(), 1);  // Only the first since the last take.
  EXPECT_TRUE(queue.has_new_requests());
  EXPECT_EQ(queue.adds(), 3u);
  EXPECT_EQ(NewNames(queue), (std::vector<std::string>{"c", "a", "b"}));
  EXPECT_FALSE(queue.has_new_requests());
  EXPECT_TRUE(NewNames(queue).empty());
  ASSERT_TRUE(queue.Add(Entry("d")).ok());
  EXPECT_EQ(notified.load(), 2);
  EXPECT_EQ(queue.size(), 4u);
}

TEST_F(QueueTest, NameInFlightIsRefusedPerProcessSet) {
  ASSERT_TRUE(queue.Add(Entry("x")).ok());
  absl::Status again = queue.Add(Entry("x"));
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(again.message().find("\"x\""), std::string::npos) << again;
  EXPECT_NE(again.message().find("rank 3"), std::string::npos) << again;
  EXPECT_TRUE(queue.Add(Entry("x", /*set=*/1)).ok());
  EXPECT_EQ(queue.size(), 2u);
  // Once taken, the name is free again.
  ASSERT_NE(queue.Take(0, "x"), nullptr);
  EXPECT_EQ(queue.Take(0, "x"), nullptr);
  EXPECT_TRUE(queue.Add(Entry("x")).ok());
}

TEST_F(QueueTest, TakeAllInResponseOrderWithNullsForOthers) {
  for (const char* n : {"a", "b", "c"}) ASSERT_TRUE(queue.Add(Entry(n)).ok());
  google::protobuf::RepeatedPtrField<std::string> names;
  for (const char* n : {"c", "zz", "a"}) *names.Add() = n;
  std::vector<std::unique_ptr<TensorEntry>> out;
  queue.TakeAll(0, names, &out);
  ASSERT_EQ(out.size(), 3u);
  ASSERT_NE(out[0], nullptr);
  EXPECT_EQ(out[0]->request.name(), "c");
  EXPECT_EQ(out[1], nullptr);
  ASSERT_NE(out[2], nullptr);
  EXPECT_EQ(out[2]->request.name(), "a");
  // Taken before they were sent: no longer new requests either.
  EXPECT_EQ(NewNames(queue), (std::vector<std::string>{"b"}));
  queue.TakeAll(7, names, &out);  // An unknown set: nothing.
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0], nullptr);
}

TEST_F(QueueTest, AddAllIsAllOrNone) {
  ASSERT_TRUE(queue.Add(Entry("busy")).ok());
  ASSERT_EQ(NewNames(queue).size(), 1u);
  std::vector<std::unique_ptr<TensorEntry>> batch;
  batch.push_back(Entry("p"));
  batch.push_back(Entry("q"));
  batch.push_back(Entry("busy"));
  absl::Status s = queue.AddAll(&batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_NE(s.message().find("\"busy\""), std::string::npos) << s;
  // Nothing was queued, and the caller still owns every entry.
  EXPECT_EQ(queue.size(), 1u);
  EXPECT_FALSE(queue.has_new_requests());
  ASSERT_EQ(batch.size(), 3u);
  for (auto& e : batch) ASSERT_NE(e, nullptr);
  EXPECT_EQ(batch[0]->request.name(), "p");
  EXPECT_EQ(batch[1]->request.name(), "q");

  batch[2] = Entry("p");  // Now a name twice.
  s = queue.AddAll(&batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("given twice"), std::string::npos) << s;
  EXPECT_NE(s.message().find("requests 0 and 2"), std::string::npos) << s;
  EXPECT_EQ(queue.size(), 1u);
  ASSERT_EQ(batch.size(), 3u);

  batch[2] = Entry("r");
  const int before = notified.load();
  ASSERT_TRUE(queue.AddAll(&batch).ok());
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(notified.load(), before + 1);
  EXPECT_EQ(queue.size(), 4u);
  EXPECT_EQ(NewNames(queue), (std::vector<std::string>{"p", "q", "r"}));
}

TEST_F(QueueTest, ExpiredEntriesFailAndHoldTheirNameOnScratch) {
  const absl::Time now = absl::Now();
  std::vector<float> caller(4, 1.0f);
  auto late = Entry("late", 0, now - absl::Seconds(1));
  late->input = late->output =
      TensorView(caller.data(), DataType::kFloat32, {4});
  std::shared_ptr<internal::WorkState> work = late->work;
  ASSERT_TRUE(queue.Add(std::move(late)).ok());
  ASSERT_TRUE(queue.Add(Entry("later", 0, now + absl::Hours(1))).ok());

  EXPECT_EQ(queue.ExpireLocal(now, absl::Seconds(5)), now + absl::Hours(1));
  ASSERT_TRUE(work->IsCompleted());
  EXPECT_EQ(work->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(work->status().message().find("\"late\""), std::string::npos);
  // The name stays taken until the late response comes, on scratch memory.
  EXPECT_EQ(queue.Add(Entry("late")).code(),
            absl::StatusCode::kFailedPrecondition);
  auto taken = queue.Take(0, "late");
  ASSERT_NE(taken, nullptr);
  ASSERT_NE(taken->scratch, nullptr);
  EXPECT_NE(taken->input.data, caller.data());
  EXPECT_NE(taken->output.data, caller.data());
  // Before the earliest deadline no entry is looked at.
  EXPECT_EQ(queue.ExpireLocal(now, absl::Seconds(5)), now + absl::Hours(1));
}

TEST_F(QueueTest, CloseFailsPendingAndLaterAdds) {
  auto a = Entry("a");
  auto b = Entry("b", 2);
  auto wa = a->work, wb = b->work;
  ASSERT_TRUE(queue.Add(std::move(a)).ok());
  ASSERT_TRUE(queue.Add(std::move(b)).ok());
  queue.Close(absl::UnavailableError("rank 1 lost"));
  for (auto& w : {wa, wb}) {
    ASSERT_TRUE(w->IsCompleted());
    EXPECT_EQ(w->status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(w->status().message().find("rank 1 lost"), std::string::npos);
  }
  EXPECT_NE(wa->status().message().find("\"a\""), std::string::npos);
  EXPECT_EQ(queue.size(), 0u);
  EXPECT_FALSE(queue.has_new_requests());
  EXPECT_EQ(queue.Add(Entry("c")).code(), absl::StatusCode::kUnavailable);
  std::vector<std::unique_ptr<TensorEntry>> batch;
  batch.push_back(Entry("d"));
  EXPECT_EQ(queue.AddAll(&batch).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(queue.closed_status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(QueueTest, FailSetFailsThatSetOnly) {
  auto a = Entry("a", 1);
  auto b = Entry("b", 2);
  auto wa = a->work, wb = b->work;
  ASSERT_TRUE(queue.Add(std::move(a)).ok());
  ASSERT_TRUE(queue.Add(std::move(b)).ok());
  queue.FailSet(1, absl::AbortedError("process set 1 was removed"));
  EXPECT_EQ(wa->status().code(), absl::StatusCode::kAborted);
  EXPECT_FALSE(wb->IsCompleted());
  EXPECT_EQ(NewNames(queue), (std::vector<std::string>{"b"}));
  EXPECT_EQ(queue.size(), 1u);
}

// Note [Taking without the lock]: a caller's Add does not wait for the
// take's reading of the requests it took (with the lock held through the
// reading, the Add below would wait until the take ends, and the wait for
// it would time out).
TEST_F(QueueTest, CallersAddWhileATakeReadsItsRequests) {
  ASSERT_TRUE(queue.Add(Entry("a")).ok());
  ASSERT_TRUE(queue.Add(Entry("b")).ok());
  std::vector<std::string> taken;
  std::promise<absl::Status> added;
  std::future<absl::Status> add_returned = added.get_future();
  std::thread caller;
  bool add_returned_during_take = false;
  queue.TakeNewRequests(
      absl::InfiniteFuture(), absl::ZeroDuration(),
      [&](const wire::Request& r) {
        taken.push_back(r.name());
        if (r.name() != "a") return;
        caller = std::thread([&] { added.set_value(queue.Add(Entry("c"))); });
        add_returned_during_take =
            add_returned.wait_for(std::chrono::seconds(10)) ==
            std::future_status::ready;
      });
  caller.join();
  EXPECT_TRUE(add_returned_during_take);
  EXPECT_TRUE(add_returned.get().ok());
  EXPECT_EQ(taken, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(queue.has_new_requests());
  EXPECT_EQ(NewNames(queue), (std::vector<std::string>{"c"}));
}

// A ReadyEvent whose lifetime tells when its entry was destroyed.
struct Marker : ReadyEvent {
  bool Ready() override { return true; }
};

// Close (another thread's, e.g. a fatal error's) during a take fails the
// entries at once but leaves their destruction to the take, which still
// reads them (ASan would see a read of a destroyed entry); FailSet too.
TEST_F(QueueTest, EntriesFailedDuringATakeLiveUntilItEnds) {
  for (bool whole_queue : {true, false}) {
    SCOPED_TRACE(whole_queue ? "Close" : "FailSet");
    TensorQueue q([] {});
    auto a = Entry("a", 1);
    auto b = Entry("b", 1);
    auto marker = std::make_shared<Marker>();
    b->input.ready = marker;
    std::weak_ptr<Marker> b_alive = marker;
    marker.reset();
    auto wa = a->work, wb = b->work;
    ASSERT_TRUE(q.Add(std::move(a)).ok());
    ASSERT_TRUE(q.Add(std::move(b)).ok());
    std::vector<std::string> taken;
    std::promise<void> failed;
    std::future<void> failing_returned = failed.get_future();
    std::thread failer;
    bool returned_during_take = false, alive_after_failing = false;
    q.TakeNewRequests(
        absl::InfiniteFuture(), absl::ZeroDuration(),
        [&](const wire::Request& r) {
          if (r.name() == "a") {
            failer = std::thread([&] {
              if (whole_queue) {
                q.Close(absl::UnavailableError("rank 1 lost"));
              } else {
                q.FailSet(1, absl::AbortedError("process set 1 was removed"));
              }
              failed.set_value();
            });
            // Neither waits for the take (nor for its lock).
            returned_during_take =
                failing_returned.wait_for(std::chrono::seconds(10)) ==
                std::future_status::ready;
            alive_after_failing = !b_alive.expired();
          }
          taken.push_back(r.name());
        });
    failer.join();
    EXPECT_EQ(taken, (std::vector<std::string>{"a", "b"}));
    EXPECT_TRUE(returned_during_take);
    EXPECT_TRUE(alive_after_failing);
    EXPECT_TRUE(b_alive.expired());  // destroyed by the take
    for (auto& w : {wa, wb}) {
      ASSERT_TRUE(w->IsCompleted());
      EXPECT_FALSE(w->status().ok());
    }
    EXPECT_EQ(q.size(), 0u);
  }
}

TEST_F(QueueTest, WaitDrainedSeesTheLastTake) {
  EXPECT_TRUE(queue.WaitDrained(absl::Now()));
  ASSERT_TRUE(queue.Add(Entry("a")).ok());
  EXPECT_FALSE(queue.WaitDrained(absl::Now()));  // Deadline already passed.
  std::atomic<bool> drained{false};
  std::thread waiter(
      [&] { drained = queue.WaitDrained(absl::Now() + absl::Seconds(30)); });
  ASSERT_NE(queue.Take(0, "a"), nullptr);
  waiter.join();
  EXPECT_TRUE(drained.load());
}

TEST_F(QueueTest, RecycledEntriesComeBackEmptyWithTheirStorage) {
  auto e = Entry("a-name-longer-than-the-small-string-buffer");
  e->request.add_shape(5);
  e->allocator = [](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
    return nullptr;
  };
  std::weak_ptr<internal::WorkState> work = e->work;
  e->work->Complete(absl::OkStatus());
  TensorEntry* raw = e.get();
  const size_t capacity = e->request.name().capacity();

  auto pending = Entry("pending");  // Not completed: never recycled.
  std::vector<std::unique_ptr<TensorEntry>> done;
  done.push_back(std::move(e));
  done.push_back(nullptr);
  done.push_back(std::move(pending));
  queue.Recycle(&done);
  EXPECT_TRUE(done.empty());
  EXPECT_EQ(queue.free_entries(), 1u);
  // The entry keeps its completed state (Note [Works recycled]).
  ASSERT_FALSE(work.expired());
  EXPECT_TRUE(work.lock()->IsCompleted());

  std::unique_ptr<TensorEntry> again = queue.NewEntry();
  EXPECT_EQ(again.get(), raw);
  EXPECT_EQ(again->request.name(), "");
  EXPECT_EQ(again->request.shape_size(), 0);
  EXPECT_GE(again->request.mutable_name()->capacity(), capacity);
  // No Work shared the state: it is renewed for the next collective.
  EXPECT_EQ(again->work, work.lock());
  EXPECT_FALSE(again->work->IsCompleted());
  EXPECT_EQ(again->work->status().code(), absl::StatusCode::kUnknown);
  EXPECT_FALSE(again->allocator);
  EXPECT_FALSE(again->sent);
  EXPECT_EQ(again->deadline, absl::InfiniteFuture());
  EXPECT_EQ(queue.free_entries(), 0u);

  std::vector<std::unique_ptr<TensorEntry>> fresh;
  queue.NewEntries(3, &fresh);  // None left to reuse: new ones.
  ASSERT_EQ(fresh.size(), 3u);
  for (auto& f : fresh) ASSERT_NE(f, nullptr);
}

TEST_F(QueueTest, AStateAWorkStillSharesIsNeverRenewed) {
  auto e = Entry("held");
  // The caller's handle, as a Work holds it.
  std::shared_ptr<internal::WorkState> held = e->work;
  std::vector<int64_t> splits = {3, 4};
  e->work->Complete(absl::AbortedError("rank 1 gave up"), splits);
  std::vector<std::unique_ptr<TensorEntry>> done;
  done.push_back(std::move(e));
  queue.Recycle(&done);

  std::unique_ptr<TensorEntry> again = queue.NewEntry();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->work, nullptr);  // A new state comes with the submission.
  ASSERT_TRUE(held->IsCompleted());
  EXPECT_EQ(held->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(held->splits(), splits);
  EXPECT_EQ(held.use_count(), 1);

  // The same through the batch path, beside an entry whose state is free.
  auto shared = Entry("shared");
  auto alone = Entry("alone");
  std::shared_ptr<internal::WorkState> handle = shared->work;
  const internal::WorkState* alone_state = alone->work.get();
  shared->work->Complete(absl::OkStatus());
  alone->work->Complete(absl::OkStatus());
  done.push_back(std::move(shared));
  done.push_back(std::move(alone));
  queue.Recycle(&done);
  std::vector<std::unique_ptr<TensorEntry>> batch;
  queue.NewEntries(2, &batch);
  ASSERT_EQ(batch.size(), 2u);
  int renewed = 0;
  for (auto& b : batch) {
    if (!b->work) continue;
    ++renewed;
    EXPECT_EQ(b->work.get(), alone_state);
    EXPECT_FALSE(b->work->IsCompleted());
  }
  EXPECT_EQ(renewed, 1);
  EXPECT_TRUE(handle->IsCompleted());
}

TEST_F(QueueTest, EntriesWithoutADeadlineGetTheTakesAndExpireByIt) {
  const absl::Time now = absl::Now();
  std::vector<float> caller(4, 1.0f);
  auto a = Entry("a");
  a->input = a->output = TensorView(caller.data(), DataType::kFloat32, {4});
  std::shared_ptr<internal::WorkState> work = a->work;
  ASSERT_TRUE(queue.Add(std::move(a)).ok());
  // Not taken yet: no deadline, nothing expires.
  EXPECT_EQ(queue.ExpireLocal(now + absl::Hours(2), absl::Seconds(5)),
            absl::InfiniteFuture());
  EXPECT_FALSE(work->IsCompleted());
  ASSERT_EQ(NewNames(queue, now + absl::Hours(3)).size(), 1u);
  EXPECT_EQ(queue.ExpireLocal(now + absl::Hours(2), absl::Seconds(5)),
            now + absl::Hours(3));
  EXPECT_FALSE(work->IsCompleted());
  queue.ExpireLocal(now + absl::Hours(3), absl::Seconds(5));
  ASSERT_TRUE(work->IsCompleted());
  EXPECT_EQ(work->status().code(), absl::StatusCode::kDeadlineExceeded);
  // An entry that came with its own deadline keeps it.
  auto b = Entry("b", 0, now + absl::Hours(1));
  TensorEntry* raw = b.get();
  ASSERT_TRUE(queue.Add(std::move(b)).ok());
  ASSERT_EQ(NewNames(queue, now + absl::Hours(9)).size(), 1u);
  EXPECT_EQ(raw->deadline, now + absl::Hours(1));
}

// Note [Request timeouts]: a request's own timeout sets its deadline at the
// take, and its error says which timeout ran out.
TEST_F(QueueTest, ARequestsOwnTimeoutSetsItsDeadlineAndIsNamed) {
  const absl::Time now = absl::Now();
  std::vector<float> buffer(8, 1.0f);
  std::shared_ptr<internal::WorkState> works[2];
  TensorEntry* raw[2];
  for (int i = 0; i < 2; ++i) {
    auto e = Entry(i == 0 ? "own" : "job's");
    e->input = e->output =
        TensorView(buffer.data() + 4 * i, DataType::kFloat32, {4});
    if (i == 0) e->request.set_timeout_us(3000000);
    works[i] = e->work;
    raw[i] = e.get();
    ASSERT_TRUE(queue.Add(std::move(e)).ok());
  }
  queue.TakeNewRequests(now, absl::Seconds(10), [](const wire::Request&) {});
  EXPECT_EQ(raw[0]->deadline, now + absl::Seconds(3));
  EXPECT_EQ(raw[1]->deadline, now + absl::Seconds(10));
  EXPECT_EQ(queue.ExpireLocal(now + absl::Seconds(3), absl::Seconds(10)),
            now + absl::Seconds(10));
  ASSERT_TRUE(works[0]->IsCompleted());
  EXPECT_FALSE(works[1]->IsCompleted());
  EXPECT_EQ(works[0]->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(works[0]->status().message().find(
                "\"own\": no response from the coordinator within 3 s (the "
                "request's timeout)"),
            std::string::npos)
      << works[0]->status();
  queue.ExpireLocal(now + absl::Seconds(10), absl::Seconds(10));
  ASSERT_TRUE(works[1]->IsCompleted());
  EXPECT_NE(works[1]->status().message().find("within 10 s (KOLO_OP_TIMEOUT)"),
            std::string::npos)
      << works[1]->status();
}

TEST_F(QueueTest, KeepsAtMostTheCapOfFreeEntries) {
  std::vector<std::unique_ptr<TensorEntry>> done;
  for (size_t i = 0; i < TensorQueue::kMaxFreeEntries + 10; ++i) {
    done.push_back(std::make_unique<TensorEntry>());
  }
  queue.Recycle(&done);
  EXPECT_EQ(queue.free_entries(), TensorQueue::kMaxFreeEntries);
}

}  // namespace
}  // namespace kolo
