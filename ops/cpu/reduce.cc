#include "ops/cpu/reduce.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <limits>
#include <vector>

namespace kolo {
namespace cpu {
namespace {

// Note [Vectorizable kernels]
// Every kernel is one plain loop over __restrict pointers with the element
// combiner inlined; the dispatch (dtype, op, aliasing) happens once, outside
// the loop, so that GCC's auto-vectorizer sees straight-line bodies (check
// with -fopt-info-vec). `out` may alias `a` and/or `b` exactly; each case gets
// its own loop so that no two __restrict pointers name the same object.
// Partially overlapping buffers are not supported.
//
// Floating-point Min/Max propagate NaN (like torch.minimum/maximum): the
// result is NaN when either input is NaN. Integer Sum/Product wrap as the
// same-width unsigned arithmetic would.

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// Branch-free (select-based) conversions so that float16/bfloat16 loops can
// be if-converted too. Bit-exact: every half/bfloat16 value, including
// subnormals, infinities and NaN payloads, survives 16 -> 32 -> 16 unchanged.
inline float HalfToFloatImpl(uint16_t h) {
  constexpr uint32_t kShiftedExp = 0x7c00u << 13;
  uint32_t bits = (static_cast<uint32_t>(h) & 0x7fffu) << 13;
  const uint32_t exp = bits & kShiftedExp;
  bits += (127u - 15u) << 23;
  // Inf/NaN: move the exponent to 255, keeping the payload bits.
  const uint32_t inf_nan = bits + ((128u - 16u) << 23);
  // Zero/subnormal: renormalize through one exact float subtraction.
  const float magic = BitsToFloat(113u << 23);
  const uint32_t subnormal = FloatBits(BitsToFloat(bits + (1u << 23)) - magic);
  bits = exp == kShiftedExp ? inf_nan : (exp == 0 ? subnormal : bits);
  return BitsToFloat(bits | ((static_cast<uint32_t>(h) & 0x8000u) << 16));
}

inline uint16_t FloatToHalfImpl(float f) {
  constexpr uint32_t kFloatInf = 255u << 23;
  constexpr uint32_t kHalfOverflow = (127u + 16u) << 23;  // 65536.0f
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = FloatBits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;

  // NaN keeps the top 10 payload bits; if those are all zero, set the quiet
  // bit so that the result is still a NaN and not infinity.
  const uint32_t payload = (u >> 13) & 0x3ffu;
  const uint32_t nan = 0x7c00u | (payload != 0 ? payload : 0x200u);
  const uint32_t inf_nan = u > kFloatInf ? nan : 0x7c00u;
  // Result is zero or subnormal: adding the magic number aligns the 10
  // mantissa bits at the bottom and rounds to nearest even in hardware.
  const uint32_t subnormal =
      FloatBits(BitsToFloat(u) + BitsToFloat(kDenormMagic)) - kDenormMagic;
  // Normal: rebias the exponent and round to nearest even by hand; a carry
  // out of the mantissa correctly rounds up to the next exponent (or Inf).
  const uint32_t mant_odd = (u >> 13) & 1u;
  const uint32_t normal =
      (u + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd) >> 13;

  const uint32_t result =
      u >= kHalfOverflow ? inf_nan : (u < (113u << 23) ? subnormal : normal);
  return static_cast<uint16_t>(result | sign);
}

inline float Bfloat16ToFloatImpl(uint16_t b) {
  return BitsToFloat(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBfloat16Impl(float f) {
  const uint32_t u = FloatBits(f);
  const uint32_t upper = u >> 16;
  // NaN: truncate, keeping sign and payload; force the quiet bit if the
  // payload lived only in the dropped bits.
  const uint32_t nan = (upper & 0x7fu) != 0 ? upper : (upper | 0x40u);
  const uint32_t rounded = (u + 0x7fffu + (upper & 1u)) >> 16;
  const bool is_nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

// ---- Element combiners -----------------------------------------------------

template <typename T>
struct Unsigned {
  using type = T;
};
template <>
struct Unsigned<int8_t> {
  using type = uint8_t;
};
template <>
struct Unsigned<int32_t> {
  using type = uint32_t;
};
template <>
struct Unsigned<int64_t> {
  using type = uint64_t;
};

template <typename T>
struct IntSum {
  T operator()(T x, T y) const {
    using U = typename Unsigned<T>::type;
    return static_cast<T>(
        static_cast<U>(static_cast<U>(x) + static_cast<U>(y)));
  }
};
template <typename T>
struct IntProduct {
  T operator()(T x, T y) const {
    using U = typename Unsigned<T>::type;
    // uint8 promotes to int, where 255 * 255 cannot overflow; wider types
    // multiply as unsigned and wrap.
    return static_cast<T>(
        static_cast<U>(static_cast<U>(x) * static_cast<U>(y)));
  }
};
template <typename T>
struct IntMin {
  T operator()(T x, T y) const { return y < x ? y : x; }
};
template <typename T>
struct IntMax {
  T operator()(T x, T y) const { return x < y ? y : x; }
};

template <typename T>
struct FloatSum {
  T operator()(T x, T y) const { return x + y; }
};
template <typename T>
struct FloatProduct {
  T operator()(T x, T y) const { return x * y; }
};
// NaN-propagating; with no NaN, returns x when x and y compare equal.
template <typename T>
struct FloatMin {
  T operator()(T x, T y) const { return (y < x || y != y) ? y : x; }
};
template <typename T>
struct FloatMax {
  T operator()(T x, T y) const { return (x < y || y != y) ? y : x; }
};

// Lifts a float combiner to a 16-bit storage format.
template <template <typename> class Op, float (*ToFloat)(uint16_t),
          uint16_t (*FromFloat)(float)>
struct Via16 {
  uint16_t operator()(uint16_t x, uint16_t y) const {
    return FromFloat(Op<float>()(ToFloat(x), ToFloat(y)));
  }
};
template <template <typename> class Op>
using HalfOp = Via16<Op, HalfToFloatImpl, FloatToHalfImpl>;
template <template <typename> class Op>
using Bf16Op = Via16<Op, Bfloat16ToFloatImpl, FloatToBfloat16Impl>;

// ---- Loops (see Note [Vectorizable kernels]) --------------------------------

template <typename T, typename Op>
void Distinct(T* __restrict out, const T* __restrict a, const T* __restrict b,
              size_t count) {
  const Op op;
  for (size_t i = 0; i < count; ++i) out[i] = op(a[i], b[i]);
}

template <typename T, typename Op>
void IntoLeft(T* __restrict inout, const T* __restrict b, size_t count) {
  const Op op;
  for (size_t i = 0; i < count; ++i) inout[i] = op(inout[i], b[i]);
}

template <typename T, typename Op>
void IntoRight(T* __restrict inout, const T* __restrict a, size_t count) {
  const Op op;
  for (size_t i = 0; i < count; ++i) inout[i] = op(a[i], inout[i]);
}

template <typename T, typename Op>
void WithSelf(T* __restrict inout, size_t count) {
  const Op op;
  for (size_t i = 0; i < count; ++i) inout[i] = op(inout[i], inout[i]);
}

template <typename T, typename Op>
void Run(void* out, const void* a, const void* b, size_t count) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (o == x && o == y) {
    WithSelf<T, Op>(o, count);
  } else if (o == x) {
    IntoLeft<T, Op>(o, y, count);
  } else if (o == y) {
    IntoRight<T, Op>(o, x, count);
  } else {
    Distinct<T, Op>(o, x, y, count);
  }
}

template <typename T>
void ReduceInt(ReduceOp op, void* out, const void* a, const void* b,
               size_t count) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return Run<T, IntSum<T>>(out, a, b, count);
    case ReduceOp::kMin:
      return Run<T, IntMin<T>>(out, a, b, count);
    case ReduceOp::kMax:
      return Run<T, IntMax<T>>(out, a, b, count);
    case ReduceOp::kProduct:
      return Run<T, IntProduct<T>>(out, a, b, count);
  }
}

template <typename T>
void ReduceFloat(ReduceOp op, void* out, const void* a, const void* b,
                 size_t count) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return Run<T, FloatSum<T>>(out, a, b, count);
    case ReduceOp::kMin:
      return Run<T, FloatMin<T>>(out, a, b, count);
    case ReduceOp::kMax:
      return Run<T, FloatMax<T>>(out, a, b, count);
    case ReduceOp::kProduct:
      return Run<T, FloatProduct<T>>(out, a, b, count);
  }
}

// Note [float16 sums with F16C]
// The portable float16 conversions above do not vectorise at x86-64-v2
// (~1 GB/s). Where the CPU has F16C and AVX (checked once at run time), a
// sum converts 8 halves at a time in hardware instead. The results are the
// same bits: half -> float is exact either way, the float addition is the
// same IEEE operation, and float -> half rounds to nearest even in both.
// The one difference is NaN payloads (hardware quiets signalling NaNs), so
// a block of 8 with a NaN input goes through the portable code.
bool DetectF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool cpu = (ecx & bit_F16C) && (ecx & bit_AVX) && (ecx & bit_OSXSAVE);
  if (!cpu) return false;
  // The OS must save the YMM registers (XCR0 bits 1 and 2).
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 6u) == 6u;
}

