// The contract of runtime/loop/backend.h, held against every host backend the
// project builds: "gloo", "shm" (one host) and "shm+gloo" (two "hosts" of
// interleaved ranks: shared memory within each, gloo between the leaders
// and across the set), each created through the registry as the runtime
// creates it. One value-parameterized suite over (backend, world size);
// ranks are threads of this process over one in-memory store. A backend
// that does not offer an operation skips that case with the reason.
//
// What every backend promises: each collective's result on every rank,
// for world sizes 1, 2, 3, 5 and 8 and element counts 0, 1, odd and large;
// reductions (sum, min, max, product; average as the runtime does it, a
// sum and a postscale) that are bitwise identical on every rank; broadcast
// from several roots; allgatherv and alltoallv with uneven sizes, zeros
// included; Combine and Scale as the CPU kernels define them; collectives
// of every kind issued back to back; and Close() ending a collective on
// every rank long before the op timeout.
//
// Also held against "fakedev", the stand-in device backend of
// tests/testing/fake_device_backend.h (device memory that is host memory,
// completion on its own thread) over gloo, as device_path_test runs it. Not
// covered here: NCCL (tests/ops/nccl, on a GPU).
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kolo/store.h"
#include "ops/cpu/reduce.h"
#include "runtime/loop/backend.h"
#include "tests/testing/fake_device_backend.h"

namespace kolo {
namespace {

using Bytes = std::vector<uint8_t>;

// Runs body(rank) on one thread per rank and joins them. Every collective
// a body runs is bounded by the backends' op timeout.
void OnEachRank(int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (auto& t : threads) t.join();
}

// Element i of a float32, float64 or int32 buffer, as a double.
void SetValue(DataType dtype, void* base, size_t i, double v) {
  switch (dtype) {
    case DataType::kFloat32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      return;
    case DataType::kFloat64:
      static_cast<double*>(base)[i] = v;
      return;
    case DataType::kInt32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      return;
    default:
      ADD_FAILURE() << "no test values for " << DataTypeName(dtype);
  }
}
double GetValue(DataType dtype, const void* base, size_t i) {
  switch (dtype) {
    case DataType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(base)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(base)[i];
    default:
      ADD_FAILURE() << "no test values for " << DataTypeName(dtype);
      return 0;
  }
}

constexpr size_t kLarge = size_t{1} << 20;  // elements (4 MiB of float32)

struct BackendParam {
  std::string backend;  // registry name
  int size;
};

std::string ParamName(const ::testing::TestParamInfo<BackendParam>& info) {
  return absl::StrCat(absl::StrReplaceAll(info.param.backend, {{"+", "_"}}),
                      "_np", info.param.size);
}

// shm+gloo: ranks alternate between two hosts (from 3 ranks on, some host
// has several ranks, so shared memory and the leaders' gloo both run).
std::vector<std::string> HostsFor(const std::string& backend, int size) {
  std::vector<std::string> hosts(size, "host0");
  if (backend == "shm+gloo") {
    for (int r = 0; r < size; ++r) hosts[r] = absl::StrCat("host", r % 2);
  }
  return hosts;
}

class BackendContractTest : public ::testing::TestWithParam<BackendParam> {
 protected:
  static void SetUpTestSuite() {
    // As Runtime::Create does (runtime_impl.cc): gloo writes without
    // MSG_NOSIGNAL, so a write to a peer that closed would otherwise kill
    // the process instead of failing the collective.
    signal(SIGPIPE, SIG_IGN);
  }

