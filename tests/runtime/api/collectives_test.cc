// Multi-rank tests: N Runtimes as threads of one process, real loopback TCP
// for the control plane and gloo, over every transport (testing::Setup) at
// world sizes 1..8, every dtype and op,
// element counts 0, 1, odd and several MB, fusion, mismatches.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/local_job.h"
#include "tests/testing/values.h"

namespace kolo {
namespace {

using testing::Buffer;
using testing::OnEachRank;

class Collectives : public ::testing::TestWithParam<testing::Setup> {
 protected:
  int size() const { return GetParam().size; }
};

// Input element i of `rank` for `op`: small integers, so that every dtype
// represents every sum and product exactly.
double InputValue(ReduceOp op, DataType dtype, int rank, size_t i) {
  switch (op) {
    case ReduceOp::kProduct:
      return 1 + ((rank + i) % 2);
    case ReduceOp::kMin:
    case ReduceOp::kMax: {
      double v = static_cast<double>((rank * 7 + i) % 5);
      return dtype == DataType::kUint8 ? v : v - 2;
    }
    default:
      return (rank + 1) + static_cast<double>(i % 3);
  }
}

double Expected(ReduceOp op, DataType dtype, int size, size_t i) {
  double acc = InputValue(op, dtype, 0, i);
  for (int r = 1; r < size; ++r) {
    double v = InputValue(op, dtype, r, i);
    switch (op) {
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      default:
        acc += v;
    }
  }
  if (op != ReduceOp::kAverage) return acc;
  // Integers as Horovod averages them (Note [Integer scaling]).
  return IsFloatingPoint(dtype) ? acc / size : std::trunc(acc * (1.0 / size));
}

std::vector<ReduceOp> AllOps() {
  return {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
          ReduceOp::kProduct};
}

TEST_P(Collectives, AllreduceEveryDtypeOpAndCount) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  struct Case {
    std::string name;
    DataType dtype;
    ReduceOp op;
    size_t count;
  };
  std::vector<Case> cases;
  for (DataType dtype : testing::AllDataTypes()) {
    for (ReduceOp op : AllOps()) {
      for (size_t count : {0, 1, 7, 1001}) {
        cases.push_back({absl::StrCat(DataTypeName(dtype), "/",
                                      ReduceOpName(op), "/", count),
                         dtype, op, count});
      }
    }
  }
  // results[rank][case]: raw output bytes, compared across ranks.
  std::vector<std::vector<std::vector<uint8_t>>> results(n);
  OnEachRank(n, [&](int r) {
    std::vector<Buffer> in, out;
    for (const Case& c : cases) {
      in.emplace_back(c.dtype, c.count);
      out.emplace_back(c.dtype, c.count);
      for (size_t i = 0; i < c.count; ++i) {
        in.back().set(i, InputValue(c.op, c.dtype, r, i));
      }
    }
    // A different submission order on every rank.
    std::vector<size_t> order(cases.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), std::mt19937(r * 7919 + 1));
    std::vector<Work> works(cases.size());
    for (size_t k : order) {
      const Case& c = cases[k];
      AllreduceRequest req;
      req.name = c.name;
      req.op = c.op;
      req.input =
          TensorView(in[k].data(), c.dtype, {static_cast<int64_t>(c.count)});
      req.output =
          TensorView(out[k].data(), c.dtype, {static_cast<int64_t>(c.count)});
      auto w = rts[r]->Allreduce(req);
      ASSERT_TRUE(w.ok()) << c.name << ": " << w.status();
      works[k] = *w;
    }
    for (size_t k = 0; k < cases.size(); ++k) {
      const Case& c = cases[k];
      ASSERT_TRUE(works[k].Wait(absl::Seconds(60)).ok())
          << c.name << ": " << works[k].status();
      for (size_t i = 0; i < c.count; ++i) {
        const double want = Expected(c.op, c.dtype, n, i);
        const double tol =
            c.op == ReduceOp::kAverage && IsFloatingPoint(c.dtype)
                ? (DataTypeSize(c.dtype) == 2 ? 1e-2 : 1e-6) * std::abs(want)
                : 0;
        ASSERT_NEAR(out[k].at(i), want, tol)
            << c.name << " element " << i << " on rank " << r;
      }
      results[r].push_back(out[k].bytes);
    }
  });
  for (int r = 1; r < n; ++r) {
    for (size_t k = 0; k < cases.size(); ++k) {
      EXPECT_EQ(results[r][k], results[0][k])
          << cases[k].name << ": rank " << r << " differs bitwise from rank 0";
    }
  }
  testing::ShutdownJob(rts);
}

