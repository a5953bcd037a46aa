#include "runtime/net/sha256.h"

#include <string.h>  // explicit_bzero

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace kolo {
namespace net {
namespace sha256_internal {
namespace {

// FIPS 180-4, 4.2.2: the first 32 bits of the fractional parts of the cube
// roots of the first 64 primes.
constexpr uint32_t kRoundConstants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
    0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
    0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
    0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
    0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t RotateRight(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

inline uint32_t LoadBigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) |
         (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

void CompressPortable(uint32_t state[8], const uint8_t* data, size_t blocks) {
  for (; blocks > 0; --blocks, data += Sha256::kBlockBytes) {
    // FIPS 180-4, 6.2.2.
    uint32_t w[64];
    for (int t = 0; t < 16; ++t) w[t] = LoadBigEndian32(data + 4 * t);
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = RotateRight(w[t - 15], 7) ^
                          RotateRight(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = RotateRight(w[t - 2], 17) ^
                          RotateRight(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t sigma1 =
          RotateRight(e, 6) ^ RotateRight(e, 11) ^ RotateRight(e, 25);
      const uint32_t choose = (e & f) ^ (~e & g);
      const uint32_t t1 = h + sigma1 + choose + kRoundConstants[t] + w[t];
      const uint32_t sigma0 =
          RotateRight(a, 2) ^ RotateRight(a, 13) ^ RotateRight(a, 22);
      const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = sigma0 + majority;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
  }
}

#if defined(__x86_64__)

bool HaveShaExtensions() {
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool ssse3 = (ecx & (1u << 9)) != 0;
  const bool sse41 = (ecx & (1u << 19)) != 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool sha = (ebx & (1u << 29)) != 0;
  return ssse3 && sse41 && sha;
}

// The SHA extensions work on the state as two registers, ABEF and CDGH
// (Intel's "SHA extensions" white paper); each sha256rnds2 does two rounds.
__attribute__((target("sha,sse4.1,ssse3"))) void CompressShaExtensions(
    uint32_t state[8], const uint8_t* data, size_t blocks) {
  // Byte-swaps each 32-bit word: the message words are big endian.
  const __m128i kByteSwap =
      _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));
  __m128i state1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));
  tmp = _mm_shuffle_epi32(tmp, 0xB1);                // CDAB
  state1 = _mm_shuffle_epi32(state1, 0x1B);          // EFGH
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);  // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);       // CDGH

  for (; blocks > 0; --blocks, data += Sha256::kBlockBytes) {
    const __m128i abef_before = state0;
    const __m128i cdgh_before = state1;
    __m128i w[4];  // the schedule's last 16 words, four per register
#pragma GCC unroll 16
    for (int group = 0; group < 16; ++group) {
      __m128i& current = w[group % 4];
      if (group < 4) {
        current = _mm_shuffle_epi8(
            _mm_loadu_si128(
                reinterpret_cast<const __m128i*>(data + 16 * group)),
            kByteSwap);
      } else {
        // W[t] = W[t-16] + s0(W[t-15]) + W[t-7] + s1(W[t-2]), four at once.
        const __m128i& minus4 = w[group % 4];        // W[t-16..t-13]
        const __m128i& minus3 = w[(group + 1) % 4];  // W[t-12..t-9]
        const __m128i& minus2 = w[(group + 2) % 4];  // W[t-8..t-5]
        const __m128i& minus1 = w[(group + 3) % 4];  // W[t-4..t-1]
        __m128i next = _mm_sha256msg1_epu32(minus4, minus3);
        next = _mm_add_epi32(next, _mm_alignr_epi8(minus1, minus2, 4));
        current = _mm_sha256msg2_epu32(next, minus1);
      }
      __m128i message = _mm_add_epi32(
          current, _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                       &kRoundConstants[4 * group])));
      state1 = _mm_sha256rnds2_epu32(state1, state0, message);
      message = _mm_shuffle_epi32(message, 0x0E);
      state0 = _mm_sha256rnds2_epu32(state0, state1, message);
    }
    state0 = _mm_add_epi32(state0, abef_before);
    state1 = _mm_add_epi32(state1, cdgh_before);
  }

  tmp = _mm_shuffle_epi32(state0, 0x1B);        // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);     // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0);  // DCBA
  state1 = _mm_alignr_epi8(state1, tmp, 8);     // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), state1);
}

#else  // !defined(__x86_64__)

bool HaveShaExtensions() { return false; }

