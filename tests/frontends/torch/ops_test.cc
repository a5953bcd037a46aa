// Collectives on at::Tensor with N ranks as threads: every dtype, scalars
// and empty tensors, out of place, in place (also non-contiguous), async
// handles, generated names, grouped allreduce, alltoall, reducescatter,
// process sets, barrier, join, the default context, and errors as
// exceptions carrying the runtime's message.
#include <atomic>
#include <future>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "kolo/torch/context.h"
#include "tests/frontends/torch/torch_job.h"

namespace kolo {
namespace torch {
namespace {

using testing::Contexts;
using ::testing::HasSubstr;
using testing::OnEachRank;
using testing::ShutdownContexts;
using testing::StartContexts;
using ::testing::StartsWith;

static_assert(std::is_base_of<std::runtime_error, Error>::value,
              "kolo::torch::Error is a std::runtime_error");

const std::vector<at::ScalarType>& AllDtypes() {
  static const auto* dtypes = new std::vector<at::ScalarType>{
      at::kByte, at::kChar,     at::kInt,   at::kLong,
      at::kHalf, at::kBFloat16, at::kFloat, at::kDouble};
  return *dtypes;
}

const std::vector<std::vector<int64_t>>& Shapes() {
  static const auto* shapes =
      new std::vector<std::vector<int64_t>>{{}, {0}, {5}, {2, 3}};
  return *shapes;
}

// Rank r's input: small integers, exact in every dtype, also summed over 3
// ranks (at most 12) and averaged over 2 (halves).
at::Tensor Input(int rank, at::IntArrayRef shape, at::ScalarType dtype) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return at::arange(n, at::kDouble)
      .remainder(3)
      .add(rank + 1)
      .reshape(shape)
      .to(dtype);
}

at::Tensor Expected(int size, ReduceOp op, at::IntArrayRef shape) {
  at::Tensor sum = at::zeros(shape, at::kDouble);
  for (int r = 0; r < size; ++r) sum += Input(r, shape, at::kDouble);
  return op == ReduceOp::kAverage ? sum / size : sum;
}

std::string Describe(at::ScalarType dtype, at::IntArrayRef shape, ReduceOp op) {
  return absl::StrCat(c10::toString(dtype), "[", absl::StrJoin(shape, ","),
                      "]/", kolo::ReduceOpName(op));
}

class TorchOps : public ::testing::TestWithParam<int> {
 protected:
  int size() const { return GetParam(); }
};

TEST_P(TorchOps, AllreduceEveryDtypeAndShape) {
  Contexts ctx = StartContexts(size());
  ASSERT_EQ(ctx.size(), size());
  OnEachRank(size(), [&](int rank) {
    struct Case {
      std::string name;
      at::Tensor input;
      at::Tensor expected;
      Handle handle;
    };
    std::vector<Case> cases;
    for (at::ScalarType dtype : AllDtypes()) {
      for (const auto& shape : Shapes()) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage}) {
          if (op == ReduceOp::kAverage && !at::isFloatingType(dtype)) continue;
          Case c;
          c.name = Describe(dtype, shape, op);
          c.input = Input(rank, shape, dtype);
          c.expected = Expected(size(), op, shape);
          c.handle = ctx[rank]->allreduce_async(
              c.input, AllreduceOptions().name(c.name).op(op));
          cases.push_back(std::move(c));
        }
      }
    }
    for (Case& c : cases) {
      at::Tensor out = c.handle.wait();
      EXPECT_TRUE(c.handle.poll()) << c.name;
      EXPECT_EQ(out.scalar_type(), c.input.scalar_type()) << c.name;
      EXPECT_EQ(out.sizes(), c.input.sizes()) << c.name;
      EXPECT_TRUE(at::equal(out.to(at::kDouble), c.expected)) << c.name;
      // Out of place: the input is untouched.
      EXPECT_TRUE(at::equal(
          c.input, Input(rank, c.input.sizes(), c.input.scalar_type())))
          << c.name;
    }
  });
  ShutdownContexts(ctx);
}