TEST_P(Collectives, LargeAllreduceInPlaceAndScaled) {
  const int n = size();
  // A small fusion threshold splits the 12 MB tensors into separate buckets.
  auto rts = testing::StartJob(
      GetParam(), [](Options& o) { o.fusion_threshold_bytes = 4 << 20; });
  const size_t count = 3 * 1024 * 1024 + 3;  // several MB, odd
  OnEachRank(n, [&](int r) {
    std::vector<float> a(count), b(count);
    for (size_t i = 0; i < count; ++i) {
      a[i] = static_cast<float>((i % 1000) + r);
      b[i] = static_cast<float>(r + 1);
    }
    AllreduceRequest ra;
    ra.name = "big/a";
    ra.input = ra.output =
        TensorView(a.data(), DataType::kFloat32, {static_cast<int64_t>(count)});
    AllreduceRequest rb;
    rb.name = "big/b";
    rb.input = rb.output =
        TensorView(b.data(), DataType::kFloat32, {static_cast<int64_t>(count)});
    rb.prescale = 2.0;
    rb.postscale = 0.5;
    auto wa = rts[r]->Allreduce(ra);
    auto wb = rts[r]->Allreduce(rb);
    ASSERT_TRUE(wa.ok() && wb.ok());
    ASSERT_TRUE(wa->Wait(absl::Seconds(60)).ok()) << wa->status();
    ASSERT_TRUE(wb->Wait(absl::Seconds(60)).ok()) << wb->status();
    const float rank_sum = n * (n - 1) / 2.0f;
    for (size_t i = 0; i < count; i += 4099) {
      ASSERT_EQ(a[i], n * static_cast<float>(i % 1000) + rank_sum) << i;
      ASSERT_EQ(b[i], rank_sum + n) << i;
    }
    ASSERT_EQ(a[count - 1],
              n * static_cast<float>((count - 1) % 1000) + rank_sum);
  });
  testing::ShutdownJob(rts);
}

TEST_P(Collectives, BroadcastFromEveryRootEveryDtype) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  OnEachRank(n, [&](int r) {
    std::vector<Buffer> bufs;
    std::vector<std::string> names;
    std::vector<std::pair<DataType, int>> keys;
    for (DataType dtype : testing::AllDataTypes()) {
      for (int root = 0; root < n; ++root) {
        bufs.emplace_back(dtype, 5);
        for (size_t i = 0; i < 5; ++i) {
          bufs.back().set(i, r == root ? 10 * root + i : 99);
        }
        keys.push_back({dtype, root});
      }
    }
    std::vector<Work> works;
    for (size_t k = 0; k < bufs.size(); ++k) {
      BroadcastRequest req;
      req.name = absl::StrCat("bcast/", DataTypeName(keys[k].first), "/",
                              keys[k].second);
      req.root = keys[k].second;
      req.tensor = TensorView(bufs[k].data(), keys[k].first, {5});
      auto w = rts[r]->Broadcast(req);
      ASSERT_TRUE(w.ok()) << w.status();
      works.push_back(*w);
    }
    for (size_t k = 0; k < bufs.size(); ++k) {
      ASSERT_TRUE(works[k].Wait(absl::Seconds(60)).ok()) << works[k].status();
      for (size_t i = 0; i < 5; ++i) {
        ASSERT_EQ(bufs[k].at(i), 10 * keys[k].second + i);
      }
    }
  });
  testing::ShutdownJob(rts);
}

TEST_P(Collectives, AllgatherUnevenFirstDimension) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  OnEachRank(n, [&](int r) {
    // Tensor t: rank r contributes (r + t) % 3 rows of 4 int32 (rank 0 of
    // tensor 0 contributes nothing), three tensors fused in one collective.
    const int kTensors = 3;
    std::vector<std::vector<int32_t>> in(kTensors), out(kTensors);
    std::vector<Work> works;
    for (int t = 0; t < kTensors; ++t) {
      const int rows = (r + t) % 3;
      for (int i = 0; i < rows * 4; ++i)
        in[t].push_back(1000 * r + 100 * t + i);
      AllgatherRequest req;
      req.name = absl::StrCat("gather/", t);
      req.input = TensorView(in[t].data(), DataType::kInt32, {rows, 4});
      auto* target = &out[t];
      req.allocator =
          [target](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
        EXPECT_EQ(shape.size(), 2u);
        EXPECT_EQ(shape[1], 4);
        target->resize(shape[0] * shape[1]);
        return static_cast<void*>(target->data());
      };
      auto w = rts[r]->Allgather(req);
      ASSERT_TRUE(w.ok()) << w.status();
      works.push_back(*w);
    }
    for (int t = 0; t < kTensors; ++t) {
      ASSERT_TRUE(works[t].Wait(absl::Seconds(60)).ok()) << works[t].status();
      std::vector<int32_t> want;
      std::vector<int64_t> splits;
      for (int k = 0; k < n; ++k) {
        const int rows = (k + t) % 3;
        splits.push_back(rows);
        for (int i = 0; i < rows * 4; ++i)
          want.push_back(1000 * k + 100 * t + i);
      }
      EXPECT_EQ(out[t], want) << "tensor " << t << " on rank " << r;
      EXPECT_EQ(works[t].received_splits(), splits);
    }
  });
  testing::ShutdownJob(rts);
}