  void SetUp() override {
    const BackendParam& p = GetParam();
    const bool fake_device = p.backend == "fakedev";
    const std::string registered = fake_device ? "gloo" : p.backend;
    ASSERT_TRUE(BackendRegistry::Get().Has(DeviceType::kCpu, registered))
        << registered << " is not linked";
    std::shared_ptr<Store> store = NewInMemoryStore();
    const std::vector<std::string> hosts = HostsFor(p.backend, p.size);
    std::vector<absl::Status> created(p.size);
    backends_.resize(p.size);
    // Creation is collective.
    OnEachRank(p.size, [&](int r) {
      BackendContext c;
      c.rank = r;
      c.size = p.size;
      c.store = store;
      c.start_timeout = absl::Seconds(30);
      // Bounds every wait of every collective below.
      c.op_timeout = absl::Seconds(30);
      c.all_ranks_on_host = p.backend == "shm";
      c.hosts = hosts;
      auto b = BackendRegistry::Get().Create(DeviceType::kCpu, registered, c);
      if (b.ok() && fake_device) {
        b = std::unique_ptr<Backend>(
            std::make_unique<testing::FakeDeviceBackend>(std::move(*b), r,
                                                         c.op_timeout));
      }
      if (b.ok()) {
        backends_[r] = std::move(*b);
      } else {
        created[r] = b.status();
      }
    });
    for (int r = 0; r < p.size; ++r) {
      ASSERT_TRUE(created[r].ok()) << "rank " << r << ": " << created[r];
    }
  }

  int size() const { return GetParam().size; }
  Backend& backend(int rank) { return *backends_[rank]; }

  // body(rank, backend) on one thread per rank.
  void OnEachBackend(const std::function<void(int, Backend&)>& body) {
    OnEachRank(size(), [&](int r) { body(r, *backends_[r]); });
  }

  // The roots a broadcast is tried from: first, middle, last.
  std::vector<int> Roots() const {
    std::vector<int> roots = {0, size() / 2, size() - 1};
    roots.erase(std::unique(roots.begin(), roots.end()), roots.end());
    return roots;
  }

  std::vector<std::unique_ptr<Backend>> backends_;
};

INSTANTIATE_TEST_SUITE_P(
    HostBackends, BackendContractTest, ::testing::ValuesIn([] {
      std::vector<BackendParam> params;
      for (const char* backend : {"gloo", "shm", "shm+gloo", "fakedev"}) {
        for (int size : {1, 2, 3, 5, 8}) params.push_back({backend, size});
      }
      return params;
    }()),
    ParamName);

// ---- Helpers ----------------------------------------------------------------

// Every rank's buffer holds the same bytes as rank 0's.
void ExpectIdentical(const std::vector<Bytes>& data, const std::string& what) {
  for (size_t r = 1; r < data.size(); ++r) {
    ASSERT_EQ(data[r].size(), data[0].size()) << what;
    ASSERT_TRUE(data[r].empty() || std::memcmp(data[r].data(), data[0].data(),
                                               data[r].size()) == 0)
        << what << ": rank " << r << " differs from rank 0";
  }
}

// Small integers (negative ones for min/max), exact in every sum and
// product of up to 8 ranks, in float32 and int32 alike.
double SmallInput(ReduceOp op, int rank, size_t i) {
  switch (op) {
    case ReduceOp::kProduct:
      return 1 + static_cast<double>((i * 5 + rank * 3) % 7 == 0);  // 1 or 2
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return static_cast<double>((i * 7 + rank * 11) % 23) - 11;
    default:
      return static_cast<double>((i * 7 + rank * 3) % 9) - 4;
  }
}

double Combined(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kMin:
      return std::min(a, b);
    case ReduceOp::kMax:
      return std::max(a, b);
    case ReduceOp::kProduct:
      return a * b;
    default:
      return a + b;
  }
}

Bytes RandomFloats(size_t count, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  Bytes b(count * sizeof(float));
  float* f = reinterpret_cast<float*>(b.data());
  for (size_t i = 0; i < count; ++i) f[i] = dist(gen);
  return b;
}

// `got` is `want`, or the first differing byte is reported.
::testing::AssertionResult SameBytes(const Bytes& got, const Bytes& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure()
           << got.size() << " bytes, not " << want.size();
  }
  auto [g, w] = std::mismatch(got.begin(), got.end(), want.begin());
  if (g == got.end()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "byte " << (g - got.begin()) << " is "
                                       << int{*g} << ", not " << int{*w};
}

uint8_t Pattern(int rank, size_t i) {
  return static_cast<uint8_t>(i * 31 + rank * 17 + (i >> 8) + 5);
}

// Byte i of what rank `from` sends rank `to`.
uint8_t PairPattern(int from, int to, size_t i) {
  return static_cast<uint8_t>(i * 7 + from * 29 + to * 53 + (i >> 9) + 1);
}

// ---- Allreduce
// ----------------------------------------------------------------

TEST_P(BackendContractTest, AllreduceEveryOpIsExactAndIdentical) {
  const int n = size();
  struct Case {
    DataType dtype;
    ReduceOp op;
    size_t count;
  };
  std::vector<Case> cases;
  for (DataType dtype : {DataType::kFloat32, DataType::kInt32}) {
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct}) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{1001}}) {
        cases.push_back({dtype, op, count});
      }
    }
    // Large: sum only (every path, at a bounded cost).
    cases.push_back({dtype, ReduceOp::kSum, kLarge});
  }
  for (const Case& c : cases) {
    const std::string what = absl::StrCat(DataTypeName(c.dtype), " ",
                                          ReduceOpName(c.op), " of ", c.count);
    SCOPED_TRACE(what);
    const size_t elem = DataTypeSize(c.dtype);
    std::vector<Bytes> data(n, Bytes(c.count * elem));
    OnEachBackend([&](int r, Backend& b) {
      for (size_t i = 0; i < c.count; ++i) {
        SetValue(c.dtype, data[r].data(), i, SmallInput(c.op, r, i));
      }
      absl::Status s = b.Allreduce(data[r].data(), c.count, c.dtype, c.op);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    });
    ASSERT_FALSE(HasFailure());
    for (size_t i = 0; i < c.count; ++i) {
      double want = SmallInput(c.op, 0, i);
      for (int r = 1; r < n; ++r)
        want = Combined(c.op, want, SmallInput(c.op, r, i));
      ASSERT_EQ(GetValue(c.dtype, data[0].data(), i), want) << "at " << i;
    }
    ExpectIdentical(data, what);
  }
}

