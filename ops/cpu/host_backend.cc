#include "ops/cpu/host_backend.h"

#include "ops/cpu/reduce.h"

namespace kolo {
namespace cpu {

void HostBackend::Combine(void* out, const void* in, size_t count,
                          DataType dtype, ReduceOp op) {
  Reduce(op, dtype, out, out, in, count);
}

void HostBackend::Scale(void* data, size_t count, DataType dtype,
                        double factor) {
  cpu::Scale(dtype, data, count, factor);
}

}  // namespace cpu
}  // namespace kolo