TEST_P(TorchOps, InPlaceOnNonContiguousTensorWritesThroughTheView) {
  Contexts ctx = StartContexts(size());
  OnEachRank(size(), [&](int rank) {
    at::Tensor base = Input(rank, {4, 3}, at::kFloat);
    at::Tensor view = base.t();  // [3, 4], not contiguous
    ASSERT_FALSE(view.is_contiguous());
    at::Tensor out = ctx[rank]->allreduce_(
        view, AllreduceOptions().name("transposed").op(ReduceOp::kSum));
    EXPECT_TRUE(out.is_same(view));
    at::Tensor want = Expected(size(), ReduceOp::kSum, {4, 3}).to(at::kFloat);
    EXPECT_TRUE(at::equal(base, want));

    // Broadcast in place through a strided slice: only its elements change.
    at::Tensor row = at::full({2, 6}, rank, at::kLong);
    at::Tensor every_other = row.select(0, 1).slice(0, 0, 6, 2);
    ctx[rank]->broadcast_(every_other,
                          BroadcastOptions().name("strided").root(size() - 1));
    at::Tensor expect_row = at::full({2, 6}, rank, at::kLong);
    expect_row.select(0, 1).slice(0, 0, 6, 2).fill_(size() - 1);
    EXPECT_TRUE(at::equal(row, expect_row));
  });
  ShutdownContexts(ctx);
}

// A tensor that requires grad is reduced through a detached alias (its
// contiguous copy and copy back are not recorded, a leaf is written in
// place without autograd's complaint); one that does not is used as it is.
// Either way the in-place result is the caller's own tensor.
TEST_P(TorchOps, TensorsThatRequireGradAreReducedOutsideAutograd) {
  Contexts ctx = StartContexts(size());
  OnEachRank(size(), [&](int rank) {
    const at::Tensor want =
        Expected(size(), ReduceOp::kSum, {4, 3}).to(at::kFloat);
    for (bool grad : {true, false}) {
      const std::string tag = grad ? "grad" : "plain";
      at::Tensor leaf = Input(rank, {4, 3}, at::kFloat).requires_grad_(grad);
      at::Tensor out = ctx[rank]->allreduce_(
          leaf, AllreduceOptions().name(tag + ".leaf").op(ReduceOp::kSum));
      EXPECT_TRUE(out.is_same(leaf)) << tag;
      EXPECT_EQ(leaf.requires_grad(), grad) << tag;
      EXPECT_FALSE(leaf.grad_fn()) << tag;
      EXPECT_TRUE(at::equal(leaf.detach(), want)) << tag;

      // Non-contiguous: a contiguous buffer, copied back into the leaf.
      at::Tensor base = Input(rank, {4, 3}, at::kFloat);
      at::Tensor view = base.t().requires_grad_(grad);  // [3, 4], a leaf
      ASSERT_FALSE(view.is_contiguous());
      out = ctx[rank]->allreduce_(
          view, AllreduceOptions().name(tag + ".view").op(ReduceOp::kSum));
      EXPECT_TRUE(out.is_same(view)) << tag;
      EXPECT_FALSE(view.grad_fn()) << tag;
      EXPECT_TRUE(at::equal(base, want)) << tag;

      // Out of place on a non-contiguous tensor.
      at::Tensor strided =
          Input(rank, {4, 3}, at::kFloat).t().requires_grad_(grad);
      at::Tensor strided_sum = ctx[rank]->allreduce(
          strided,
          AllreduceOptions().name(tag + ".out.view").op(ReduceOp::kSum));
      EXPECT_FALSE(strided_sum.requires_grad()) << tag;
      EXPECT_TRUE(at::equal(strided_sum, want.t())) << tag;
      EXPECT_TRUE(
          at::equal(strided.detach(), Input(rank, {4, 3}, at::kFloat).t()))
          << tag;

      // Out of place: a new tensor outside the graph, the input untouched.
      at::Tensor in = Input(rank, {4, 3}, at::kFloat).requires_grad_(grad);
      at::Tensor result = ctx[rank]->allreduce(
          in, AllreduceOptions().name(tag + ".out").op(ReduceOp::kSum));
      EXPECT_FALSE(result.requires_grad()) << tag;
      EXPECT_FALSE(result.is_same(in)) << tag;
      EXPECT_TRUE(at::equal(result, want)) << tag;
      EXPECT_TRUE(at::equal(in.detach(), Input(rank, {4, 3}, at::kFloat)))
          << tag;
    }
  });
  ShutdownContexts(ctx);
}