bool HasF16c() {
  static const bool has = DetectF16c();
  return has;
}

__attribute__((target("avx,f16c"))) void HalfSumF16c(uint16_t* out,
                                                     const uint16_t* a,
                                                     const uint16_t* b,
                                                     size_t count) {
  const HalfOp<FloatSum> scalar;
  const __m128i magnitude = _mm_set1_epi16(0x7fff);
  const __m128i infinity = _mm_set1_epi16(0x7c00);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i ha = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i));
    const __m128i hb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i));
    // NaN: magnitude above infinity's (both fit in a signed 16-bit compare).
    const __m128i nan =
        _mm_or_si128(_mm_cmpgt_epi16(_mm_and_si128(ha, magnitude), infinity),
                     _mm_cmpgt_epi16(_mm_and_si128(hb, magnitude), infinity));
    if (_mm_movemask_epi8(nan) != 0) {
      for (size_t k = i; k < i + 8; ++k) out[k] = scalar(a[k], b[k]);
      continue;
    }
    const __m256 sum = _mm256_add_ps(_mm256_cvtph_ps(ha), _mm256_cvtph_ps(hb));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(sum, _MM_FROUND_TO_NEAREST_INT));
  }
  for (; i < count; ++i) out[i] = scalar(a[i], b[i]);
}