TEST_P(Collectives, AnAllocatorThatThrowsFailsItsCollectiveAndTheJobGoesOn) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  OnEachRank(n, [&](int r) {
    const bool thrower = r == n - 1;
    std::vector<float> in = {static_cast<float>(r), 1.0f}, out;
    AllgatherRequest req;
    req.name = "thrown";
    req.input = TensorView(in.data(), DataType::kFloat32, {2});
    req.allocator =
        [&](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
      if (thrower) throw std::runtime_error("no room for the gather");
      out.resize(shape[0]);
      return static_cast<void*>(out.data());
    };
    auto w = rts[r]->Allgather(req);
    ASSERT_TRUE(w.ok()) << w.status();
    const absl::Status s = w->Wait(absl::Seconds(60));
    if (thrower) {
      EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
      EXPECT_NE(s.message().find("allgather \"thrown\": output allocator "
                                 "failed: it threw: no room for the gather"),
                std::string::npos)
          << s;
    } else {
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(out.size(), 2u * n);
      for (int k = 0; k < n; ++k) EXPECT_EQ(out[2 * k], k) << "rank " << r;
    }
    // The job goes on: a blocking allreduce on every rank.
    float x = 1.0f;
    AllreduceRequest after;
    after.name = "after";
    after.input = after.output = TensorView(&x, DataType::kFloat32, {1});
    BlockingResult done = rts[r]->AllreduceAndWait(after, absl::Seconds(60));
    ASSERT_TRUE(done.status.ok()) << done.status;
    EXPECT_EQ(x, n);
  });
  testing::ShutdownJob(rts);
}

// Horovod's integer scaling (Note [Integer scaling] in ops/cpu/reduce.cc):
// each scale in double, truncated toward zero and clamped to the type.
double HorovodScaled(DataType dtype, double v, double factor) {
  const double x = v * factor;
  const double low = dtype == DataType::kUint8   ? 0
                     : dtype == DataType::kInt8  ? -128
                     : dtype == DataType::kInt16 ? -32768
                                                 : -1e300;
  const double high = dtype == DataType::kUint8   ? 255
                      : dtype == DataType::kInt8  ? 127
                      : dtype == DataType::kInt16 ? 32767
                                                  : 1e300;
  return std::min(high, std::max(low, std::trunc(x)));
}