TEST_P(BackendContractTest, AllreduceOfRandomFloatsIsBitwiseIdentical) {
  // Rounding depends on the order of the additions: every rank must still
  // get the same bits (and a sum close to the exact one).
  const int n = size();
  for (size_t count : {size_t{1}, size_t{1001}, size_t{100003}, kLarge}) {
    SCOPED_TRACE(absl::StrCat(count, " floats"));
    std::vector<Bytes> inputs(n), data(n);
    OnEachBackend([&](int r, Backend& b) {
      inputs[r] = RandomFloats(count, 1000 + r);
      data[r] = inputs[r];
      absl::Status s = b.Allreduce(data[r].data(), count, DataType::kFloat32,
                                   ReduceOp::kSum);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    });
    ASSERT_FALSE(HasFailure());
    ExpectIdentical(data, "sum");
    const float* got = reinterpret_cast<const float*>(data[0].data());
    for (size_t i = 0; i < count; ++i) {
      double exact = 0, magnitude = 0;
      for (int r = 0; r < n; ++r) {
        const double x = reinterpret_cast<const float*>(inputs[r].data())[i];
        exact += x;
        magnitude += std::fabs(x);
      }
      ASSERT_NEAR(got[i], exact, 1e-6 * magnitude + 1e-30) << "at " << i;
    }
  }
}

