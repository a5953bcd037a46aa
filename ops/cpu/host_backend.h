// HostBackend: the base of the backends whose collectives work on host
// memory (gloo, shm, shm+gloo). Their element-wise steps are the CPU
// kernels of reduce.h, once for all of them; the device methods keep
// Backend's host-memory defaults (memcpy, operator new).
//
// Thread safety: as Backend (runtime/loop/backend.h); Combine and Scale touch
// only their arguments.
#ifndef KOLO_OPS_CPU_HOST_BACKEND_H_
#define KOLO_OPS_CPU_HOST_BACKEND_H_

#include <cstddef>

#include "kolo/types.h"
#include "runtime/loop/backend.h"

namespace kolo {
namespace cpu {

class HostBackend : public Backend {
 public:
  // out[i] = op(out[i], in[i]) with cpu::Reduce.
  void Combine(void* out, const void* in, size_t count, DataType dtype,
               ReduceOp op) final;
  // data[i] *= factor with cpu::Scale (floating point dtypes).
  void Scale(void* data, size_t count, DataType dtype, double factor) final;
};

}  // namespace cpu
}  // namespace kolo

#endif  // KOLO_OPS_CPU_HOST_BACKEND_H_
