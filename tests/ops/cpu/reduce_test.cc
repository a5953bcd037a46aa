#include "ops/cpu/reduce.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kolo {
namespace cpu {
namespace {

// Every dtype reductions take (bool is never reduced).
constexpr DataType kAllTypes[] = {
    DataType::kUint8,    DataType::kInt8,    DataType::kInt16,
    DataType::kInt32,    DataType::kInt64,   DataType::kFloat16,
    DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64,
};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAverage,
                                ReduceOp::kMin, ReduceOp::kMax,
                                ReduceOp::kProduct};
constexpr size_t kCounts[] = {0, 1, 2, 7, 33, 1023, 100003};

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
bool HalfIsNan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }
bool Bf16IsNan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f); }

// ---- Scalar reference, written independently of the kernels ----------------

template <typename T, typename U>
T RefInt(ReduceOp op, T x, T y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return static_cast<T>(
          static_cast<U>(static_cast<uint64_t>(x) + static_cast<uint64_t>(y)));
    case ReduceOp::kProduct:
      return static_cast<T>(
          static_cast<U>(static_cast<uint64_t>(x) * static_cast<uint64_t>(y)));
    case ReduceOp::kMin:
      return std::min(x, y);
    case ReduceOp::kMax:
      return std::max(x, y);
  }
  return 0;
}

template <typename F>
F RefFloat(ReduceOp op, F x, F y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return x + y;
    case ReduceOp::kProduct:
      return x * y;
    case ReduceOp::kMin:
      if (std::isnan(x) || std::isnan(y))
        return std::numeric_limits<F>::quiet_NaN();
      return std::min(x, y);
    case ReduceOp::kMax:
      if (std::isnan(x) || std::isnan(y))
        return std::numeric_limits<F>::quiet_NaN();
      return std::max(x, y);
  }
  return 0;
}

// Element i of a buffer of `dtype` as bytes, compared by value (NaN == NaN).
bool SameElement(DataType dtype, const uint8_t* x, const uint8_t* y) {
  switch (dtype) {
    case DataType::kFloat16: {
      uint16_t a, b;
      std::memcpy(&a, x, 2);
      std::memcpy(&b, y, 2);
      return a == b || (HalfIsNan(a) && HalfIsNan(b));
    }
    case DataType::kBfloat16: {
      uint16_t a, b;
      std::memcpy(&a, x, 2);
      std::memcpy(&b, y, 2);
      return a == b || (Bf16IsNan(a) && Bf16IsNan(b));
    }
    case DataType::kFloat32: {
      float a, b;
      std::memcpy(&a, x, 4);
      std::memcpy(&b, y, 4);
      return FloatBits(a) == FloatBits(b) || (std::isnan(a) && std::isnan(b));
    }
    case DataType::kFloat64: {
      double a, b;
      std::memcpy(&a, x, 8);
      std::memcpy(&b, y, 8);
      return std::memcmp(&a, &b, 8) == 0 || (std::isnan(a) && std::isnan(b));
    }
    default:
      return std::memcmp(x, y, DataTypeSize(dtype)) == 0;
  }
}

void RefElement(ReduceOp op, DataType dtype, uint8_t* out, const uint8_t* a,
                const uint8_t* b) {
  auto apply = [&](auto tag, auto fn) {
    using T = decltype(tag);
    T x, y;
    std::memcpy(&x, a, sizeof(T));
    std::memcpy(&y, b, sizeof(T));
    T r = fn(x, y);
    std::memcpy(out, &r, sizeof(T));
  };
  switch (dtype) {
    case DataType::kUint8:
      return apply(uint8_t{}, [&](uint8_t x, uint8_t y) {
        return RefInt<uint8_t, uint8_t>(op, x, y);
      });
    case DataType::kInt8:
      return apply(int8_t{}, [&](int8_t x, int8_t y) {
        return RefInt<int8_t, uint8_t>(op, x, y);
      });
    case DataType::kInt16:
      return apply(int16_t{}, [&](int16_t x, int16_t y) {
        return RefInt<int16_t, uint16_t>(op, x, y);
      });
    case DataType::kBool:
      ADD_FAILURE() << "bool is never reduced";
      return;
    case DataType::kInt32:
      return apply(int32_t{}, [&](int32_t x, int32_t y) {
        return RefInt<int32_t, uint32_t>(op, x, y);
      });
    case DataType::kInt64:
      return apply(int64_t{}, [&](int64_t x, int64_t y) {
        return RefInt<int64_t, uint64_t>(op, x, y);
      });
    case DataType::kFloat16:
      return apply(uint16_t{}, [&](uint16_t x, uint16_t y) {
        return FloatToHalf(RefFloat(op, HalfToFloat(x), HalfToFloat(y)));
      });
    case DataType::kBfloat16:
      return apply(uint16_t{}, [&](uint16_t x, uint16_t y) {
        return FloatToBfloat16(
            RefFloat(op, Bfloat16ToFloat(x), Bfloat16ToFloat(y)));
      });
    case DataType::kFloat32:
      return apply(float{},
                   [&](float x, float y) { return RefFloat(op, x, y); });
    case DataType::kFloat64:
      return apply(double{},
                   [&](double x, double y) { return RefFloat(op, x, y); });
  }
}

