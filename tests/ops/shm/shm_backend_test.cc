// The shm backend directly, N ranks as threads: every dtype and op, world
// sizes 1-4, element counts 0, 1, odd and several MB (chunked), broadcast
// from every root, uneven allgatherv and alltoallv, bitwise-identical
// results, Close() and timeouts ending waits, and no /dev/shm leftovers.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ops/cpu/reduce.h"
#include "tests/ops/shm/shm_group.h"
#include "tests/testing/values.h"

namespace kolo {
namespace shm {
namespace {

using ::kolo::testing::AllDataTypes;
using ::kolo::testing::GetValue;
using ::kolo::testing::SetValue;
using testing::CreateGroup;
using ::testing::HasSubstr;
using testing::OnEachRank;
using testing::SegmentStillNamed;
using Bytes = std::vector<uint8_t>;

// Small chunks, so that a few KB already take several pipeline stages and
// every path (small, pipelined, multi-stage) runs in little time.
ShmOptions TinyChunks() {
  ShmOptions o;
  o.chunk_bytes = 4096;
  o.small_allreduce_bytes = 256;
  return o;
}

// Small integers, so that every dtype holds every sum and product exactly
// (products of four ranks stay <= 81 < int8's 127).
double InputValue(ReduceOp op, DataType dtype, int rank, size_t i) {
  const double v = 1 + static_cast<double>((i * 7 + rank * 3) % 3);
  if ((op == ReduceOp::kMin || op == ReduceOp::kMax) &&
      dtype != DataType::kUint8) {
    return v - 2;  // negative values too
  }
  return v;
}

double Expected(ReduceOp op, DataType dtype, int size, size_t i) {
  double acc = InputValue(op, dtype, 0, i);
  for (int r = 1; r < size; ++r) {
    const double v = InputValue(op, dtype, r, i);
    switch (op) {
      case ReduceOp::kSum:
        acc += v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      default:
        acc *= v;
        break;
    }
  }
  return acc;
}

// What the backend promises for any input: in[0] op in[1] op ... in rank
// order; float16 and bfloat16 carried in float through every rank and
// rounded once (Note [16-bit sums rounded once] in ops/cpu/reduce.cc), other
// dtypes with ops/cpu's pairwise kernels.
Bytes RankOrderReference(const std::vector<Bytes>& inputs, DataType dtype,
                         ReduceOp op) {
  Bytes acc = inputs[0];
  const size_t count = acc.size() / DataTypeSize(dtype);
  if (dtype == DataType::kFloat16 || dtype == DataType::kBfloat16) {
    const bool half = dtype == DataType::kFloat16;
    for (size_t i = 0; i < count; ++i) {
      auto get = [&](size_t r) {
        uint16_t v;
        std::memcpy(&v, inputs[r].data() + 2 * i, 2);
        return half ? cpu::HalfToFloat(v) : cpu::Bfloat16ToFloat(v);
      };
      EXPECT_EQ(op, ReduceOp::kSum);
      float sum = get(0);
      for (size_t r = 1; r < inputs.size(); ++r) sum += get(r);
      const uint16_t bits =
          half ? cpu::FloatToHalf(sum) : cpu::FloatToBfloat16(sum);
      std::memcpy(acc.data() + 2 * i, &bits, 2);
    }
    return acc;
  }
  for (size_t r = 1; r < inputs.size(); ++r) {
    cpu::Reduce(op, dtype, acc.data(), acc.data(), inputs[r].data(), count);
  }
  return acc;
}

Bytes RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(gen());
  return b;
}

// Random finite values of a floating-point dtype.
Bytes RandomFloats(DataType dtype, size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1000.0, 1000.0);
  Bytes b(count * DataTypeSize(dtype));
  for (size_t i = 0; i < count; ++i) SetValue(dtype, b.data(), i, dist(gen));
  return b;
}

class ShmCollectives : public ::testing::TestWithParam<int> {
 protected:
  int size() const { return GetParam(); }
};

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmCollectives,
                         ::testing::Values(1, 2, 3, 4), [](const auto& info) {
                           return absl::StrCat("np", info.param);
                         });

