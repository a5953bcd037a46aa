// The shm+gloo backend: layouts, every dtype and op of allreduce over
// several "hosts" (threads of this process with distinct host names; each
// host's ranks really share a segment, the leaders really talk gloo over
// loopback TCP), broadcast from every root, allgatherv and alltoallv,
// bitwise-identical results; and the runtime choosing it for a set that
// spans hosts.
#include "ops/hierarchical/hierarchical_backend.h"

#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "tests/testing/local_job.h"
#include "tests/testing/values.h"

namespace kolo {
namespace hierarchical {
namespace {

using ::kolo::testing::GetValue;
using ::kolo::testing::OnEachRank;
using ::kolo::testing::SetValue;
using Bytes = std::vector<uint8_t>;

TEST(LayoutTest, HostsInOrderOfFirstAppearance) {
  const std::vector<std::string> hosts = {"b", "a", "b", "a", "a", "c"};
  Layout l = MakeLayout(hosts, 4);
  EXPECT_EQ(l.num_hosts, 3);
  EXPECT_EQ(l.host_of, (std::vector<int>{0, 1, 0, 1, 1, 2}));
  EXPECT_EQ(l.local_of, (std::vector<int>{0, 0, 1, 1, 2, 0}));
  EXPECT_EQ(l.leaders, (std::vector<int>{0, 1, 5}));
  EXPECT_EQ(l.host, 1);
  EXPECT_EQ(l.local_rank, 2);
  EXPECT_EQ(l.local_size, 3);
}

TEST(LayoutTest, WorthwhileOnlyAcrossHostsWithSharedHosts) {
  EXPECT_FALSE(Worthwhile({"a", "a", "a"}));  // one host: plain shm
  EXPECT_FALSE(Worthwhile({"a", "b", "c"}));  // one rank per host: gloo
  EXPECT_TRUE(Worthwhile({"a", "b", "a"}));
}

std::vector<std::unique_ptr<Backend>> CreateSet(
    const std::vector<std::string>& hosts) {
  const int size = static_cast<int>(hosts.size());
  auto store = NewInMemoryStore();
  std::vector<std::unique_ptr<Backend>> set(size);
  OnEachRank(size, [&](int r) {
    BackendContext c;
    c.rank = r;
    c.size = size;
    c.store = store;
    c.hosts = hosts;
    c.start_timeout = absl::Seconds(20);
    c.op_timeout = absl::Seconds(20);
    auto b = Create(c);
    ASSERT_TRUE(b.ok()) << "rank " << r << ": " << b.status();
    set[r] = std::move(*b);
  });
  return set;
}

// Small integers: every dtype holds every result exactly (products of six
// ranks stay <= 64 < int8's 127).
double Input(ReduceOp op, int rank, size_t i) {
  const double v = 1 + static_cast<double>((i * 5 + rank * 3) %
                                           (op == ReduceOp::kProduct ? 2 : 3));
  return op == ReduceOp::kMin || op == ReduceOp::kMax ? v * (rank % 2 ? -1 : 1)
                                                      : v;
}

class HierarchicalTest
    : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(HierarchicalTest, AllreduceEveryDtypeAndOpIsExactAndIdentical) {
  const std::vector<std::string> hosts = GetParam();
  const int size = static_cast<int>(hosts.size());
  auto set = CreateSet(hosts);
  for (DataType dtype : ::kolo::testing::AllDataTypes()) {
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      if (dtype == DataType::kUint8 &&
          (op == ReduceOp::kMin || op == ReduceOp::kMax)) {
        continue;  // negative inputs
      }
      const size_t count = 1001;
      const size_t elem = DataTypeSize(dtype);
      std::vector<Bytes> data(size, Bytes(count * elem));
      OnEachRank(size, [&](int r) {
        for (size_t i = 0; i < count; ++i) {
          SetValue(dtype, data[r].data(), i, Input(op, r, i));
        }
        absl::Status s = set[r]->Allreduce(data[r].data(), count, dtype, op);
        ASSERT_TRUE(s.ok()) << s;
      });
      for (size_t i = 0; i < count; ++i) {
        double want = Input(op, 0, i);
        for (int r = 1; r < size; ++r) {
          const double v = Input(op, r, i);
          switch (op) {
            case ReduceOp::kSum:
              want += v;
              break;
            case ReduceOp::kMin:
              want = std::min(want, v);
              break;
            case ReduceOp::kMax:
              want = std::max(want, v);
              break;
            default:
              want *= v;
              break;
          }
        }
        ASSERT_EQ(GetValue(dtype, data[0].data(), i), want)
            << DataTypeName(dtype) << " " << ReduceOpName(op) << " at " << i;
      }
      for (int r = 1; r < size; ++r) {
        ASSERT_EQ(data[r], data[0])
            << "rank " << r << " differs: " << DataTypeName(dtype) << " "
            << ReduceOpName(op);
      }
    }
  }
}

TEST_P(HierarchicalTest, BroadcastFromEveryRoot) {
  const std::vector<std::string> hosts = GetParam();
  const int size = static_cast<int>(hosts.size());
  auto set = CreateSet(hosts);
  for (int root = 0; root < size; ++root) {
    std::vector<Bytes> data(size, Bytes(3000));
    OnEachRank(size, [&](int r) {
      for (size_t i = 0; i < data[r].size(); ++i) {
        data[r][i] = static_cast<uint8_t>(i * 7 + r * 31);
      }
      absl::Status s = set[r]->Broadcast(data[r].data(), data[r].size(), root);
      ASSERT_TRUE(s.ok()) << s;
    });
    for (int r = 0; r < size; ++r) {
      for (size_t i = 0; i < data[r].size(); i += 97) {
        ASSERT_EQ(data[r][i], static_cast<uint8_t>(i * 7 + root * 31))
            << "root " << root << " rank " << r;
      }
    }
  }
}

TEST_P(HierarchicalTest, AllgathervAndAlltoallvInSetRankOrder) {
  const std::vector<std::string> hosts = GetParam();
  const int size = static_cast<int>(hosts.size());
  auto set = CreateSet(hosts);
  std::vector<size_t> bytes(size);
  size_t total = 0;
  for (int r = 0; r < size; ++r) total += bytes[r] = 3 + r;
  std::vector<Bytes> out(size, Bytes(total));
  OnEachRank(size, [&](int r) {
    Bytes in(bytes[r], static_cast<uint8_t>(r + 1));
    ASSERT_TRUE(set[r]->Allgatherv(in.data(), out[r].data(), bytes).ok());
  });
  Bytes want;
  for (int r = 0; r < size; ++r) want.insert(want.end(), bytes[r], r + 1);
  for (int r = 0; r < size; ++r) EXPECT_EQ(out[r], want) << "rank " << r;

  // Rank r sends k + 1 bytes of value 10 * r + k to rank k.
  OnEachRank(size, [&](int r) {
    std::vector<size_t> send(size), recv(size, r + 1);
    Bytes in;
    for (int k = 0; k < size; ++k) {
      send[k] = k + 1;
      in.insert(in.end(), k + 1, static_cast<uint8_t>(10 * r + k));
    }
    Bytes got((r + 1) * size);
    ASSERT_TRUE(set[r]->Alltoallv(in.data(), send, got.data(), recv).ok());
    Bytes expect;
    for (int k = 0; k < size; ++k) {
      expect.insert(expect.end(), r + 1, static_cast<uint8_t>(10 * k + r));
    }
    EXPECT_EQ(got, expect) << "rank " << r;
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, HierarchicalTest,
    ::testing::Values(
        std::vector<std::string>{"a", "a", "b", "b"},
        // Hosts interleaved in set-rank order, and a host with one rank.
        std::vector<std::string>{"a", "b", "a", "b", "b", "c"}));

// The runtime picks shm+gloo for a set spanning two "hosts" (distinct cross
// ranks) with two ranks each, and results are right.
TEST(HierarchicalRuntimeTest, ChosenForASetSpanningHosts) {
  constexpr int kSize = 4;
  ::testing::internal::CaptureStderr();
  auto rts = ::kolo::testing::StartJob(kSize, [](Options& o) {
    o.local_rank = o.rank % 2;
    o.local_size = 2;
    o.cross_rank = o.rank / 2;
    o.cross_size = 2;
    o.shm = true;
    o.log_level = LogLevel::kInfo;  // "process set 0: 4 ranks over shm+gloo"
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(log, ::testing::HasSubstr("[kolo rank 0] INFO: process set 0: 4 "
                                        "ranks over shm+gloo"));
  EXPECT_THAT(log, ::testing::HasSubstr("[kolo rank 3] INFO: process set 0: 4 "
                                        "ranks over shm+gloo"));
  OnEachRank(kSize, [&](int r) {
    std::vector<float> v(100000, float(r + 1));
    AllreduceRequest a;
    a.name = "x";
    a.input = a.output = TensorView(v.data(), DataType::kFloat32, {100000});
    ASSERT_TRUE(rts[r]->Allreduce(a)->Wait().ok());
    EXPECT_EQ(v[0], 10.0f);
    EXPECT_EQ(v[99999], 10.0f);
    std::vector<float> b(10, float(r));
    BroadcastRequest br;
    br.name = "b";
    br.tensor = TensorView(b.data(), DataType::kFloat32, {10});
    br.root = 3;
    ASSERT_TRUE(rts[r]->Broadcast(br)->Wait().ok());
    EXPECT_EQ(b[9], 3.0f);
  });
  ::kolo::testing::ShutdownJob(rts);
}

}  // namespace
}  // namespace hierarchical
}  // namespace kolo