TEST_P(TorchOps, AllgatherConcatenatesUnevenFirstDimensions) {
  Contexts ctx = StartContexts(size());
  OnEachRank(size(), [&](int rank) {
    for (at::ScalarType dtype : {at::kLong, at::kHalf, at::kBFloat16}) {
      // Rank r contributes r rows (rank 0 none) of value r.
      at::Tensor mine = at::full({rank, 2}, rank, dtype);
      at::Tensor all = ctx[rank]->allgather(
          mine, AllgatherOptions().name(c10::toString(dtype)));
      std::vector<at::Tensor> rows;
      for (int r = 0; r < size(); ++r)
        rows.push_back(at::full({r, 2}, r, dtype));
      EXPECT_EQ(all.scalar_type(), dtype);
      EXPECT_TRUE(at::equal(all, at::cat(rows))) << c10::toString(dtype);
    }
  });
  ShutdownContexts(ctx);
}

TEST_P(TorchOps, BroadcastOutOfPlaceLeavesTheInputAlone) {
  Contexts ctx = StartContexts(size());
  const int root = size() - 1;
  OnEachRank(size(), [&](int rank) {
    for (at::ScalarType dtype : AllDtypes()) {
      at::Tensor mine = Input(rank, {2, 3}, dtype);
      at::Tensor out = ctx[rank]->broadcast(
          mine, BroadcastOptions().name(c10::toString(dtype)).root(root));
      EXPECT_TRUE(at::equal(out, Input(root, {2, 3}, dtype)));
      EXPECT_TRUE(at::equal(mine, Input(rank, {2, 3}, dtype)));
    }
  });
  ShutdownContexts(ctx);
}

TEST_P(TorchOps, UnnamedCollectivesMatchByCallOrder) {
  Contexts ctx = StartContexts(size());
  OnEachRank(size(), [&](int rank) {
    std::vector<Handle> handles;
    for (int i = 0; i < 3; ++i) {
      handles.push_back(
          ctx[rank]->allreduce_async(at::full({3}, i * (rank + 1), at::kInt),
                                     AllreduceOptions().op(ReduceOp::kSum)));
    }
    const int rank_sum = size() * (size() + 1) / 2;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(handles[i].name(), absl::StrCat("allreduce.noname.", i));
      EXPECT_TRUE(
          at::equal(handles[i].wait(), at::full({3}, i * rank_sum, at::kInt)));
    }
    at::Tensor b =
        ctx[rank]->broadcast_async(at::full({1}, rank, at::kInt)).wait();
    EXPECT_EQ(b.item<int>(), 0);
  });
  ShutdownContexts(ctx);
}

TEST_P(TorchOps, GroupedAllreduceInPlaceAndOutOfPlace) {
  Contexts ctx = StartContexts(size());
  OnEachRank(size(), [&](int rank) {
    const std::vector<at::Tensor> inputs = {Input(rank, {3}, at::kFloat),
                                            Input(rank, {2, 2}, at::kDouble),
                                            Input(rank, {}, at::kBFloat16)};
    std::vector<at::Tensor> outs = ctx[rank]->grouped_allreduce(
        inputs, GroupedAllreduceOptions().name("g").op(ReduceOp::kSum));
    ASSERT_EQ(outs.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(outs[i].scalar_type(), inputs[i].scalar_type());
      EXPECT_TRUE(
          at::equal(outs[i].to(at::kDouble),
                    Expected(size(), ReduceOp::kSum, inputs[i].sizes())))
          << i;
    }
    std::vector<at::Tensor> in_place = {Input(rank, {4}, at::kInt).t(),
                                        Input(rank, {3, 2}, at::kLong).t()};
    Handle h = ctx[rank]->grouped_allreduce_async_(
        in_place,
        GroupedAllreduceOptions().names({"a", "b"}).op(ReduceOp::kMax));
    std::vector<at::Tensor> results = h.wait_all();
    ASSERT_EQ(results.size(), 2u);
    EXPECT_TRUE(results[1].is_same(in_place[1]));
    EXPECT_TRUE(at::equal(in_place[0], Input(size() - 1, {4}, at::kInt)));
    EXPECT_TRUE(
        at::equal(in_place[1], Input(size() - 1, {3, 2}, at::kLong).t()));
  });
  ShutdownContexts(ctx);
}