TEST_P(ShmCollectives, AllreduceEveryDtypeOpAndCount) {
  const int n = size();
  auto group = CreateGroup(n, TinyChunks());
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                          ReduceOp::kProduct};
  // 7 and 64 bytes: small path; 4099 elements: several stages of 4 KB.
  const size_t counts[] = {0, 1, 7, 100, 4099};
  struct Case {
    DataType dtype;
    ReduceOp op;
    size_t count;
  };
  std::vector<Case> cases;
  for (DataType dtype : AllDataTypes()) {
    for (ReduceOp op : ops) {
      for (size_t count : counts) cases.push_back({dtype, op, count});
    }
  }
  // results[case][rank]
  std::vector<std::vector<Bytes>> results(cases.size(), std::vector<Bytes>(n));
  std::vector<absl::Status> status(n);
  OnEachRank(n, [&](int r) {
    for (size_t c = 0; c < cases.size() && status[r].ok(); ++c) {
      const Case& k = cases[c];
      Bytes buf(k.count * DataTypeSize(k.dtype));
      for (size_t i = 0; i < k.count; ++i) {
        SetValue(k.dtype, buf.data(), i, InputValue(k.op, k.dtype, r, i));
      }
      status[r] = group[r]->Allreduce(buf.data(), k.count, k.dtype, k.op);
      results[c][r] = std::move(buf);
    }
  });
  for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    SCOPED_TRACE(absl::StrCat(DataTypeName(k.dtype), " ", ReduceOpName(k.op),
                              " count ", k.count));
    for (size_t i = 0; i < k.count; ++i) {
      ASSERT_EQ(GetValue(k.dtype, results[c][0].data(), i),
                Expected(k.op, k.dtype, n, i))
          << "element " << i;
    }
    for (int r = 1; r < n; ++r) {
      ASSERT_EQ(results[c][r], results[c][0]) << "rank " << r << " differs";
    }
  }
}

TEST_P(ShmCollectives, RandomFloatsAreBitwiseIdenticalAndInRankOrder) {
  const int n = size();
  auto group = CreateGroup(n, TinyChunks());
  const DataType dtypes[] = {DataType::kFloat16, DataType::kBfloat16,
                             DataType::kFloat32, DataType::kFloat64};
  for (DataType dtype : dtypes) {
    for (size_t count : {size_t{5}, size_t{3001}}) {
      std::vector<Bytes> inputs(n), outputs(n);
      for (int r = 0; r < n; ++r)
        inputs[r] = RandomFloats(dtype, count, 17 * r + count);
      OnEachRank(n, [&](int r) {
        outputs[r] = inputs[r];
        ASSERT_TRUE(
            group[r]
                ->Allreduce(outputs[r].data(), count, dtype, ReduceOp::kSum)
                .ok());
      });
      const Bytes want = RankOrderReference(inputs, dtype, ReduceOp::kSum);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(outputs[r], want)
            << DataTypeName(dtype) << " count " << count << " rank " << r;
      }
    }
  }
}

TEST_P(ShmCollectives, SeveralMegabytesThroughTheDefaultChunks) {
  const int n = size();
  auto group = CreateGroup(n);  // default 1 MiB chunks
  struct Case {
    DataType dtype;
    size_t count;
  };
  // 12 MB of float32 (odd count) and 3 MB of bfloat16.
  for (Case k : {Case{DataType::kFloat32, 3000001},
                 Case{DataType::kBfloat16, 1500003}}) {
    std::vector<Bytes> inputs(n), outputs(n);
    for (int r = 0; r < n; ++r)
      inputs[r] = RandomFloats(k.dtype, k.count, 3 + r);
    OnEachRank(n, [&](int r) {
      outputs[r] = inputs[r];
      ASSERT_TRUE(
          group[r]
              ->Allreduce(outputs[r].data(), k.count, k.dtype, ReduceOp::kSum)
              .ok());
    });
    const Bytes want = RankOrderReference(inputs, k.dtype, ReduceOp::kSum);
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(outputs[r] == want) << DataTypeName(k.dtype) << " rank " << r;
    }
  }
}