// Random values of `dtype` with a useful spread: small integers (so that
// products stay interesting), extremes, and for floats some NaN/Inf/-0.
std::vector<uint8_t> RandomBuffer(DataType dtype, size_t count,
                                  std::mt19937_64& rng) {
  const size_t size = DataTypeSize(dtype);
  std::vector<uint8_t> buf(count * size);
  std::uniform_real_distribution<double> real(-100.0, 100.0);
  for (size_t i = 0; i < count; ++i) {
    uint8_t* p = buf.data() + i * size;
    const uint64_t bits = rng();
    const int pick = static_cast<int>(rng() % 16);
    auto put = [&](auto v) { std::memcpy(p, &v, sizeof(v)); };
    switch (dtype) {
      case DataType::kUint8:
      case DataType::kInt8:
      case DataType::kInt16:
      case DataType::kInt32:
      case DataType::kInt64:
        std::memcpy(p, &bits, size);  // full range: exercises wrap-around
        break;
      case DataType::kBool:
        put(static_cast<uint8_t>(bits & 1));
        break;
      case DataType::kFloat16: {
        const float special[] = {NAN,   INFINITY, -INFINITY,
                                 -0.0f, 6e-8f,    65504.0f};
        put(FloatToHalf(pick < 6 ? special[pick]
                                 : static_cast<float>(real(rng))));
        break;
      }
      case DataType::kBfloat16: {
        const float special[] = {NAN,   INFINITY, -INFINITY,
                                 -0.0f, 1e-40f,   3e38f};
        put(FloatToBfloat16(pick < 6 ? special[pick]
                                     : static_cast<float>(real(rng))));
        break;
      }
      case DataType::kFloat32: {
        const float special[] = {NAN,   INFINITY, -INFINITY,
                                 -0.0f, 1e-40f,   3e38f};
        put(pick < 6 ? special[pick] : static_cast<float>(real(rng)));
        break;
      }
      case DataType::kFloat64: {
        const double special[] = {NAN,  INFINITY, -INFINITY,
                                  -0.0, 1e-310,   1e308};
        put(pick < 6 ? special[pick] : real(rng));
        break;
      }
    }
  }
  return buf;
}

std::string Describe(DataType dtype, ReduceOp op, size_t count) {
  return std::string(DataTypeName(dtype)) + " " + ReduceOpName(op) +
         " count=" + std::to_string(count);
}

// Compares out[0, count) with the reference and checks that the guard bytes
// behind `count` elements were not written.
void ExpectMatches(DataType dtype, ReduceOp op, const std::vector<uint8_t>& out,
                   const std::vector<uint8_t>& a, const std::vector<uint8_t>& b,
                   size_t count, const std::string& what) {
  const size_t size = DataTypeSize(dtype);
  std::vector<uint8_t> expected(size);
  int failures = 0;
  for (size_t i = 0; i < count && failures < 5; ++i) {
    RefElement(op, dtype, expected.data(), a.data() + i * size,
               b.data() + i * size);
    if (!SameElement(dtype, expected.data(), out.data() + i * size)) {
      ADD_FAILURE() << what << ": element " << i << " differs";
      ++failures;
    }
  }
  for (size_t i = count * size; i < out.size(); ++i) {
    ASSERT_EQ(out[i], 0xAB) << what << ": wrote past count";
  }
}