TEST_P(TorchOps, AlltoallWithUnevenSplits) {
  Contexts ctx = StartContexts(size());
  OnEachRank(size(), [&](int rank) {
    // Rank r sends k+1 rows of value 10r+k to rank k.
    std::vector<int64_t> splits;
    std::vector<at::Tensor> parts;
    for (int k = 0; k < size(); ++k) {
      splits.push_back(k + 1);
      parts.push_back(at::full({k + 1, 2}, 10 * rank + k, at::kFloat));
    }
    Handle h = ctx[rank]->alltoall_async(
        at::cat(parts), AlltoallOptions().name("a2a").splits(splits));
    at::Tensor got = h.wait();
    std::vector<at::Tensor> want;
    for (int r = 0; r < size(); ++r) {
      want.push_back(at::full({rank + 1, 2}, 10 * r + rank, at::kFloat));
    }
    EXPECT_TRUE(at::equal(got, at::cat(want)));
    EXPECT_EQ(h.received_splits(), std::vector<int64_t>(size(), rank + 1));
  });
  ShutdownContexts(ctx);
}

TEST_P(TorchOps, ReducescatterGivesEachRankItsShare) {
  Contexts ctx = StartContexts(size());
  const int64_t rows = 2 * size() + 1;  // uneven: rank 0 gets one row more
  OnEachRank(size(), [&](int rank) {
    at::Tensor out = ctx[rank]->reducescatter(
        Input(rank, {rows, 3}, at::kFloat),
        ReducescatterOptions().name("rs").op(ReduceOp::kSum));
    const int64_t begin = rank == 0 ? 0 : 3 + 2 * (rank - 1);
    const int64_t count = rank == 0 ? 3 : 2;
    at::Tensor want = Expected(size(), ReduceOp::kSum, {rows, 3})
                          .narrow(0, begin, count)
                          .to(at::kFloat);
    EXPECT_TRUE(at::equal(out, want)) << out << want;
  });
  ShutdownContexts(ctx);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, TorchOps, ::testing::Values(1, 2, 3));

// Ranks 0 and 2 of 3 form a set: its collectives see only them (a root is a
// rank of the job, as in Horovod), while rank 1 uses the global set
// meanwhile.
TEST(TorchProcessSets, CollectivesWithinASet) {
  Contexts ctx = StartContexts(3);
  OnEachRank(3, [&](int rank) {
    const int set = ctx[rank]->add_process_set({0, 2});
    EXPECT_EQ(ctx[rank]->process_set_ranks(set), (std::vector<int>{0, 2}));
    if (rank == 1) {
      try {
        ctx[rank]->allreduce(at::ones({1}),
                             AllreduceOptions().process_set(set));
        ADD_FAILURE() << "a non-member submitted to the set";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
      }
      return;
    }
    at::Tensor sum = ctx[rank]->allreduce(
        at::full({2}, rank + 1.0),
        AllreduceOptions().name("s").op(ReduceOp::kSum).process_set(set));
    EXPECT_TRUE(at::equal(sum, at::full({2}, 4.0)));  // ranks 0 and 2: 1 + 3
    at::Tensor b = ctx[rank]->broadcast(
        at::full({1}, rank, at::kInt),
        BroadcastOptions().name("b").root(2).process_set(set));
    EXPECT_EQ(b.item<int>(), 2);  // global rank 2 is the set's rank 1
    // A root outside the set fails on every member, naming the set's ranks.
    try {
      ctx[rank]->broadcast(
          at::zeros({1}),
          BroadcastOptions().name("b1").root(1).process_set(set));
      ADD_FAILURE() << "a root outside the set was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(e.what(), ::testing::HasSubstr(
                                "root rank 1 is not a member of the process "
                                "set (ranks 0, 2)"));
    }
    at::Tensor share = ctx[rank]->reducescatter(
        at::arange(4, at::kFloat),
        ReducescatterOptions().name("r").op(ReduceOp::kSum).process_set(set));
    EXPECT_TRUE(at::equal(
        share, 2 * at::arange(4, at::kFloat).narrow(0, rank == 0 ? 0 : 2, 2)));
  });
  ShutdownContexts(ctx);
}

// Nobody leaves the barrier before everybody has arrived.
TEST(TorchBarrierAndJoin, BarrierWaitsForEveryRank) {
  Contexts ctx = StartContexts(3);
  std::atomic<int> arrived{0};
  OnEachRank(3, [&](int rank) {
    ++arrived;
    ctx[rank]->barrier();
    EXPECT_EQ(arrived.load(), 3);
  });
  ShutdownContexts(ctx);
}