TEST_P(ShmCollectives, BroadcastFromEveryRoot) {
  const int n = size();
  auto group = CreateGroup(n, TinyChunks());
  // 0, 1, odd, and more than one stage (a stage is n chunks).
  const size_t sizes[] = {0, 1, 4097, size_t{4096} * n * 2 + 13};
  for (int root = 0; root < n; ++root) {
    for (size_t bytes : sizes) {
      const Bytes want = RandomBytes(bytes, root * 31 + bytes);
      std::vector<Bytes> bufs(n);
      OnEachRank(n, [&](int r) {
        bufs[r] = r == root ? want : Bytes(bytes, 0xee);
        ASSERT_TRUE(group[r]->Broadcast(bufs[r].data(), bytes, root).ok());
      });
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(bufs[r] == want)
            << "root " << root << " bytes " << bytes << " rank " << r;
      }
    }
  }
}

TEST_P(ShmCollectives, AllgathervUnevenBlocks) {
  const int n = size();
  auto group = CreateGroup(n, TinyChunks());
  // Rank 1 sends nothing; the others up to several chunks.
  const std::vector<std::vector<size_t>> layouts = {
      [n] {
        std::vector<size_t> v(n);
        for (int r = 0; r < n; ++r) v[r] = r == 1 ? 0 : 1 + r * 5003;
        return v;
      }(),
      std::vector<size_t>(n, 0),
      std::vector<size_t>(n, 1),
  };
  for (const auto& blocks : layouts) {
    size_t total = 0;
    std::vector<Bytes> inputs(n);
    for (int r = 0; r < n; ++r) {
      inputs[r] = RandomBytes(blocks[r], 100 + r);
      total += blocks[r];
    }
    Bytes want;
    for (int r = 0; r < n; ++r)
      want.insert(want.end(), inputs[r].begin(), inputs[r].end());
    std::vector<Bytes> outputs(n, Bytes(total, 0xee));
    OnEachRank(n, [&](int r) {
      ASSERT_TRUE(group[r]
                      ->Allgatherv(inputs[r].data(), outputs[r].data(), blocks)
                      .ok());
    });
    for (int r = 0; r < n; ++r) EXPECT_TRUE(outputs[r] == want) << "rank " << r;
  }
}

TEST_P(ShmCollectives, AlltoallvUnevenMatrix) {
  const int n = size();
  auto group = CreateGroup(n, TinyChunks());
  // bytes[r][k]: from rank r to rank k; zeros, odd sizes and several slots.
  auto matrix = [n](int variant) {
    std::vector<std::vector<size_t>> m(n, std::vector<size_t>(n));
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < n; ++k) {
        m[r][k] = variant == 0   ? ((r * 7 + k * 13) % 5) * 1021 + (r + k) % 2
                  : variant == 1 ? 0
                                 : (r == 0 && k == n - 1 ? 9000 : 0);
      }
    }
    return m;
  };
  for (int variant = 0; variant < 3; ++variant) {
    const auto m = matrix(variant);
    // payload[r][k]: what rank r sends rank k.
    std::vector<std::vector<Bytes>> payload(n, std::vector<Bytes>(n));
    for (int r = 0; r < n; ++r) {
      for (int k = 0; k < n; ++k)
        payload[r][k] = RandomBytes(m[r][k], r * 10 + k);
    }
    std::vector<Bytes> outputs(n);
    std::vector<Bytes> want(n);
    OnEachRank(n, [&](int r) {
      Bytes input;
      std::vector<size_t> send(n), recv(n);
      for (int k = 0; k < n; ++k) {
        input.insert(input.end(), payload[r][k].begin(), payload[r][k].end());
        send[k] = m[r][k];
        recv[k] = m[k][r];
        want[r].insert(want[r].end(), payload[k][r].begin(),
                       payload[k][r].end());
      }
      outputs[r].assign(want[r].size(), 0xee);
      ASSERT_TRUE(group[r]
                      ->Alltoallv(input.data(), send, outputs[r].data(), recv)
                      .ok());
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(outputs[r] == want[r])
          << "variant " << variant << " rank " << r;
    }
  }
}