TEST(ReduceTest, EveryTypeAndOpMatchesReference) {
  std::mt19937_64 rng(42);
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : kCounts) {
        const std::string what = Describe(dtype, op, count);
        const size_t size = DataTypeSize(dtype);
        auto a = RandomBuffer(dtype, count, rng);
        auto b = RandomBuffer(dtype, count, rng);
        std::vector<uint8_t> out((count + 3) * size, 0xAB);
        Reduce(op, dtype, out.data(), a.data(), b.data(), count);
        ExpectMatches(dtype, op, out, a, b, count, what);
      }
    }
  }
}

TEST(ReduceTest, OutputMayAliasEitherInputOrBoth) {
  std::mt19937_64 rng(7);
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      for (size_t count : {size_t{1}, size_t{17}, size_t{4099}}) {
        const std::string what = Describe(dtype, op, count);
        const size_t size = DataTypeSize(dtype);
        auto a = RandomBuffer(dtype, count, rng);
        auto b = RandomBuffer(dtype, count, rng);
        std::vector<uint8_t> guard(3 * size, 0xAB);

        std::vector<uint8_t> left = a;
        left.insert(left.end(), guard.begin(), guard.end());
        Reduce(op, dtype, left.data(), left.data(), b.data(), count);
        ExpectMatches(dtype, op, left, a, b, count, what + " out==a");

        std::vector<uint8_t> right = b;
        right.insert(right.end(), guard.begin(), guard.end());
        Reduce(op, dtype, right.data(), a.data(), right.data(), count);
        ExpectMatches(dtype, op, right, a, b, count, what + " out==b");

        std::vector<uint8_t> self = a;
        self.insert(self.end(), guard.begin(), guard.end());
        Reduce(op, dtype, self.data(), self.data(), self.data(), count);
        ExpectMatches(dtype, op, self, a, a, count, what + " out==a==b");
      }
    }
  }
}

TEST(ReduceTest, CountZeroTouchesNothing) {
  // Null pointers are allowed with a count of zero, and real buffers are
  // neither read into the output nor written.
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      Reduce(op, dtype, nullptr, nullptr, nullptr, 0);
      std::vector<uint8_t> out(64, 0xAB), a(64, 0x11), b(64, 0x22);
      Reduce(op, dtype, out.data(), a.data(), b.data(), 0);
      EXPECT_EQ(out, std::vector<uint8_t>(64, 0xAB))
          << DataTypeName(dtype) << " " << ReduceOpName(op);
      EXPECT_EQ(a, std::vector<uint8_t>(64, 0x11));
      EXPECT_EQ(b, std::vector<uint8_t>(64, 0x22));
    }
    if (IsFloatingPoint(dtype)) {
      Scale(dtype, nullptr, 0, 2.0);
      std::vector<uint8_t> data(64, 0x3C);
      Scale(dtype, data.data(), 0, 2.0);
      EXPECT_EQ(data, std::vector<uint8_t>(64, 0x3C)) << DataTypeName(dtype);
    }
  }
}

TEST(ReduceTest, IntegersWrapLikeUnsignedArithmetic) {
  int8_t i8a[] = {127, -128, 100}, i8b[] = {1, -1, 3}, i8out[3];
  Reduce(ReduceOp::kSum, DataType::kInt8, i8out, i8a, i8b, 3);
  EXPECT_EQ(i8out[0], -128);
  EXPECT_EQ(i8out[1], 127);
  Reduce(ReduceOp::kProduct, DataType::kInt8, i8out, i8a, i8b, 3);
  EXPECT_EQ(i8out[2], static_cast<int8_t>(44));  // 300 mod 256

  uint8_t u8a[] = {255, 200}, u8b[] = {255, 100}, u8out[2];
  Reduce(ReduceOp::kProduct, DataType::kUint8, u8out, u8a, u8b, 2);
  EXPECT_EQ(u8out[0], 1);  // 65025 mod 256
  Reduce(ReduceOp::kSum, DataType::kUint8, u8out, u8a, u8b, 2);
  EXPECT_EQ(u8out[1], 44);

  int32_t i32a[] = {INT32_MAX, INT32_MIN}, i32b[] = {1, 2}, i32out[2];
  Reduce(ReduceOp::kSum, DataType::kInt32, i32out, i32a, i32b, 2);
  EXPECT_EQ(i32out[0], INT32_MIN);
  Reduce(ReduceOp::kProduct, DataType::kInt32, i32out, i32a, i32b, 2);
  EXPECT_EQ(i32out[1], 0);
  Reduce(ReduceOp::kMin, DataType::kInt32, i32out, i32a, i32b, 2);
  EXPECT_EQ(i32out[0], 1);
  EXPECT_EQ(i32out[1], INT32_MIN);

  int64_t i64a[] = {INT64_MAX, int64_t{1} << 40},
          i64b[] = {1, int64_t{1} << 30};
  int64_t i64out[2];
  Reduce(ReduceOp::kSum, DataType::kInt64, i64out, i64a, i64b, 2);
  EXPECT_EQ(i64out[0], INT64_MIN);
  Reduce(ReduceOp::kProduct, DataType::kInt64, i64out, i64a, i64b, 2);
  EXPECT_EQ(i64out[1], int64_t{0});  // 2^70 mod 2^64
  Reduce(ReduceOp::kMax, DataType::kInt64, i64out, i64a, i64b, 2);
  EXPECT_EQ(i64out[0], INT64_MAX);
}