template <template <template <typename> class> class Lift>
void Reduce16(ReduceOp op, void* out, const void* a, const void* b,
              size_t count) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return Run<uint16_t, Lift<FloatSum>>(out, a, b, count);
    case ReduceOp::kMin:
      return Run<uint16_t, Lift<FloatMin>>(out, a, b, count);
    case ReduceOp::kMax:
      return Run<uint16_t, Lift<FloatMax>>(out, a, b, count);
    case ReduceOp::kProduct:
      return Run<uint16_t, Lift<FloatProduct>>(out, a, b, count);
  }
}

// Note [16-bit sums rounded once]
// Reducing n float16 inputs pairwise rounds every partial result to 16 bits:
// with 4 ranks about a quarter of the sums differ from the float sum
// rounded once. Where one caller sees every input at once (the shared-memory
// backend reads every rank's data), ReduceMany carries each element in float
// through all n inputs and rounds once at the end. It works in blocks of
// kManyBlock elements, so the float accumulator stays on the stack (and in
// L1) and `out` may alias an input: a block is read whole before it is
// written. The order of combination is the inputs' (rank) order, the same on
// every rank, so every rank gets the same bits.
constexpr size_t kManyBlock = 512;

template <template <typename> class Op, float (*ToFloat)(uint16_t),
          uint16_t (*FromFloat)(float)>
void Many16(uint16_t* out, const uint16_t* const* in, size_t n, size_t count) {
  const Op<float> op;
  float acc[kManyBlock];
  for (size_t base = 0; base < count; base += kManyBlock) {
    const size_t m = std::min(kManyBlock, count - base);
    const uint16_t* __restrict first = in[0] + base;
    for (size_t j = 0; j < m; ++j) acc[j] = ToFloat(first[j]);
    for (size_t r = 1; r < n; ++r) {
      const uint16_t* __restrict x = in[r] + base;
      for (size_t j = 0; j < m; ++j) acc[j] = op(acc[j], ToFloat(x[j]));
    }
    uint16_t* __restrict o = out + base;
    for (size_t j = 0; j < m; ++j) o[j] = FromFloat(acc[j]);
  }
}

