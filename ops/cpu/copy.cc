#include "ops/cpu/copy.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kolo {
namespace cpu {
namespace {

// Below this, memcpy's short-copy paths (no REP MOVSB) are the fastest.
constexpr size_t kVectorCopyBytes = 2048;

#if defined(__x86_64__)
// 32-byte vectors; the destination is aligned to 64 bytes after a first,
// unaligned 64 bytes (which the aligned loop then partly rewrites).
__attribute__((target("avx2"))) void CopyAvx2(uint8_t* to, const uint8_t* from,
                                              size_t bytes) {
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(to) & 63)) & 63;
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(to),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from)));
  _mm256_storeu_si256(
      reinterpret_cast<__m256i*>(to + 32),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 32)));
  to += head;
  from += head;
  bytes -= head;
  while (bytes >= 128) {
    const __m256i a =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
    const __m256i b =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 32));
    const __m256i c =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 64));
    const __m256i d =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 96));
    _mm256_store_si256(reinterpret_cast<__m256i*>(to), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(to + 32), b);
    _mm256_store_si256(reinterpret_cast<__m256i*>(to + 64), c);
    _mm256_store_si256(reinterpret_cast<__m256i*>(to + 96), d);
    to += 128;
    from += 128;
    bytes -= 128;
  }
  std::memcpy(to, from, bytes);  // < 128 bytes: no REP MOVSB.
}

// 64-byte vectors where the CPU has them: as fast as memcpy at every size
// measured (Zen 5, docs/benchmarks.md).
__attribute__((target("avx512f"))) void CopyAvx512(uint8_t* to,
                                                   const uint8_t* from,
                                                   size_t bytes) {
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(to) & 63)) & 63;
  _mm512_storeu_si512(to, _mm512_loadu_si512(from));
  to += head;
  from += head;
  bytes -= head;
  while (bytes >= 256) {
    const __m512i a = _mm512_loadu_si512(from);
    const __m512i b = _mm512_loadu_si512(from + 64);
    const __m512i c = _mm512_loadu_si512(from + 128);
    const __m512i d = _mm512_loadu_si512(from + 192);
    _mm512_store_si512(to, a);
    _mm512_store_si512(to + 64, b);
    _mm512_store_si512(to + 128, c);
    _mm512_store_si512(to + 192, d);
    to += 256;
    from += 256;
    bytes -= 256;
  }
  std::memcpy(to, from, bytes);  // < 256 bytes: no REP MOVSB.
}

// The same with 16-byte SSE2 vectors (every x86-64).
void CopySse2(uint8_t* to, const uint8_t* from, size_t bytes) {
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(to) & 63)) & 63;
  for (int i = 0; i < 4; ++i) {
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(to + 16 * i),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 16 * i)));
  }
  to += head;
  from += head;
  bytes -= head;
  while (bytes >= 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 16));
    const __m128i c =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 32));
    const __m128i d =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(from + 48));
    _mm_store_si128(reinterpret_cast<__m128i*>(to), a);
    _mm_store_si128(reinterpret_cast<__m128i*>(to + 16), b);
    _mm_store_si128(reinterpret_cast<__m128i*>(to + 32), c);
    _mm_store_si128(reinterpret_cast<__m128i*>(to + 48), d);
    to += 64;
    from += 64;
    bytes -= 64;
  }
  std::memcpy(to, from, bytes);
}

enum class Isa { kSse2, kAvx2, kAvx512 };

Isa BestIsa() {
  static const Isa isa = __builtin_cpu_supports("avx512f") ? Isa::kAvx512
                         : __builtin_cpu_supports("avx2")  ? Isa::kAvx2
                                                           : Isa::kSse2;
  return isa;
}

void VectorCopy(uint8_t* out, const uint8_t* in, size_t bytes, Isa isa) {
  switch (isa) {
    case Isa::kAvx512:
      CopyAvx512(out, in, bytes);
      return;
    case Isa::kAvx2:
      CopyAvx2(out, in, bytes);
      return;
    case Isa::kSse2:
      CopySse2(out, in, bytes);
      return;
  }
}

void VectorCopy(uint8_t* out, const uint8_t* in, size_t bytes) {
  VectorCopy(out, in, bytes, BestIsa());
}

// Nanoseconds of the fastest of `rounds` copies of `bytes` by `copy`.
template <typename F>
int64_t FastestCopyNs(F copy, int rounds) {
  int64_t best = INT64_MAX;
  for (int i = 0; i < rounds; ++i) {
    const auto start = std::chrono::steady_clock::now();
    copy();
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
    best = std::min(best, ns);
  }
  return best;
}

// Note [Copies without REP MOVSB], measured: whether memcpy is much slower
// than the vector loop on this CPU for the copies the shm backend makes (a
// few hundred KB to a destination aligned to 16 bytes, as malloc's are).
// Where REP MOVSB is fast it is the better copy (it skips reading lines it
// overwrites whole), so the vector loop is taken only on clear evidence.
bool MemcpyIsSlowHere() {
  constexpr size_t kProbeBytes = 256 << 10;
  constexpr int kRounds = 8;
  std::vector<uint8_t> from(kProbeBytes + 64, 1), to(kProbeBytes + 128, 2);
  uint8_t* out =
      to.data() + (64 - (reinterpret_cast<uintptr_t>(to.data()) & 63)) + 16;
  const uint8_t* in = from.data();
  const int64_t libc = FastestCopyNs(
      [&] {
        std::memcpy(out, in, kProbeBytes);
        asm volatile("" : : "r"(out) : "memory");
      },
      kRounds);
  const int64_t vector = FastestCopyNs(
      [&] {
        VectorCopy(out, in, kProbeBytes);
        asm volatile("" : : "r"(out) : "memory");
      },
      kRounds);
  return libc > 2 * vector;
}
#endif

}  // namespace

void Copy(void* to, const void* from, size_t bytes) {
#if defined(__x86_64__)
  static const bool vector_copy = MemcpyIsSlowHere();
  if (vector_copy && bytes >= kVectorCopyBytes) {
    VectorCopy(static_cast<uint8_t*>(to), static_cast<const uint8_t*>(from),
               bytes);
    return;
  }
#endif
  std::memcpy(to, from, bytes);
}

std::vector<int> VectorCopyWidths() {
  std::vector<int> widths;
#if defined(__x86_64__)
  widths.push_back(16);
  if (BestIsa() != Isa::kSse2) widths.push_back(32);
  if (BestIsa() == Isa::kAvx512) widths.push_back(64);
#endif
  return widths;
}

void CopyWithVectors(void* to, const void* from, size_t bytes, int width) {
#if defined(__x86_64__)
  if (bytes >= kVectorCopyBytes) {
    const Isa isa = width == 64   ? Isa::kAvx512
                    : width == 32 ? Isa::kAvx2
                                  : Isa::kSse2;
    VectorCopy(static_cast<uint8_t*>(to), static_cast<const uint8_t*>(from),
               bytes, isa);
    return;
  }
#endif
  std::memcpy(to, from, bytes);
}

bool CopyAvoidsMemcpy() {
#if defined(__x86_64__)
  static const bool vector_copy = MemcpyIsSlowHere();
  return vector_copy;
#else
  return false;
#endif
}

}  // namespace cpu
}  // namespace kolo