TEST_P(BackendContractTest, AverageAsTheRuntimeRunsItIsASumThenAScale) {
  // The runtime never passes kAverage (backend.h): it runs
  // AllreduceScaled(sum, prescale, postscale / size).
  const int n = size();
  const double postscale = 1.0 / n;
  for (size_t count : {size_t{0}, size_t{1}, size_t{1001}}) {
    SCOPED_TRACE(absl::StrCat(count, " floats"));
    std::vector<Bytes> data(n, Bytes(count * sizeof(float)));
    OnEachBackend([&](int r, Backend& b) {
      for (size_t i = 0; i < count; ++i) {
        SetValue(DataType::kFloat32, data[r].data(), i,
                 SmallInput(ReduceOp::kSum, r, i));
      }
      absl::Status s = b.AllreduceScaled(data[r].data(), count,
                                         DataType::kFloat32, ReduceOp::kSum,
                                         /*prescale=*/2.0, postscale);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    });
    ASSERT_FALSE(HasFailure());
    ExpectIdentical(data, "average");
    for (size_t i = 0; i < count; ++i) {
      float sum = 0;  // of exactly representable doubled small integers
      for (int r = 0; r < n; ++r) {
        sum += 2.0f * static_cast<float>(SmallInput(ReduceOp::kSum, r, i));
      }
      ASSERT_EQ(GetValue(DataType::kFloat32, data[0].data(), i),
                sum * static_cast<float>(postscale))
          << "at " << i;
    }
  }
}

TEST_P(BackendContractTest, AllreducePiecesMatchesAllreduceBitwise) {
  const int n = size();
  // Uneven pieces, one empty, one out of place; large enough for shm's
  // pipelined path.
  const std::vector<size_t> counts = {10007, 0, 50001, 3};
  size_t total = 0;
  for (size_t c : counts) total += c;
  const bool offered =
      backend(0).SupportsAllreducePieces(total, DataType::kFloat32);
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(backend(r).SupportsAllreducePieces(total, DataType::kFloat32),
              offered)
        << "ranks disagree on whether pieces are offered";
  }
  if (!offered) {
    GTEST_SKIP() << GetParam().backend << " does not offer AllreducePieces for "
                 << total << " float32 (SupportsAllreducePieces is false)";
  }
  // Every rank: pieces. Then even ranks pieces and odd ranks a packed
  // Allreduce, which backend.h says ranks may mix.
  for (bool mixed : {false, true}) {
    SCOPED_TRACE(mixed ? "mixed with Allreduce" : "pieces on every rank");
    std::vector<Bytes> packed(n), out(n, Bytes(total * sizeof(float)));
    std::vector<Bytes> in(n);
    OnEachBackend([&](int r, Backend& b) {
      in[r] = RandomFloats(total, 77 + r);
      packed[r] = in[r];
      Bytes work = in[r];  // pieces 0 and 2 in place, 1 and 3 into out[r]
      if (mixed && r % 2 == 1) {
        absl::Status s =
            b.Allreduce(work.data(), total, DataType::kFloat32, ReduceOp::kSum);
        EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
        out[r] = work;
        return;
      }
      std::vector<FusedPiece> pieces;
      size_t offset = 0;
      for (size_t k = 0; k < counts.size(); ++k) {
        uint8_t* at = work.data() + offset * sizeof(float);
        uint8_t* to = k % 2 ? out[r].data() + offset * sizeof(float) : at;
        pieces.push_back({at, to, counts[k]});
        offset += counts[k];
      }
      absl::Status s =
          b.AllreducePieces(pieces, total, DataType::kFloat32, ReduceOp::kSum);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
      // Reassemble: in-place pieces from `work`, the others from out[r].
      offset = 0;
      for (size_t k = 0; k < counts.size(); ++k) {
        if (k % 2 == 0 && counts[k]) {
          std::memcpy(out[r].data() + offset * sizeof(float),
                      work.data() + offset * sizeof(float),
                      counts[k] * sizeof(float));
        }
        offset += counts[k];
      }
    });
    ASSERT_FALSE(HasFailure());
    ExpectIdentical(out, "pieces");
    // The same bits as one packed Allreduce of the same inputs.
    OnEachBackend([&](int r, Backend& b) {
      absl::Status s = b.Allreduce(packed[r].data(), total, DataType::kFloat32,
                                   ReduceOp::kSum);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    });
    ASSERT_FALSE(HasFailure());
    EXPECT_TRUE(out[0] == packed[0]) << "pieces and Allreduce differ";
  }
}