void CompressShaExtensions(uint32_t state[8], const uint8_t* data,
                           size_t blocks) {
  CompressPortable(state, data, blocks);
}

#endif

}  // namespace sha256_internal

namespace {

using CompressFunction = void (*)(uint32_t*, const uint8_t*, size_t);

// See Note [No library state on kolo's threads]: a constant, decided once.
CompressFunction Compress() {
  static const CompressFunction compress =
      sha256_internal::HaveShaExtensions()
          ? sha256_internal::CompressShaExtensions
          : sha256_internal::CompressPortable;
  return compress;
}

}  // namespace

Sha256::Sha256()
    // FIPS 180-4, 5.3.3.
    : state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::Update(const void* data, size_t len) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  total_bytes_ += len;
  if (buffered_ > 0) {
    const size_t take = std::min(len, kBlockBytes - buffered_);
    std::memcpy(buffer_ + buffered_, p, take);
    buffered_ += take;
    p += take;
    len -= take;
    if (buffered_ < kBlockBytes) return;
    Compress()(state_, buffer_, 1);
    buffered_ = 0;
  }
  if (len >= kBlockBytes) {
    const size_t blocks = len / kBlockBytes;
    Compress()(state_, p, blocks);
    p += blocks * kBlockBytes;
    len -= blocks * kBlockBytes;
  }
  if (len > 0) {
    std::memcpy(buffer_, p, len);
    buffered_ = len;
  }
}

Sha256::Digest Sha256::Finish() {
  // FIPS 180-4, 5.1.1: a 1 bit, zeros up to 56 mod 64, the bit length.
  const uint64_t bits = total_bytes_ * 8;
  uint8_t padding[kBlockBytes + 8] = {0x80};
  const size_t zeros_to = buffered_ < 56 ? 56 : 56 + kBlockBytes;
  size_t padding_len = zeros_to - buffered_;
  for (int i = 0; i < 8; ++i) {
    padding[padding_len + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  }
  padding_len += 8;
  Update(padding, padding_len);
  Digest digest;
  for (int i = 0; i < 8; ++i) {
    digest[4 * i] = static_cast<uint8_t>(state_[i] >> 24);
    digest[4 * i + 1] = static_cast<uint8_t>(state_[i] >> 16);
    digest[4 * i + 2] = static_cast<uint8_t>(state_[i] >> 8);
    digest[4 * i + 3] = static_cast<uint8_t>(state_[i]);
  }
  return digest;
}

Sha256::Digest Sha256::Hash(absl::string_view data) {
  Sha256 hash;
  hash.Update(data);
  return hash.Finish();
}

HmacSha256::HmacSha256(absl::string_view key) {
  uint8_t block[Sha256::kBlockBytes] = {0};
  if (key.size() > Sha256::kBlockBytes) {
    const Sha256::Digest hashed = Sha256::Hash(key);
    std::memcpy(block, hashed.data(), hashed.size());
  } else {
    std::memcpy(block, key.data(), key.size());
  }
  uint8_t pad[Sha256::kBlockBytes];
  for (size_t i = 0; i < sizeof(pad); ++i) pad[i] = block[i] ^ 0x36;
  inner_.Update(pad, sizeof(pad));
  for (size_t i = 0; i < sizeof(pad); ++i) pad[i] = block[i] ^ 0x5c;
  outer_.Update(pad, sizeof(pad));
  // Keep copies of the key out of freed stack memory.
  explicit_bzero(block, sizeof(block));
  explicit_bzero(pad, sizeof(pad));
}

Sha256::Digest HmacSha256::Mac(
    std::initializer_list<absl::string_view> pieces) const {
  Sha256 inner = inner_;
  for (absl::string_view piece : pieces) inner.Update(piece);
  const Sha256::Digest inner_digest = inner.Finish();
  Sha256 outer = outer_;
  outer.Update(inner_digest.data(), inner_digest.size());
  return outer.Finish();
}

std::string HmacSha256::MacString(
    std::initializer_list<absl::string_view> pieces) const {
  const Sha256::Digest digest = Mac(pieces);
  return std::string(reinterpret_cast<const char*>(digest.data()),
                     digest.size());
}

bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  // volatile: the compiler may not turn the loop into an early-exit memcmp.
  volatile uint8_t difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = difference | static_cast<uint8_t>(a[i] ^ b[i]);
  }
  return difference == 0;
}

}  // namespace net
}  // namespace kolo
