// Copying bytes between a rank's buffers and shared memory.
//
// Note [Copies without REP MOVSB]
// glibc's memcpy (2.36, Debian 12) uses the REP MOVSB instruction for sizes
// from about 2 KB up to a CPU-dependent limit (the L2 size on AMD). On some
// processors REP MOVSB becomes many times slower when the destination is
// not aligned the way it likes (reported for AMD Zen 3 and Zen 4, fixed in
// later glibc versions by not using it there), and a rank's tensors are
// wherever the framework put them (malloc returns 16-byte aligned memory).
// A bandwidth cliff of exactly that shape was measured in the shm backend
// on one machine: 1.2-1.5 GB/s for allreduces whose copies fell in that
// window, 13 GB/s once they outgrew it. Where REP MOVSB is fast it is the
// better copy between cores (it need not read the lines it overwrites
// whole), so Copy() measures once, at its first call (about 1 ms), whether
// memcpy is more than twice as slow as a loop of plain vector loads and
// stores (the destination aligned first) for such a copy, and uses the
// loop from then on only if it is. Either copy moves the same bytes: the
// results do not depend on the choice.
// Thread safety: a pure function.
#ifndef KOLO_OPS_CPU_COPY_H_
#define KOLO_OPS_CPU_COPY_H_

#include <cstddef>
#include <vector>

namespace kolo {
namespace cpu {

// Copies `bytes` from `from` to `to` (not overlapping), like memcpy.
void Copy(void* to, const void* from, size_t bytes);
// Whether Copy() found memcpy slow here and copies with vectors (for
// benchmarks and diagnostics).
bool CopyAvoidsMemcpy();

// For tests and benchmarks: the vector widths (bytes) this CPU can copy
// with, and Copy()'s vector loop with one of them.
std::vector<int> VectorCopyWidths();
void CopyWithVectors(void* to, const void* from, size_t bytes, int width);

}  // namespace cpu
}  // namespace kolo

#endif  // KOLO_OPS_CPU_COPY_H_