// ---- Broadcast
// ----------------------------------------------------------------

TEST_P(BackendContractTest, BroadcastFromSeveralRoots) {
  const int n = size();
  for (int root : Roots()) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{1001}, 4 * kLarge}) {
      SCOPED_TRACE(absl::StrCat(bytes, " bytes from root ", root));
      std::vector<Bytes> data(n, Bytes(bytes));
      OnEachBackend([&](int r, Backend& b) {
        for (size_t i = 0; i < bytes; ++i) data[r][i] = Pattern(r, i);
        absl::Status s = b.Broadcast(data[r].data(), bytes, root);
        EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
      });
      ASSERT_FALSE(HasFailure());
      Bytes want(bytes);
      for (size_t i = 0; i < bytes; ++i) want[i] = Pattern(root, i);
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(SameBytes(data[r], want)) << "rank " << r;
      }
    }
  }
}

// ---- Allgatherv
// ---------------------------------------------------------------

TEST_P(BackendContractTest, AllgathervWithUnevenCounts) {
  const int n = size();
  // Bytes each rank contributes: some ranks none; all none; large.
  std::vector<std::function<size_t(int)>> layouts = {
      [](int r) -> size_t { return r % 3 == 1 ? 0 : 1 + r * 37; },
      [](int) -> size_t { return 0; },
      [](int r) -> size_t { return 1; },
      [](int r) -> size_t { return 4 * kLarge / 8 + r * 1001; },
  };
  for (size_t l = 0; l < layouts.size(); ++l) {
    std::vector<size_t> bytes_per_rank(n);
    size_t total = 0;
    for (int r = 0; r < n; ++r) total += bytes_per_rank[r] = layouts[l](r);
    SCOPED_TRACE(absl::StrCat("layout ", l, ": ", total, " bytes in all"));
    std::vector<Bytes> out(n, Bytes(total + 1, 0xAA));  // +1: a guard byte
    OnEachBackend([&](int r, Backend& b) {
      Bytes in(bytes_per_rank[r]);
      for (size_t i = 0; i < in.size(); ++i) in[i] = Pattern(r, i);
      absl::Status s = b.Allgatherv(in.data(), out[r].data(), bytes_per_rank);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    });
    ASSERT_FALSE(HasFailure());
    Bytes want;  // every rank's block in rank order, then the guard
    for (int k = 0; k < n; ++k) {
      for (size_t i = 0; i < bytes_per_rank[k]; ++i)
        want.push_back(Pattern(k, i));
    }
    want.push_back(0xAA);
    for (int r = 0; r < n; ++r) {
      ASSERT_TRUE(SameBytes(out[r], want)) << "rank " << r;
    }
  }
}

// ---- Alltoallv
// ----------------------------------------------------------------

TEST_P(BackendContractTest, AlltoallvWithUnevenSplits) {
  const int n = size();
  // Bytes rank `from` sends rank `to`: zeros on some pairs (itself
  // included), all zeros, and large.
  std::vector<std::function<size_t(int, int)>> layouts = {
      [](int from, int to) -> size_t { return (from + 2 * to) % 4 * 13; },
      [](int, int) -> size_t { return 0; },
      [](int from, int to) -> size_t { return from == to ? 0 : 1; },
      [](int from, int to) -> size_t {
        return (from * 3 + to) % 5 * (kLarge / 16) + 7;
      },
  };
  for (size_t l = 0; l < layouts.size(); ++l) {
    SCOPED_TRACE(absl::StrCat("layout ", l));
    const auto& sends = layouts[l];
    std::vector<Bytes> out(n);
    OnEachBackend([&](int r, Backend& b) {
      std::vector<size_t> send(n), recv(n);
      size_t sent = 0, received = 0;
      for (int k = 0; k < n; ++k) {
        sent += send[k] = sends(r, k);
        received += recv[k] = sends(k, r);
      }
      Bytes in(sent);
      size_t at = 0;
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < send[k]; ++i) in[at++] = PairPattern(r, k, i);
      }
      out[r].assign(received + 1, 0xAA);
      absl::Status s = b.Alltoallv(in.data(), send, out[r].data(), recv);
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
    });
    ASSERT_FALSE(HasFailure());
    for (int r = 0; r < n; ++r) {
      Bytes want;  // what each rank sent r, in rank order, then the guard
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < sends(k, r); ++i)
          want.push_back(PairPattern(k, r, i));
      }
      want.push_back(0xAA);
      ASSERT_TRUE(SameBytes(out[r], want)) << "rank " << r;
    }
  }
}