// Many16<FloatSum, half> with F16C (Note [float16 sums with F16C]): the same
// bits; a group of 8 with a NaN in any input goes through the portable code.
__attribute__((target("avx,f16c"))) void HalfSumManyF16c(
    uint16_t* out, const uint16_t* const* in, size_t n, size_t count) {
  const __m128i magnitude = _mm_set1_epi16(0x7fff);
  const __m128i infinity = _mm_set1_epi16(0x7c00);
  alignas(32) float acc[kManyBlock];
  for (size_t base = 0; base < count; base += kManyBlock) {
    const size_t m = std::min(kManyBlock, count - base);
    const size_t vec = m - m % 8;
    bool nan = false;
    for (size_t j = 0; j < vec; j += 8) {
      const __m128i h =
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(in[0] + base + j));
      __m128i any = _mm_cmpgt_epi16(_mm_and_si128(h, magnitude), infinity);
      __m256 sum = _mm256_cvtph_ps(h);
      for (size_t r = 1; r < n; ++r) {
        const __m128i x =
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(in[r] + base + j));
        any = _mm_or_si128(
            any, _mm_cmpgt_epi16(_mm_and_si128(x, magnitude), infinity));
        sum = _mm256_add_ps(sum, _mm256_cvtph_ps(x));
      }
      nan = nan || _mm_movemask_epi8(any) != 0;
      _mm256_store_ps(acc + j, sum);
    }
    if (nan) {
      // Rare: redo the whole block portably (NaN payloads as Reduce keeps
      // them).
      const uint16_t* block[64];
      std::vector<const uint16_t*> many;
      const uint16_t** at = block;
      if (n > 64) {
        many.resize(n);
        at = many.data();
      }
      for (size_t r = 0; r < n; ++r) at[r] = in[r] + base;
      Many16<FloatSum, HalfToFloatImpl, FloatToHalfImpl>(out + base, at, n, m);
      continue;
    }
    for (size_t j = vec; j < m; ++j) {
      float sum = HalfToFloatImpl(in[0][base + j]);
      for (size_t r = 1; r < n; ++r) sum += HalfToFloatImpl(in[r][base + j]);
      acc[j] = sum;
    }
    for (size_t j = 0; j < vec; j += 8) {
      _mm_storeu_si128(
          reinterpret_cast<__m128i*>(out + base + j),
          _mm256_cvtps_ph(_mm256_load_ps(acc + j), _MM_FROUND_TO_NEAREST_INT));
    }
    for (size_t j = vec; j < m; ++j) out[base + j] = FloatToHalfImpl(acc[j]);
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void ReduceMany16(ReduceOp op, uint16_t* out, const uint16_t* const* in,
                  size_t n, size_t count) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:
      return Many16<FloatSum, ToFloat, FromFloat>(out, in, n, count);
    case ReduceOp::kMin:
      return Many16<FloatMin, ToFloat, FromFloat>(out, in, n, count);
    case ReduceOp::kMax:
      return Many16<FloatMax, ToFloat, FromFloat>(out, in, n, count);
    case ReduceOp::kProduct:
      return Many16<FloatProduct, ToFloat, FromFloat>(out, in, n, count);
  }
}

template <typename T>
void ScaleLoop(T* __restrict data, size_t count, T factor) {
  for (size_t i = 0; i < count; ++i) data[i] *= factor;
}