TEST(ReduceTest, FloatMinMaxPropagateNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  float a[] = {nan, 1.0f, 2.0f, nan}, b[] = {1.0f, nan, 3.0f, nan}, out[4];
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    Reduce(op, DataType::kFloat32, out, a, b, 4);
    EXPECT_TRUE(std::isnan(out[0]));
    EXPECT_TRUE(std::isnan(out[1]));
    EXPECT_EQ(out[2], op == ReduceOp::kMin ? 2.0f : 3.0f);
    EXPECT_TRUE(std::isnan(out[3]));
  }
  uint16_t ha[] = {FloatToHalf(nan), FloatToHalf(-2.0f)};
  uint16_t hb[] = {FloatToHalf(5.0f), FloatToHalf(nan)};
  uint16_t hout[2];
  Reduce(ReduceOp::kMax, DataType::kFloat16, hout, ha, hb, 2);
  EXPECT_TRUE(HalfIsNan(hout[0]));
  EXPECT_TRUE(HalfIsNan(hout[1]));
}

TEST(ReduceTest, HalfAndBfloat16RoundToNearestEven) {
  // 1 + 2^-11 is exactly halfway between 1 and the next half (1 + 2^-10).
  uint16_t one = FloatToHalf(1.0f);
  uint16_t tiny = FloatToHalf(std::ldexp(1.0f, -11));
  uint16_t out;
  Reduce(ReduceOp::kSum, DataType::kFloat16, &out, &one, &tiny, 1);
  EXPECT_EQ(out, 0x3c00);  // ties to even: stays 1.0
  // 65504 + 16 = 65520 rounds (ties to even) to infinity.
  uint16_t max = 0x7bff, sixteen = FloatToHalf(16.0f);
  Reduce(ReduceOp::kSum, DataType::kFloat16, &out, &max, &sixteen, 1);
  EXPECT_EQ(out, 0x7c00);

  uint16_t b_one = FloatToBfloat16(1.0f);
  uint16_t b_half_ulp = FloatToBfloat16(std::ldexp(1.0f, -8));
  Reduce(ReduceOp::kSum, DataType::kBfloat16, &out, &b_one, &b_half_ulp, 1);
  EXPECT_EQ(out, 0x3f80);
  uint16_t b_three_half_ulp = FloatToBfloat16(3 * std::ldexp(1.0f, -8));
  Reduce(ReduceOp::kSum, DataType::kBfloat16, &out, &b_one, &b_three_half_ulp,
         1);
  EXPECT_EQ(out, 0x3f82);  // 1 + 3/256 -> 1 + 4/256 (even)
}

// Every float16 bit pattern summed with a spread of others (normals,
// subnormals, zeros, infinities, NaNs), through Reduce (the F16C path where
// the CPU has it, Note [float16 sums with F16C]) against the portable
// conversions, bit for bit; in place and not, with a tail that is not a
// multiple of the vector width.
TEST(ReduceTest, HalfSumsAreBitExactForEveryPattern) {
  const std::vector<uint16_t> others = {
      0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x0400, 0x3c00,
      0xbc00, 0x3c01, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00,
      0x7c01, 0x1234, 0x5555, 0xd555, 0x6000, 0x0200, 0xfe01};
  const size_t n = 65536 + 5;
  std::vector<uint16_t> a(n), b(n), out(n);
  for (uint16_t other : others) {
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<uint16_t>(i);
      b[i] = static_cast<uint16_t>(other + (i >> 16));
    }
    Reduce(ReduceOp::kSum, DataType::kFloat16, out.data(), a.data(), b.data(),
           n);
    std::vector<uint16_t> in_place = a;
    Reduce(ReduceOp::kSum, DataType::kFloat16, in_place.data(), in_place.data(),
           b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t want = FloatToHalf(HalfToFloat(a[i]) + HalfToFloat(b[i]));
      ASSERT_EQ(out[i], want) << std::hex << a[i] << " + " << b[i];
      ASSERT_EQ(in_place[i], want) << std::hex << a[i] << " + " << b[i];
    }
  }
}