// ---- Combine and Scale ------------------------------------------------------

TEST_P(BackendContractTest, CombineAndScaleAreTheElementwiseKernels) {
  // Local operations, on each rank's backend object.
  for (int r = 0; r < size(); ++r) {
    Backend& b = backend(r);
    for (size_t count : {size_t{0}, size_t{1}, size_t{1001}}) {
      for (DataType dtype :
           {DataType::kFloat32, DataType::kInt32, DataType::kFloat64}) {
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProduct}) {
          SCOPED_TRACE(absl::StrCat("rank ", r, ": ", DataTypeName(dtype), " ",
                                    ReduceOpName(op), " of ", count));
          const size_t elem = DataTypeSize(dtype);
          Bytes out(count * elem + 1), in(count * elem + 1);
          for (size_t i = 0; i < count; ++i) {
            SetValue(dtype, out.data(), i, SmallInput(op, 1, i));
            SetValue(dtype, in.data(), i, SmallInput(op, 2, i));
          }
          b.Combine(out.data(), in.data(), count, dtype, op);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(GetValue(dtype, out.data(), i),
                      Combined(op, SmallInput(op, 1, i), SmallInput(op, 2, i)))
                << "at " << i;
          }
        }
      }
      // Scale: float32 in float, float64 in double, 16-bit via float.
      Bytes f = RandomFloats(count, 5 + r);
      Bytes want = f;
      for (size_t i = 0; i < count; ++i) {
        reinterpret_cast<float*>(want.data())[i] *= static_cast<float>(0.1);
      }
      b.Scale(f.data(), count, DataType::kFloat32, 0.1);
      EXPECT_TRUE(f == want) << "float32 scale by 0.1";
      std::vector<double> d(count), d_want(count);
      for (size_t i = 0; i < count; ++i) d[i] = d_want[i] = i * 1.25 - 3;
      for (double& x : d_want) x *= 1.0 / 3;
      b.Scale(d.data(), count, DataType::kFloat64, 1.0 / 3);
      EXPECT_EQ(d, d_want) << "float64 scale by 1/3";
      std::vector<uint16_t> h(count);
      for (size_t i = 0; i < count; ++i) {
        h[i] = cpu::FloatToHalf(static_cast<float>(i % 64) - 32);
      }
      b.Scale(h.data(), count, DataType::kFloat16, 0.5);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(cpu::HalfToFloat(h[i]),
                  (static_cast<float>(i % 64) - 32) * 0.5f)
            << "float16 at " << i;
      }
    }
  }
}

// ---- Collectives back to back ----------------------------------------------