// Collectives of every kind back to back, so that each follows each other
// kind across both buffer parities (Note [Double buffering]).
TEST_P(ShmCollectives, MixedSequenceKeepsStagesApart) {
  const int n = size();
  auto group = CreateGroup(n, TinyChunks());
  std::vector<int> failures(n, 0);
  OnEachRank(n, [&](int r) {
    std::mt19937 same_everywhere(7);
    for (int step = 0; step < 60; ++step) {
      const int kind = same_everywhere() % 3;
      const size_t count = same_everywhere() % 3000;
      if (kind == 0) {
        std::vector<int32_t> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i + r);
        if (!group[r]
                 ->Allreduce(v.data(), count, DataType::kInt32, ReduceOp::kSum)
                 .ok()) {
          ++failures[r];
          continue;
        }
        for (size_t i = 0; i < count; ++i) {
          if (v[i] != static_cast<int32_t>(n * i + n * (n - 1) / 2)) {
            ++failures[r];
            break;
          }
        }
      } else if (kind == 1) {
        const int root = step % n;
        std::vector<int32_t> v(count, r == root ? step : -1);
        if (!group[r]->Broadcast(v.data(), count * 4, root).ok() ||
            std::count(v.begin(), v.end(), step) != static_cast<long>(count)) {
          ++failures[r];
        }
      } else {
        std::vector<size_t> blocks(n, count);
        Bytes in(count, static_cast<uint8_t>(r + step)), out(count * n);
        if (!group[r]->Allgatherv(in.data(), out.data(), blocks).ok()) {
          ++failures[r];
          continue;
        }
        for (int k = 0; k < n; ++k) {
          if (std::count(out.begin() + k * count, out.begin() + (k + 1) * count,
                         static_cast<uint8_t>(k + step)) !=
              static_cast<long>(count)) {
            ++failures[r];
          }
        }
      }
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[r], 0) << "rank " << r;
}

TEST(ShmBackend, CombineAndScaleUseTheCpuKernels) {
  auto group = CreateGroup(1);
  std::vector<uint16_t> a = {cpu::FloatToHalf(1.5f), cpu::FloatToHalf(-2.0f)};
  std::vector<uint16_t> b = {cpu::FloatToHalf(0.25f), cpu::FloatToHalf(3.0f)};
  group[0]->Combine(a.data(), b.data(), 2, DataType::kFloat16, ReduceOp::kMax);
  EXPECT_EQ(cpu::HalfToFloat(a[0]), 1.5f);
  EXPECT_EQ(cpu::HalfToFloat(a[1]), 3.0f);
  group[0]->Scale(a.data(), 2, DataType::kFloat16, 0.5);
  EXPECT_EQ(cpu::HalfToFloat(a[0]), 0.75f);
  EXPECT_EQ(cpu::HalfToFloat(a[1]), 1.5f);
}

TEST(ShmBackend, NoSegmentNameOutlivesCreation) {
  auto store = NewInMemoryStore();
  auto group = CreateGroup(3, {}, absl::Seconds(30), store);
  ASSERT_TRUE(group[0]);
  EXPECT_FALSE(SegmentStillNamed(*store));
  // The mapping itself still works.
  std::vector<float> v[3] = {{1}, {2}, {3}};
  OnEachRank(3, [&](int r) {
    ASSERT_TRUE(
        group[r]
            ->Allreduce(v[r].data(), 1, DataType::kFloat32, ReduceOp::kSum)
            .ok());
  });
  EXPECT_EQ(v[2][0], 6.0f);
}

// A sleeping waiter is woken by the last rank to arrive.
TEST(ShmBackend, SleepingWaiterIsWoken) {
  ShmOptions options;
  options.spin = absl::ZeroDuration();
  auto group = CreateGroup(2, options);
  float a = 1, b = 2;
  std::thread rank0([&] {
    EXPECT_TRUE(
        group[0]->Allreduce(&a, 1, DataType::kFloat32, ReduceOp::kSum).ok());
  });
  // Arrive only once rank 0 sleeps in the kernel.
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (group[0]->futex_sleeps() == 0 &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
  EXPECT_GE(group[0]->futex_sleeps(), 1u);
  EXPECT_TRUE(
      group[1]->Allreduce(&b, 1, DataType::kFloat32, ReduceOp::kSum).ok());
  rank0.join();
  EXPECT_EQ(a, 3.0f);
  EXPECT_EQ(b, 3.0f);
}

// Waits until `backend` sleeps in the kernel (it is then surely waiting).
void AwaitSleeping(const ShmBackend& backend) {
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (backend.futex_sleeps() == 0 &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::yield();
  }
  ASSERT_GE(backend.futex_sleeps(), 1u);
}

TEST(ShmBackend, CloseUnblocksAWaitingRankAtOnce) {
  // A long op timeout: only Close() can end the wait in time.
  auto group = CreateGroup(2, {}, absl::Seconds(120));
  float v = 1;
  absl::Status waited;
  std::chrono::steady_clock::time_point returned;
  std::thread rank0([&] {
    waited = group[0]->Allreduce(&v, 1, DataType::kFloat32, ReduceOp::kSum);
    returned = std::chrono::steady_clock::now();
  });
  AwaitSleeping(*group[0]);
  const auto closed = std::chrono::steady_clock::now();
  group[0]->Close();  // from another thread, as the runtime does
  rank0.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("closed on this rank"));
  std::printf(
      "Close() to return: %.3f ms\n",
      std::chrono::duration<double, std::milli>(returned - closed).count());
  // The peer's next collective fails at once, naming the rank that left.
  absl::Status peer =
      group[1]->Allreduce(&v, 1, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(peer.code(), absl::StatusCode::kUnavailable) << peer;
  EXPECT_THAT(std::string(peer.message()), HasSubstr("rank 0"));
}

TEST(ShmBackend, ClosingAPeerUnblocksAWaitingRank) {
  auto group = CreateGroup(3, {}, absl::Seconds(120));
  double v = 1;
  absl::Status waited;
  std::thread rank0([&] {
    waited = group[0]->Allreduce(&v, 1, DataType::kFloat64, ReduceOp::kSum);
  });
  AwaitSleeping(*group[0]);
  // Rank 2's runtime lost a peer and closes its backend; rank 0's runtime
  // never does (Note [Naming the lost rank]: rank 0 waits briefly for that).
  group[2]->Close();
  rank0.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_THAT(std::string(waited.message()),
              HasSubstr("rank 2 of the set closed"));
}

// Usually every runtime closes its backend: a rank woken by a peer's Close()
// returns as soon as its own Close() comes.
TEST(ShmBackend, OwnCloseAfterAPeersCloseEndsTheWait) {
  auto group = CreateGroup(2, {}, absl::Seconds(120));
  double v = 1;
  absl::Status waited;
  std::thread rank0([&] {
    waited = group[0]->Allreduce(&v, 1, DataType::kFloat64, ReduceOp::kSum);
  });
  AwaitSleeping(*group[0]);
  group[1]->Close();
  group[0]->Close();
  rank0.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kUnavailable) << waited;
  EXPECT_THAT(std::string(waited.message()), HasSubstr("closed on this rank"));
}

TEST(ShmBackend, PeerThatNeverArrivesTimesOutNamingIt) {
  const absl::Duration timeout = absl::Milliseconds(300);
  auto group = CreateGroup(3, {}, timeout);
  std::vector<absl::Status> status(2);
  std::vector<double> elapsed_ms(2);
  OnEachRank(2, [&](int r) {
    std::vector<float> v(1000, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    status[r] = group[r]->Allreduce(v.data(), v.size(), DataType::kFloat32,
                                    ReduceOp::kSum);
    elapsed_ms[r] = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  });
  for (int r = 0; r < 2; ++r) {
    std::printf("rank %d: %.1f ms: %s\n", r, elapsed_ms[r],
                status[r].ToString().c_str());
    // Whichever rank gives up first, both report the missing rank.
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded)
        << status[r];
    EXPECT_THAT(
        std::string(status[r].message()),
        HasSubstr("rank 2 of the set did not arrive within the op timeout"));
  }
  // The promised lower bound: nobody gives up before the op timeout.
  EXPECT_GE(std::max(elapsed_ms[0], elapsed_ms[1]),
            absl::ToDoubleMilliseconds(timeout));
  // The latecomer finds the collective abandoned instead of waiting.
  float late = 1;
  absl::Status s =
      group[2]->Allreduce(&late, 1, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

TEST(ShmBackend, FailsAlikeOnEveryRankWhenSharedMemoryIsShort) {
  ShmOptions huge;
  huge.chunk_bytes = size_t{1} << 40;  // 6 TiB for 2 ranks: more than /dev/shm
  auto store = NewInMemoryStore();
  auto created = testing::TryCreateGroup(2, huge, store);
  ASSERT_FALSE(created[0].ok());
  ASSERT_FALSE(created[1].ok());
  EXPECT_EQ(created[0].status(), created[1].status());
  EXPECT_EQ(created[0].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(created[0].status().message()),
              HasSubstr("/dev/shm has"));
  EXPECT_FALSE(SegmentStillNamed(*store));
}

TEST(ShmBackend, RefusesRanksOnSeveralHosts) {
  BackendContext c =
      testing::ContextFor(0, 2, NewInMemoryStore(), absl::Seconds(1));
  c.all_ranks_on_host = false;
  auto backend = ShmBackend::Create(c);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ShmBackend, IsRegisteredByNameOnly) {
  BackendContext c =
      testing::ContextFor(0, 1, NewInMemoryStore(), absl::Seconds(1));
  auto shm = BackendRegistry::Get().Create(DeviceType::kCpu, "shm", c);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_STREQ((*shm)->name(), "shm");
  // Create(device, context) keeps returning the default backend (gloo, linked
  // in through //:kolo here), never shm.
  auto fallback = BackendRegistry::Get().Create(DeviceType::kCpu, c);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_STREQ((*fallback)->name(), "gloo");
  EXPECT_EQ(BackendRegistry::Get()
                .Create(DeviceType::kCpu, "nope", c)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace shm
}  // namespace kolo

namespace kolo {
namespace shm {
namespace {

// AllreducePieces (Note [Fusion without a buffer] in runtime/loop/executor.cc):
// the same bits as packing the pieces into one buffer and running
// Allreduce, for pieces of every size (0 included) cut anywhere across
// stage and share boundaries, in place or not, also when one rank packs
// and calls Allreduce instead; not offered (Unimplemented), alike on every
// rank, for lists small enough for one stage. With tiny chunks the pieces
// cross many stages; with the default ones (pieces 41 times larger) a
// rank's share of a piece spans many reduction blocks and ends inside one
// (Note [Reducing in blocks] in ops/shm/shm_backend.cc).
TEST_P(ShmCollectives, AllreducePiecesEqualsPackedAllreduce) {
  const int n = size();
  struct Layout {
    ShmOptions options;
    size_t scale;
  };
  for (const Layout& layout :
       {Layout{TinyChunks(), 1}, Layout{ShmOptions(), 41}}) {
    auto group = CreateGroup(n, layout.options);
    for (DataType dtype :
         {DataType::kFloat16, DataType::kFloat32, DataType::kFloat64}) {
      SCOPED_TRACE(
          absl::StrCat("scale ", layout.scale, ", ", DataTypeName(dtype)));
      const size_t elem = DataTypeSize(dtype);
      // Piece sizes in elements (tiny chunks: ~5 stages of 4 KB in all), cut
      // unevenly.
      std::vector<size_t> counts = {0, 1, 700, 0, 1500, 3, 2048, 999, 0, 77};
      for (size_t& c : counts) c *= layout.scale;
      size_t total = 0;
      for (size_t c : counts) total += c;
      std::vector<Bytes> packed_in(n), want(n), got(n);
      for (int r = 0; r < n; ++r)
        packed_in[r] = RandomFloats(dtype, total, 31 * r + 7);
      std::vector<absl::Status> status(n);
      OnEachRank(n, [&](int r) {
        want[r] = packed_in[r];
        status[r] =
            group[r]->Allreduce(want[r].data(), total, dtype, ReduceOp::kSum);
      });
      for (int r = 0; r < n; ++r) ASSERT_TRUE(status[r].ok()) << status[r];
      OnEachRank(n, [&](int r) {
        // Odd pieces in place, even pieces into separate outputs.
        std::vector<Bytes> inputs, outputs;
        std::vector<FusedPiece> pieces;
        size_t at = 0;
        for (size_t i = 0; i < counts.size(); ++i) {
          inputs.emplace_back(packed_in[r].begin() + at * elem,
                              packed_in[r].begin() + (at + counts[i]) * elem);
          outputs.emplace_back(counts[i] * elem, 0xee);
          at += counts[i];
        }
        for (size_t i = 0; i < counts.size(); ++i) {
          uint8_t* out = i % 2 ? inputs[i].data() : outputs[i].data();
          pieces.push_back({inputs[i].data(), out, counts[i]});
        }
        EXPECT_TRUE(group[r]->SupportsAllreducePieces(total, dtype));
        if (r == 0 && n > 1) {
          // Ranks may mix the two paths (one rank may have to pack).
          Bytes packed = packed_in[r];
          status[r] =
              group[r]->Allreduce(packed.data(), total, dtype, ReduceOp::kSum);
          at = 0;
          for (size_t i = 0; i < counts.size(); ++i) {
            uint8_t* out = i % 2 ? inputs[i].data() : outputs[i].data();
            if (counts[i]) {  // empty pieces have no memory
              std::memcpy(out, packed.data() + at * elem, counts[i] * elem);
            }
            at += counts[i];
          }
        } else {
          status[r] =
              group[r]->AllreducePieces(pieces, total, dtype, ReduceOp::kSum);
        }
        for (size_t i = 0; i < counts.size(); ++i) {
          const Bytes& out = i % 2 ? inputs[i] : outputs[i];
          got[r].insert(got[r].end(), out.begin(), out.end());
          if (i % 2 == 0) {  // inputs of out-of-place pieces stay untouched
            at = 0;
            for (size_t k = 0; k < i; ++k) at += counts[k];
            EXPECT_TRUE(std::equal(inputs[i].begin(), inputs[i].end(),
                                   packed_in[r].begin() + at * elem));
          }
        }
      });
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(status[r].ok()) << status[r];
        EXPECT_EQ(got[r], want[r]) << DataTypeName(dtype) << " rank " << r;
      }
      // Small: every rank declines, nothing is exchanged, and the group is
      // still in step for the next collective.
      OnEachRank(n, [&](int r) {
        Bytes a(8 * elem), b(8 * elem);
        std::vector<FusedPiece> small = {{a.data(), a.data(), 8},
                                         {b.data(), b.data(), 8}};
        EXPECT_EQ(group[r]->SupportsAllreducePieces(16, dtype), n == 1);
        status[r] = group[r]->AllreducePieces(small, 16, dtype, ReduceOp::kSum);
      });
      for (int r = 0; r < n; ++r) {
        if (n == 1) {
          EXPECT_TRUE(status[r].ok());
        } else {
          EXPECT_TRUE(absl::IsUnimplemented(status[r])) << status[r];
        }
      }
    }
  }
}

}  // namespace
}  // namespace shm
}  // namespace kolo