// ---- ReduceMany (Note [16-bit sums rounded once])
// ----------------------------

// The reference for n inputs: 16-bit floats carried in float (RefFloat) over
// every input and rounded once; other dtypes combined pairwise, in order.
std::vector<uint8_t> ManyReference(ReduceOp op, DataType dtype,
                                   const std::vector<std::vector<uint8_t>>& in,
                                   size_t count) {
  const size_t size = DataTypeSize(dtype);
  std::vector<uint8_t> out(count * size);
  const bool half = dtype == DataType::kFloat16;
  if (half || dtype == DataType::kBfloat16) {
    for (size_t i = 0; i < count; ++i) {
      auto get = [&](size_t r) {
        uint16_t v;
        std::memcpy(&v, in[r].data() + 2 * i, 2);
        return half ? HalfToFloat(v) : Bfloat16ToFloat(v);
      };
      float acc = get(0);
      for (size_t r = 1; r < in.size(); ++r) acc = RefFloat(op, acc, get(r));
      const uint16_t bits = half ? FloatToHalf(acc) : FloatToBfloat16(acc);
      std::memcpy(out.data() + 2 * i, &bits, 2);
    }
    return out;
  }
  if (count > 0) std::memcpy(out.data(), in[0].data(), count * size);
  for (size_t r = 1; r < in.size(); ++r) {
    for (size_t i = 0; i < count; ++i) {
      RefElement(op, dtype, out.data() + i * size, out.data() + i * size,
                 in[r].data() + i * size);
    }
  }
  return out;
}

TEST(ReduceManyTest, EveryTypeOpAndInputCountMatchesReference) {
  std::mt19937_64 rng(11);
  for (size_t n : {1, 2, 3, 4, 7}) {
    for (DataType dtype : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        for (size_t count :
             {size_t{0}, size_t{1}, size_t{9}, size_t{515}, size_t{1031}}) {
          std::vector<std::vector<uint8_t>> in;
          std::vector<const void*> ptrs;
          for (size_t r = 0; r < n; ++r) {
            in.push_back(RandomBuffer(dtype, count, rng));
          }
          for (const auto& b : in) ptrs.push_back(b.data());
          const std::vector<uint8_t> want = ManyReference(op, dtype, in, count);
          std::vector<uint8_t> out(count * DataTypeSize(dtype));
          ReduceMany(op, dtype, out.data(), ptrs.data(), n, count);
          // In place, into the first input.
          std::vector<uint8_t> first = in[0];
          ptrs[0] = first.data();
          ReduceMany(op, dtype, first.data(), ptrs.data(), n, count);
          const std::string what =
              Describe(dtype, op, count) + " n=" + std::to_string(n);
          const size_t size = DataTypeSize(dtype);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_TRUE(SameElement(dtype, out.data() + i * size,
                                    want.data() + i * size))
                << what << ": element " << i;
            ASSERT_TRUE(SameElement(dtype, first.data() + i * size,
                                    want.data() + i * size))
                << what << " in place: element " << i;
          }
        }
      }
    }
  }
}