// Rank 0 runs out of data first: it contributes zeros to rank 1's
// allreduce, and both learn that rank 1 joined last.
TEST(TorchBarrierAndJoin, JoinedRankContributesZeros) {
  Contexts ctx = StartContexts(2);
  OnEachRank(2, [&](int rank) {
    if (rank == 1) {
      at::Tensor t = ctx[rank]->allreduce(
          at::full({3}, 5.0),
          AllreduceOptions().name("last").op(ReduceOp::kSum));
      EXPECT_TRUE(at::equal(t, at::full({3}, 5.0)));
    }
    EXPECT_EQ(ctx[rank]->join(), 1);
  });
  ShutdownContexts(ctx);
}

// A collective cannot complete before every rank has submitted it: poll()
// stays false until then, and wait() returns once the last rank submits.
TEST(TorchAsync, PollIsFalseUntilEveryRankSubmitted) {
  Contexts ctx = StartContexts(2);
  std::promise<void> rank0_polled;
  OnEachRank(2, [&](int rank) {
    if (rank == 1) rank0_polled.get_future().wait();
    at::Tensor t = at::full({1000}, rank + 1.0, at::kFloat);
    Handle h = ctx[rank]->allreduce_async_(
        t, AllreduceOptions().name("late").op(ReduceOp::kSum));
    if (rank == 0) {
      EXPECT_FALSE(h.poll());
      rank0_polled.set_value();
    }
    EXPECT_TRUE(h.wait().is_same(t));
    EXPECT_TRUE(h.poll());
    EXPECT_TRUE(at::equal(t, at::full({1000}, 3.0, at::kFloat)));
  });
  ShutdownContexts(ctx);
}

// The memory a collective reads and writes stays alive until it completes,
// whatever the caller does to its tensor meanwhile: here rank 0 repoints
// its in-flight tensor at other memory (as `set_`, `.data =` and
// `model.to()` do) before rank 1 submits.
TEST(TorchAsync, InFlightMemoryOutlivesTheCallersTensor) {
  Contexts ctx = StartContexts(2);
  std::promise<void> rank0_repointed;
  OnEachRank(2, [&](int rank) {
    if (rank == 1) rank0_repointed.get_future().wait();
    at::Tensor t = at::full({1000}, rank + 1.0, at::kFloat);
    at::Tensor out_of_place = at::full({1000}, rank + 1.0, at::kFloat);
    const c10::Storage in_place_memory = t.storage();
    const c10::Storage input_memory = out_of_place.storage();
    Handle h = ctx[rank]->allreduce_async_(
        t, AllreduceOptions().name("repointed").op(ReduceOp::kSum));
    Handle g = ctx[rank]->allreduce_async(
        out_of_place,
        AllreduceOptions().name("repointed.input").op(ReduceOp::kSum));
    if (rank == 0) {
      EXPECT_FALSE(h.poll());  // (rank 1 has not submitted)
      t.set_(at::zeros({1000}, at::kFloat));
      out_of_place.set_(at::zeros({1000}, at::kFloat));
      // Ours, and the collective's.
      EXPECT_EQ(in_place_memory.use_count(), 2);
      EXPECT_EQ(input_memory.use_count(), 2);
      rank0_repointed.set_value();
    }
    h.wait();
    EXPECT_TRUE(at::equal(g.wait(), at::full({1000}, 3.0, at::kFloat)));
    if (rank == 0) {
      // The sum went to the memory submitted, which is ours alone now.
      const float* sum = static_cast<const float*>(in_place_memory.data());
      EXPECT_EQ(sum[0], 3.0f);
      EXPECT_EQ(sum[999], 3.0f);
      EXPECT_EQ(in_place_memory.use_count(), 1);
      EXPECT_EQ(input_memory.use_count(), 1);
      EXPECT_TRUE(at::equal(t, at::zeros({1000}, at::kFloat)));
    } else {
      EXPECT_TRUE(at::equal(t, at::full({1000}, 3.0, at::kFloat)));
    }
  });
  ShutdownContexts(ctx);
}

