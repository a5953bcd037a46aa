// CPU reduction kernels for every kolo::DataType.
//
// float16 and bfloat16 are stored as 16 bits and reduced by converting each
// pair of elements to float, combining in float and rounding back to the
// nearest even 16-bit value (never by byte copy or integer arithmetic).
// Thread safety: pure functions.
#ifndef KOLO_OPS_CPU_REDUCE_H_
#define KOLO_OPS_CPU_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "kolo/types.h"

namespace kolo {
namespace cpu {

// out[i] = op(a[i], b[i]) for i < count. `out` may alias `a` or `b`.
// kAverage combines like kSum (the division is a separate Scale step).
void Reduce(ReduceOp op, DataType dtype, void* out, const void* a,
            const void* b, size_t count);

// out[i] = op(inputs[0][i], inputs[1][i], ..., inputs[n-1][i]), combined
// in input order, for i < count; n >= 1. float16 and bfloat16 are carried in
// float across all n inputs and rounded to 16 bits once (Note [16-bit sums
// rounded once] in reduce.cc), so that the result is what one rounding of
// the float result gives, not n - 1 roundings; every other dtype combines
// exactly as n - 1 calls of Reduce() would. `out` may alias inputs[0] or
// inputs[1] (the same elements), not a later input.
void ReduceMany(ReduceOp op, DataType dtype, void* out,
                const void* const* inputs, size_t n, size_t count);

// data[i] *= factor, computed in double for float64 and the integer types,
// float otherwise (float16/bfloat16 converted to float and back). Integers
// are truncated toward zero and clamped to their range (Note [Integer
// scaling] in reduce.cc); bool is never scaled.
void Scale(DataType dtype, void* data, size_t count, double factor);

// IEEE half / bfloat16 conversions (round to nearest even; NaN preserved).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
float Bfloat16ToFloat(uint16_t b);
uint16_t FloatToBfloat16(float f);

}  // namespace cpu
}  // namespace kolo

#endif  // KOLO_OPS_CPU_REDUCE_H_