// The point of ReduceMany: four float16 ranks summed pairwise round three
// times; summed in float and rounded once, every element is the nearest
// float16 to the float sum of the four (which is exact here: four halves
// of magnitude 0.25 to 1 add exactly in float).
TEST(ReduceManyTest, SixteenBitSumsAreRoundedOnce) {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> magnitude(0.25f, 1.0f);
  auto dist = [&](std::mt19937& g) {
    const float m = magnitude(g);
    return (g() & 1) ? -m : m;
  };
  const size_t count = 4096, n = 4;
  for (DataType dtype : {DataType::kFloat16, DataType::kBfloat16}) {
    const bool half = dtype == DataType::kFloat16;
    std::vector<std::vector<uint16_t>> in(n, std::vector<uint16_t>(count));
    std::vector<const void*> ptrs;
    for (auto& v : in) {
      for (auto& x : v)
        x = half ? FloatToHalf(dist(gen)) : FloatToBfloat16(dist(gen));
      ptrs.push_back(v.data());
    }
    std::vector<uint16_t> once(count), pairwise = in[0];
    ReduceMany(ReduceOp::kSum, dtype, once.data(), ptrs.data(), n, count);
    for (size_t r = 1; r < n; ++r) {
      Reduce(ReduceOp::kSum, dtype, pairwise.data(), pairwise.data(),
             in[r].data(), count);
    }
    size_t differ = 0;
    for (size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (size_t r = 0; r < n; ++r) {
        exact += half ? HalfToFloat(in[r][i]) : Bfloat16ToFloat(in[r][i]);
      }
      const float f = static_cast<float>(exact);
      ASSERT_EQ(static_cast<double>(f), exact);  // exact in float
      ASSERT_EQ(once[i], half ? FloatToHalf(f) : FloatToBfloat16(f))
          << DataTypeName(dtype) << " element " << i;
      differ += pairwise[i] != once[i];
    }
    // What the pairwise reduction got wrong: a sizeable share (the data
    // makes the comparison meaningful).
    EXPECT_GT(differ, count / 20) << DataTypeName(dtype);
  }
}

// The F16C path (Note [float16 sums with F16C]) against the portable
// conversions for every float16 pattern, NaNs included, with three inputs
// and a tail that is not a multiple of the vector width.
TEST(ReduceManyTest, HalfSumsAreBitExactForEveryPattern) {
  const size_t count = 65536 + 5;
  std::vector<uint16_t> a(count), b(count), c(count), out(count);
  for (size_t i = 0; i < count; ++i) {
    a[i] = static_cast<uint16_t>(i);
    b[i] = static_cast<uint16_t>(i * 7919u + 3);
    c[i] = static_cast<uint16_t>(0x3c00 + (i % 64));
  }
  const void* ptrs[] = {a.data(), b.data(), c.data()};
  ReduceMany(ReduceOp::kSum, DataType::kFloat16, out.data(), ptrs, 3, count);
  for (size_t i = 0; i < count; ++i) {
    const uint16_t want =
        FloatToHalf(HalfToFloat(a[i]) + HalfToFloat(b[i]) + HalfToFloat(c[i]));
    ASSERT_TRUE(out[i] == want || (HalfIsNan(out[i]) && HalfIsNan(want)))
        << std::hex << a[i] << " + " << b[i] << " + " << c[i];
    if (!HalfIsNan(want)) ASSERT_EQ(out[i], want);
  }
}

TEST(ConversionTest, HalfRoundTripsAllBitPatterns) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    ASSERT_EQ(std::isnan(f), HalfIsNan(static_cast<uint16_t>(h)))
        << std::hex << h;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
}

TEST(ConversionTest, Bfloat16RoundTripsAllBitPatterns) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = Bfloat16ToFloat(static_cast<uint16_t>(b));
    ASSERT_EQ(std::isnan(f), Bf16IsNan(static_cast<uint16_t>(b)))
        << std::hex << b;
    ASSERT_EQ(FloatToBfloat16(f), b) << std::hex << b;
  }
}

// Value of a finite half computed arithmetically, independent of bit tricks.
double HalfValue(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  const double mag =
      exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return (h & 0x8000) ? -mag : mag;
}

TEST(ConversionTest, HalfToFloatMatchesArithmeticValue) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = HalfToFloat(bits);
    if (((h >> 10) & 0x1f) == 0x1f) {
      if (!(h & 0x3ff)) {
        EXPECT_TRUE(std::isinf(f)) << std::hex << h;
      }
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), HalfValue(bits)) << std::hex << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << h;
  }
}

// Reference float -> half: the nearest half by value, ties to even mantissa,
// overflow to infinity from 65520 up.
uint16_t RefFloatToHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double mag = std::fabs(static_cast<double>(f));
  if (std::isinf(f) || mag >= 65520.0) return sign | 0x7c00;
  uint16_t lo = 0;  // largest half magnitude <= mag (binary search on bits)
  for (int step = 1 << 14; step > 0; step >>= 1) {
    if (lo + step <= 0x7bff && HalfValue(lo + step) <= mag) lo += step;
  }
  if (HalfValue(lo) == mag) return sign | lo;
  const double below = mag - HalfValue(lo);
  const double above = HalfValue(lo + 1) - mag;  // lo + 1 <= 0x7c00 here
  const uint16_t pick =
      below < above ? lo : (above < below ? lo + 1 : ((lo & 1) ? lo + 1 : lo));
  return sign | pick;
}