TEST_P(BackendContractTest, CollectivesOfEveryKindBackToBack) {
  // No synchronisation between collectives but their own: a backend that
  // reuses buffers (shm's double buffering) must not let one collective's
  // data into the next.
  const int n = size();
  constexpr int kRounds = 25;
  std::vector<std::vector<std::string>> errors(n);
  OnEachBackend([&](int r, Backend& b) {
    auto fail = [&](const std::string& e) { errors[r].push_back(e); };
    for (int round = 0; round < kRounds; ++round) {
      const size_t count = 1 + (round * 37) % 300;
      std::vector<int32_t> sum(count);
      for (size_t i = 0; i < count; ++i)
        sum[i] = round + r + static_cast<int>(i);
      absl::Status s =
          b.Allreduce(sum.data(), count, DataType::kInt32, ReduceOp::kSum);
      if (!s.ok()) return fail(s.ToString());
      for (size_t i = 0; i < count; ++i) {
        const int32_t want =
            n * (round + static_cast<int>(i)) + n * (n - 1) / 2;
        if (sum[i] != want) {
          return fail(absl::StrCat("round ", round, ": allreduce at ", i,
                                   " is ", sum[i], ", not ", want));
        }
      }
      const int root = round % n;
      Bytes bc(count + round);
      for (size_t i = 0; i < bc.size(); ++i) bc[i] = Pattern(r + round, i);
      s = b.Broadcast(bc.data(), bc.size(), root);
      if (!s.ok()) return fail(s.ToString());
      for (size_t i = 0; i < bc.size(); ++i) {
        if (bc[i] != Pattern(root + round, i)) {
          return fail(absl::StrCat("round ", round, ": broadcast at ", i));
        }
      }
      std::vector<size_t> per_rank(n);
      size_t total = 0;
      for (int k = 0; k < n; ++k) total += per_rank[k] = (k + round) % 4;
      Bytes mine(per_rank[r], static_cast<uint8_t>(r * 10 + round));
      Bytes all(total + 1);
      s = b.Allgatherv(mine.data(), all.data(), per_rank);
      if (!s.ok()) return fail(s.ToString());
      size_t at = 0;
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < per_rank[k]; ++i, ++at) {
          if (all[at] != static_cast<uint8_t>(k * 10 + round)) {
            return fail(absl::StrCat("round ", round, ": allgather of ", k));
          }
        }
      }
      std::vector<size_t> send(n), recv(n);
      size_t sent = 0, received = 0;
      for (int k = 0; k < n; ++k) {
        sent += send[k] = (r + k + round) % 3;
        received += recv[k] = (k + r + round) % 3;
      }
      Bytes in(sent + 1), out(received + 1);
      at = 0;
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < send[k]; ++i)
          in[at++] = PairPattern(r, k, round);
      }
      s = b.Alltoallv(in.data(), send, out.data(), recv);
      if (!s.ok()) return fail(s.ToString());
      at = 0;
      for (int k = 0; k < n; ++k) {
        for (size_t i = 0; i < recv[k]; ++i, ++at) {
          if (out[at] != PairPattern(k, r, round)) {
            return fail(absl::StrCat("round ", round, ": alltoall from ", k));
          }
        }
      }
    }
  });
  for (int r = 0; r < n; ++r) {
    for (const std::string& e : errors[r])
      ADD_FAILURE() << "rank " << r << ": " << e;
  }
}

// ---- Close ------------------------------------------------------------------

TEST_P(BackendContractTest, CloseEndsCollectivesOnEveryRank) {
  // Rank 0 closes its backend instead of taking part, as the runtime does
  // on a fatal error, then tries the collective anyway: it must fail, and
  // so must every other rank's, each of which then closes its own backend
  // as its runtime would. All of them end long before the op timeout (30 s).
  const int n = size();
  if (n == 1) {
    GTEST_SKIP() << "a set of one has no peer to unblock (and its "
                    "collectives need no connection)";
  }
  std::vector<absl::Status> status(n);
  std::vector<absl::Duration> took(n);
  OnEachBackend([&](int r, Backend& b) {
    std::vector<float> data(1001, 1.0f);
    const absl::Time start = absl::Now();
    if (r == 0) b.Close();
    status[r] = b.Allreduce(data.data(), data.size(), DataType::kFloat32,
                            ReduceOp::kSum);
    if (!status[r].ok()) b.Close();
    took[r] = absl::Now() - start;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_FALSE(status[r].ok()) << "rank " << r << " succeeded";
    EXPECT_LT(took[r], absl::Seconds(10))
        << "rank " << r << " waited for its timeout: " << status[r];
  }
}

}  // namespace
}  // namespace kolo