// Averages and scale factors of every integer dtype give Horovod's results
// (2 and 3 average to 2, -3 and -2 to -2), in allreduce and reducescatter,
// bitwise alike on every rank.
TEST_P(Collectives, IntegerAveragesAndScaleFactorsAsHorovod) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  struct Case {
    ReduceOp op;
    double prescale, postscale;
  };
  const Case cases[] = {{ReduceOp::kAverage, 1.0, 1.0},
                        {ReduceOp::kAverage, 0.5, 3.0},
                        {ReduceOp::kSum, 1.0, 0.4},
                        {ReduceOp::kSum, 1.7, 1.0},
                        {ReduceOp::kSum, 1.0, 300.0}};  // clamps small types
  const DataType dtypes[] = {DataType::kUint8, DataType::kInt8,
                             DataType::kInt16, DataType::kInt32,
                             DataType::kInt64};
  constexpr size_t kCount = 6;
  // Rank r's element i, in [-3, 3] so that sums of 8 ranks stay in int8's
  // range before scaling; uint8 gets no negative values.
  auto input = [](DataType dtype, int r, size_t i) {
    const double v = static_cast<double>((r + 2 * i) % 7) - 3;
    return dtype == DataType::kUint8 ? std::abs(v) : v;
  };
  std::vector<std::vector<std::vector<uint8_t>>> results(n);
  OnEachRank(n, [&](int r) {
    for (DataType dtype : dtypes) {
      for (size_t c = 0; c < std::size(cases); ++c) {
        const Case& k = cases[c];
        Buffer in(dtype, kCount), out(dtype, kCount);
        for (size_t i = 0; i < kCount; ++i) in.set(i, input(dtype, r, i));
        AllreduceRequest req;
        req.name = absl::StrCat("int/", DataTypeName(dtype), "/", c);
        req.op = k.op;
        req.prescale = k.prescale;
        req.postscale = k.postscale;
        req.input = TensorView(in.data(), dtype, {kCount});
        req.output = TensorView(out.data(), dtype, {kCount});
        auto w = rts[r]->Allreduce(req);
        ASSERT_TRUE(w.ok()) << req.name << ": " << w.status();
        ASSERT_TRUE(w->Wait(absl::Seconds(60)).ok()) << w->status();
        const double post =
            k.op == ReduceOp::kAverage ? k.postscale / n : k.postscale;
        for (size_t i = 0; i < kCount; ++i) {
          double sum = 0;
          for (int q = 0; q < n; ++q) {
            const double x = input(dtype, q, i);
            sum += k.prescale == 1.0 ? x : HorovodScaled(dtype, x, k.prescale);
          }
          ASSERT_EQ(out.at(i),
                    post == 1.0 ? sum : HorovodScaled(dtype, sum, post))
              << req.name << " element " << i << " on rank " << r;
        }
        results[r].push_back(out.bytes);

        // Reducescatter: rank r's share of the rows, averaged alike.
        const std::vector<int64_t> shape = {static_cast<int64_t>(n), 2};
        Buffer rs_in(dtype, 2 * n), rs_out(dtype, 2);
        for (int i = 0; i < 2 * n; ++i) rs_in.set(i, input(dtype, r, i));
        ReducescatterRequest rs;
        rs.name = absl::StrCat("int/rs/", DataTypeName(dtype), "/", c);
        rs.op = k.op;
        rs.prescale = k.prescale;
        rs.postscale = k.postscale;
        rs.input = TensorView(rs_in.data(), dtype, shape);
        rs.output = TensorView(rs_out.data(), dtype, {1, 2});
        auto rw = rts[r]->Reducescatter(rs);
        ASSERT_TRUE(rw.ok()) << rs.name << ": " << rw.status();
        ASSERT_TRUE(rw->Wait(absl::Seconds(60)).ok()) << rw->status();
        for (size_t j = 0; j < 2; ++j) {
          double sum = 0;
          for (int q = 0; q < n; ++q) {
            const double x = input(dtype, q, 2 * r + j);
            sum += k.prescale == 1.0 ? x : HorovodScaled(dtype, x, k.prescale);
          }
          ASSERT_EQ(rs_out.at(j),
                    post == 1.0 ? sum : HorovodScaled(dtype, sum, post))
              << rs.name << " element " << j << " on rank " << r;
        }
      }
    }
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(results[r], results[0]);
  testing::ShutdownJob(rts);
}

// A broadcast's root is a rank of the job; one outside the set fails on
// every rank, naming the set's ranks.
TEST_P(Collectives, BroadcastRootOutsideTheSetFailsOnEveryRank) {
  const int n = size();
  auto rts = testing::StartJob(GetParam());
  OnEachRank(n, [&](int r) {
    int32_t ints[4] = {1, 2, 3, 4};
    BroadcastRequest root;
    root.name = "bad/root";
    root.root = n;
    root.tensor = TensorView(ints, DataType::kInt32, {4});
    auto b = rts[r]->Broadcast(root);
    ASSERT_TRUE(b.ok()) << b.status();
    const absl::Status s = b->Wait(absl::Seconds(60));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(
                  absl::StrCat("broadcast \"bad/root\": root rank ", n,
                               " is not a member of the process set (ranks 0")),
              std::string::npos)
        << s;
    EXPECT_EQ(ints[0], 1);
  });
  testing::ShutdownJob(rts);
}

TEST_P(Collectives, RejectsBadRequestsAtOnce) {
  auto rts = testing::StartJob(GetParam());
  int32_t ints[4] = {1, 2, 3, 4};
  AllreduceRequest bad_op;
  bad_op.name = "int/op";
  bad_op.op = static_cast<ReduceOp>(9);
  bad_op.input = bad_op.output = TensorView(ints, DataType::kInt32, {4});
  auto w = rts[0]->Allreduce(bad_op);
  ASSERT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("int/op"), std::string::npos);

  AllreduceRequest null_data;
  null_data.name = "null";
  null_data.input = null_data.output =
      TensorView(nullptr, DataType::kFloat32, {3});
  EXPECT_EQ(rts[0]->Allreduce(null_data).status().code(),
            absl::StatusCode::kInvalidArgument);
  testing::ShutdownJob(rts);
}

// Every transport: one host up to 8 ranks (5: a non-power of two above 4),
// two and three hosts of two ranks (testing::kMaxJobSize: 4 under a
// sanitizer).
INSTANTIATE_TEST_SUITE_P(Transports, Collectives,
                         ::testing::ValuesIn(testing::Setups({1, 2, 3, 5, 8},
                                                             {4, 6})),
                         testing::SetupName);

}  // namespace
}  // namespace kolo