TEST(ConversionTest, FloatToHalfRoundsToNearestEven) {
  std::vector<float> inputs;
  // Every half value, every midpoint between neighbours, and points just
  // around the midpoints.
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const double v = HalfValue(static_cast<uint16_t>(h));
    const double next = h + 1 < 0x7c00 ? HalfValue(h + 1) : 65536.0;
    const float mid = static_cast<float>((v + next) / 2);
    inputs.push_back(static_cast<float>(v));
    inputs.push_back(mid);
    inputs.push_back(std::nextafter(mid, 0.0f));
    inputs.push_back(std::nextafter(mid, 1e9f));
  }
  // A sweep over all float bit patterns (finite ones, both signs).
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
    const float f = BitsToFloat(static_cast<uint32_t>(u));
    if (!std::isnan(f)) inputs.push_back(f);
  }
  const size_t n = inputs.size();
  for (size_t i = 0; i < n; ++i) inputs.push_back(-inputs[i]);
  for (float f : inputs) {
    ASSERT_EQ(FloatToHalf(f), RefFloatToHalf(f))
        << f << " bits " << std::hex << FloatBits(f);
#ifdef __FLT16_MAX__
    // The compiler's own (software, IEEE) conversion agrees too.
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t hbits;
    std::memcpy(&hbits, &h, 2);
    ASSERT_EQ(FloatToHalf(f), hbits) << f;
#endif
  }
}

TEST(ConversionTest, FloatToBfloat16RoundsToNearestEven) {
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 997) {
    const uint32_t bits = static_cast<uint32_t>(u);
    const float f = BitsToFloat(bits);
    const uint16_t got = FloatToBfloat16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(Bf16IsNan(got)) << std::hex << bits;
      ASSERT_EQ(got & 0x8000, (bits >> 16) & 0x8000);
      continue;
    }
    // Reference: the two neighbours, compared by value in double.
    const uint16_t lo = static_cast<uint16_t>(bits >> 16);
    const double mag = std::fabs(static_cast<double>(f));
    const double lo_mag = std::fabs(static_cast<double>(Bfloat16ToFloat(lo)));
    uint16_t want = lo;
    if (mag != lo_mag) {
      const uint16_t hi = lo + 1;  // next magnitude (may be infinity)
      const double hi_mag =
          (hi & 0x7fff) == 0x7f80
              ? std::ldexp(1.0, 128)  // Infinity as the next step after max
              : std::fabs(static_cast<double>(Bfloat16ToFloat(hi)));
      const double below = mag - lo_mag, above = hi_mag - mag;
      want = below < above ? lo : (above < below ? hi : ((lo & 1) ? hi : lo));
    }
    ASSERT_EQ(got, want) << f << " bits " << std::hex << bits;
  }
}

TEST(ConversionTest, NanStaysNanAndInfinityStaysInfinity) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float snan_low_payload =
      BitsToFloat(0x7f800001u);  // payload in low bits
  for (float nan : {qnan, -qnan, snan_low_payload}) {
    EXPECT_TRUE(HalfIsNan(FloatToHalf(nan)));
    EXPECT_TRUE(Bf16IsNan(FloatToBfloat16(nan)));
  }
  EXPECT_EQ(FloatToHalf(INFINITY), 0x7c00);
  EXPECT_EQ(FloatToHalf(-INFINITY), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e10f), 0x7c00);
  EXPECT_EQ(FloatToBfloat16(INFINITY), 0x7f80);
  EXPECT_EQ(FloatToBfloat16(-INFINITY), 0xff80);
  EXPECT_EQ(FloatToBfloat16(std::numeric_limits<float>::max()), 0x7f80);
  // Smallest half subnormal and half of it (ties to even -> 0).
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
}