// Note [Integer scaling]
// An integer tensor is scaled as Horovod scales it (its ScaleBuffer): each
// element times the factor in double, converted back to the element type
// by truncation toward zero. Where C++'s conversion is undefined (a NaN, or
// a value outside the type's range) the result is 0 for NaN and the type's
// nearest limit otherwise, so that every rank computes the same bits.
template <typename T>
void ScaleIntLoop(T* __restrict data, size_t count, double factor) {
  constexpr double kLow = static_cast<double>(std::numeric_limits<T>::min());
  // max() + 1 is a power of two, exact in double; max() itself may not be.
  constexpr double kHighExclusive =
      static_cast<double>(std::numeric_limits<T>::max() / 2 + 1) * 2.0;
  for (size_t i = 0; i < count; ++i) {
    const double v = static_cast<double>(data[i]) * factor;
    if (v != v) {
      data[i] = 0;
    } else if (v <= kLow) {
      data[i] = std::numeric_limits<T>::min();
    } else if (v >= kHighExclusive) {
      data[i] = std::numeric_limits<T>::max();
    } else {
      data[i] = static_cast<T>(v);  // truncates toward zero
    }
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Scale16(uint16_t* __restrict data, size_t count, float factor) {
  for (size_t i = 0; i < count; ++i) {
    data[i] = FromFloat(ToFloat(data[i]) * factor);
  }
}

}  // namespace

void Reduce(ReduceOp op, DataType dtype, void* out, const void* a,
            const void* b, size_t count) {
  if (count == 0) return;
  switch (dtype) {
    case DataType::kUint8:
      return ReduceInt<uint8_t>(op, out, a, b, count);
    case DataType::kInt8:
      return ReduceInt<int8_t>(op, out, a, b, count);
    case DataType::kInt16:
      return ReduceInt<int16_t>(op, out, a, b, count);
    case DataType::kBool:
      // Never reduced: negotiation refuses reductions of bool.
      assert(false && "Reduce() on bool");
      return;
    case DataType::kInt32:
      return ReduceInt<int32_t>(op, out, a, b, count);
    case DataType::kInt64:
      return ReduceInt<int64_t>(op, out, a, b, count);
    case DataType::kFloat16:
      if ((op == ReduceOp::kSum || op == ReduceOp::kAverage) && HasF16c()) {
        // Loads a block before storing it: `out` may alias `a` or `b`.
        return HalfSumF16c(static_cast<uint16_t*>(out),
                           static_cast<const uint16_t*>(a),
                           static_cast<const uint16_t*>(b), count);
      }
      return Reduce16<HalfOp>(op, out, a, b, count);
    case DataType::kBfloat16:
      return Reduce16<Bf16Op>(op, out, a, b, count);
    case DataType::kFloat32:
      return ReduceFloat<float>(op, out, a, b, count);
    case DataType::kFloat64:
      return ReduceFloat<double>(op, out, a, b, count);
  }
}

void ReduceMany(ReduceOp op, DataType dtype, void* out,
                const void* const* inputs, size_t n, size_t count) {
  assert(n >= 1);
  if (count == 0) return;
  if (dtype == DataType::kFloat16 || dtype == DataType::kBfloat16) {
    uint16_t* o = static_cast<uint16_t*>(out);
    const uint16_t* const* in =
        reinterpret_cast<const uint16_t* const*>(inputs);
    if (dtype == DataType::kBfloat16) {
      return ReduceMany16<Bfloat16ToFloatImpl, FloatToBfloat16Impl>(op, o, in,
                                                                    n, count);
    }
    if ((op == ReduceOp::kSum || op == ReduceOp::kAverage) && HasF16c()) {
      return HalfSumManyF16c(o, in, n, count);
    }
    return ReduceMany16<HalfToFloatImpl, FloatToHalfImpl>(op, o, in, n, count);
  }
  if (n == 1) {
    if (out != inputs[0]) {
      std::memmove(out, inputs[0], count * DataTypeSize(dtype));
    }
    return;
  }
  Reduce(op, dtype, out, inputs[0], inputs[1], count);
  for (size_t r = 2; r < n; ++r) Reduce(op, dtype, out, out, inputs[r], count);
}

void Scale(DataType dtype, void* data, size_t count, double factor) {
  switch (dtype) {
    case DataType::kFloat16:
      return Scale16<HalfToFloatImpl, FloatToHalfImpl>(
          static_cast<uint16_t*>(data), count, static_cast<float>(factor));
    case DataType::kBfloat16:
      return Scale16<Bfloat16ToFloatImpl, FloatToBfloat16Impl>(
          static_cast<uint16_t*>(data), count, static_cast<float>(factor));
    case DataType::kFloat32:
      return ScaleLoop(static_cast<float*>(data), count,
                       static_cast<float>(factor));
    case DataType::kFloat64:
      return ScaleLoop(static_cast<double*>(data), count, factor);
    // Note [Integer scaling].
    case DataType::kUint8:
      return ScaleIntLoop(static_cast<uint8_t*>(data), count, factor);
    case DataType::kInt8:
      return ScaleIntLoop(static_cast<int8_t*>(data), count, factor);
    case DataType::kInt16:
      return ScaleIntLoop(static_cast<int16_t*>(data), count, factor);
    case DataType::kInt32:
      return ScaleIntLoop(static_cast<int32_t*>(data), count, factor);
    case DataType::kInt64:
      return ScaleIntLoop(static_cast<int64_t*>(data), count, factor);
    case DataType::kBool:
      // Never reduced: negotiation refuses reductions of bool.
      assert(false && "Scale() on bool");
      return;
  }
}

float HalfToFloat(uint16_t h) { return HalfToFloatImpl(h); }
uint16_t FloatToHalf(float f) { return FloatToHalfImpl(f); }
float Bfloat16ToFloat(uint16_t b) { return Bfloat16ToFloatImpl(b); }
uint16_t FloatToBfloat16(float f) { return FloatToBfloat16Impl(f); }

}  // namespace cpu
}  // namespace kolo