TEST(TorchErrors, SubmitErrorCarriesTheRuntimesMessage) {
  Contexts ctx = StartContexts(1);
  at::Tensor ints = at::ones({4}, at::kInt);
  kolo::AllreduceRequest request;
  request.name = "ints";
  request.input = request.output =
      kolo::TensorView(ints.data_ptr(), kolo::DataType::kInt32, {4});
  request.op = static_cast<ReduceOp>(9);
  absl::StatusOr<kolo::Work> direct = ctx[0]->runtime().Allreduce(request);
  ASSERT_FALSE(direct.ok());
  try {
    ctx[0]->allreduce(ints, AllreduceOptions().name("ints").op(request.op));
    ADD_FAILURE() << "an unknown reduce op did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), std::string(direct.status().message()));
    EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
  }
  ShutdownContexts(ctx);
}

TEST(TorchErrors, MismatchAcrossRanksThrowsOnEveryRank) {
  Contexts ctx = StartContexts(2);
  OnEachRank(2, [&](int rank) {
    try {
      ctx[rank]->allreduce(at::ones({rank + 2}), AllreduceOptions().name("w"));
      ADD_FAILURE() << "rank " << rank << ": no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(e.what(), StartsWith("allreduce \"w\": "));
      EXPECT_THAT(e.what(), HasSubstr("shape"));
    }
  });
  ShutdownContexts(ctx);
}

// An option's timeout reaches the runtime: a collective one rank never
// submits fails after it (not the job's op timeout), naming the rank.
TEST(TorchErrors, AnOptionsTimeoutEndsTheWaitForAMissingRank) {
  Contexts ctx = StartContexts(
      2, [](kolo::Options& o) { o.op_timeout = absl::Seconds(120); });
  try {
    ctx[0]->allreduce(at::ones({3}), AllreduceOptions().name("late").timeout(
                                         std::chrono::milliseconds(300)));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(e.what(),
                HasSubstr("allreduce \"late\": timed out after 300 ms (the "
                          "request's timeout) waiting for rank 1"));
  }
  try {
    ctx[1]->broadcast(at::ones({3}), BroadcastOptions().name("b").timeout(
                                         std::chrono::milliseconds(-1)));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("timeout -1 ms is negative"));
  }
  ShutdownContexts(ctx);
}

TEST(TorchErrors, UnsupportedTensorsAreRejectedBeforeSubmit) {
  Contexts ctx = StartContexts(1);
  auto message = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), absl::StatusCode::kInvalidArgument);
      return e.what();
    }
    return "(no error)";
  };
  // bool is moved, never reduced.
  EXPECT_THAT(message([&] {
                ctx[0]->allreduce(at::ones({2}, at::kBool),
                                  AllreduceOptions().name("flags"));
              }),
              HasSubstr("allreduce \"flags\": bool tensors are not reduced"));
  EXPECT_TRUE(at::equal(ctx[0]->broadcast(at::ones({2}, at::kBool)),
                        at::ones({2}, at::kBool)));
  EXPECT_THAT(
      message([&] { ctx[0]->broadcast(at::ones({2}, at::kComplexFloat)); }),
      HasSubstr("dtype ComplexFloat is not supported"));
  EXPECT_THAT(message([&] {
                ctx[0]->allreduce(at::eye(3).to_sparse(),
                                  AllreduceOptions().name("sparse"));
              }),
              HasSubstr("layout Sparse is not supported"));
  EXPECT_THAT(message([&] { ctx[0]->allgather(at::Tensor()); }),
              HasSubstr("undefined"));
  EXPECT_THROW(Handle().wait(), Error);
  ShutdownContexts(ctx);
}

TEST(TorchDefaultContext, InitUseShutdown) {
  ASSERT_FALSE(is_initialized());
  try {
    rank();
    ADD_FAILURE() << "rank() before init() did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(e.what(), HasSubstr("init()"));
  }
  init(kolo::testing::JobOptions(0, 1, kolo::NewInMemoryStore()));
  ASSERT_TRUE(is_initialized());
  EXPECT_EQ(rank(), 0);
  EXPECT_EQ(size(), 1);
  EXPECT_EQ(local_rank(), 0);
  EXPECT_EQ(local_size(), 1);
  at::Tensor t = at::arange(6, at::kFloat);
  EXPECT_TRUE(at::equal(allreduce(t), t));
  EXPECT_TRUE(at::equal(allgather(t), t));
  EXPECT_TRUE(at::equal(broadcast_(t.clone()), t));
  shutdown();
  EXPECT_FALSE(is_initialized());
  EXPECT_THROW(allreduce(t), Error);
}

}  // namespace
}  // namespace torch
}  // namespace kolo