TEST(ScaleTest, FloatTypes) {
  std::mt19937_64 rng(3);
  for (DataType dtype : {DataType::kFloat16, DataType::kBfloat16,
                         DataType::kFloat32, DataType::kFloat64}) {
    for (size_t count : kCounts) {
      for (double factor : {0.25, 1.0 / 3.0, -7.5, 0.0}) {
        const size_t size = DataTypeSize(dtype);
        auto data = RandomBuffer(dtype, count, rng);
        std::vector<uint8_t> out = data;
        out.resize((count + 3) * size, 0xAB);
        Scale(dtype, out.data(), count, factor);
        for (size_t i = 0; i < count; ++i) {
          uint8_t want[8];
          const uint8_t* in = data.data() + i * size;
          switch (dtype) {
            case DataType::kFloat16: {
              uint16_t h;
              std::memcpy(&h, in, 2);
              h = FloatToHalf(HalfToFloat(h) * static_cast<float>(factor));
              std::memcpy(want, &h, 2);
              break;
            }
            case DataType::kBfloat16: {
              uint16_t b;
              std::memcpy(&b, in, 2);
              b = FloatToBfloat16(Bfloat16ToFloat(b) *
                                  static_cast<float>(factor));
              std::memcpy(want, &b, 2);
              break;
            }
            case DataType::kFloat32: {
              float f;
              std::memcpy(&f, in, 4);
              f *= static_cast<float>(factor);
              std::memcpy(want, &f, 4);
              break;
            }
            default: {
              double d;
              std::memcpy(&d, in, 8);
              d *= factor;
              std::memcpy(want, &d, 8);
              break;
            }
          }
          ASSERT_TRUE(SameElement(dtype, want, out.data() + i * size))
              << DataTypeName(dtype) << " factor " << factor << " element "
              << i;
        }
        for (size_t i = count * size; i < out.size(); ++i) {
          ASSERT_EQ(out[i], 0xAB);
        }
      }
    }
  }
}

TEST(ScaleTest, AverageIsSumThenScale) {
  float a[] = {1.0f, 2.0f, 3.0f}, b[] = {3.0f, 4.0f, 6.0f}, out[3];
  Reduce(ReduceOp::kAverage, DataType::kFloat32, out, a, b, 3);
  Scale(DataType::kFloat32, out, 3, 0.5);
  EXPECT_EQ(out[0], 2.0f);
  EXPECT_EQ(out[1], 3.0f);
  EXPECT_EQ(out[2], 4.5f);
}

// Note [Integer scaling]: Horovod's rule, in double, truncated toward zero,
// clamped to the type's range (NaN gives 0).
TEST(ScaleTest, IntegersTruncateTowardZeroAndClamp) {
  int32_t i32[] = {5, -5, 7, -7, 2147483647, -2147483647 - 1};
  Scale(DataType::kInt32, i32, 6, 0.5);
  EXPECT_EQ(i32[0], 2);
  EXPECT_EQ(i32[1], -2);
  EXPECT_EQ(i32[2], 3);
  EXPECT_EQ(i32[3], -3);
  EXPECT_EQ(i32[4], 1073741823);
  EXPECT_EQ(i32[5], -1073741824);
  int32_t big[] = {2147483647, -2147483647 - 1, 3};
  Scale(DataType::kInt32, big, 3, 2.0);
  EXPECT_EQ(big[0], 2147483647);
  EXPECT_EQ(big[1], -2147483647 - 1);
  EXPECT_EQ(big[2], 6);
  uint8_t u8[] = {200, 3, 0};
  Scale(DataType::kUint8, u8, 3, 2.0);
  EXPECT_EQ(u8[0], 255);
  EXPECT_EQ(u8[1], 6);
  EXPECT_EQ(u8[2], 0);
  Scale(DataType::kUint8, u8, 3, -1.0);
  EXPECT_EQ(u8[0], 0);
  EXPECT_EQ(u8[1], 0);
  int8_t i8[] = {100, -100, 9};
  Scale(DataType::kInt8, i8, 3, 1.5);
  EXPECT_EQ(i8[0], 127);
  EXPECT_EQ(i8[1], -128);
  EXPECT_EQ(i8[2], 13);
  int16_t i16[] = {1000, -3};
  Scale(DataType::kInt16, i16, 2, 1.0 / 3.0);
  EXPECT_EQ(i16[0], 333);
  EXPECT_EQ(i16[1], -1);  // -3 * (1/3) is -1 in double
  int64_t i64[] = {int64_t{1} << 62, -(int64_t{1} << 62), 9};
  Scale(DataType::kInt64, i64, 3, 4.0);
  EXPECT_EQ(i64[0], std::numeric_limits<int64_t>::max());
  EXPECT_EQ(i64[1], std::numeric_limits<int64_t>::min());
  EXPECT_EQ(i64[2], 36);
  int32_t nan[] = {4};
  Scale(DataType::kInt32, nan, 1, std::nan(""));
  EXPECT_EQ(nan[0], 0);
}

}  // namespace
}  // namespace cpu
}  // namespace kolo
