// SHA-256 (FIPS 180-4) and HMAC-SHA256 (RFC 2104), kolo's own, for the
// authenticated framing of runtime/net/secure_channel.h.
//
// Note [No library state on kolo's threads]
// The control channel's threads (readers, heartbeats) may still be running
// when a program returns from main after a kolo error. A MAC computed by a
// library that keeps process-wide state (OpenSSL's providers, locks and
// thread-local caches, torn down by its atexit handler) then touches freed
// state and crashes the exit. So the MAC is computed here, from plain
// values: no static mutable state, no allocation, no locks. The only
// static is a trivially destructible constant: whether the CPU has the SHA
// extensions, decided once (a CPUID instruction traps to the hypervisor in
// a VM, so it is not asked per hash).
//
// HmacSha256 absorbs the padded key once (the inner and outer states after
// the first block); a MAC then costs the payload's blocks plus two
// compressions, instead of a library context set up per frame.
//
// Thread safety: Sha256 and HmacSha256 are values; a const HmacSha256 may be
// used by several threads at once (Mac() copies the precomputed states).
#ifndef KOLO_RUNTIME_NET_SHA256_H_
#define KOLO_RUNTIME_NET_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "absl/strings/string_view.h"

namespace kolo {
namespace net {

class Sha256 {
 public:
  static constexpr size_t kDigestBytes = 32;
  static constexpr size_t kBlockBytes = 64;
  using Digest = std::array<uint8_t, kDigestBytes>;

  Sha256();

  void Update(const void* data, size_t len);
  void Update(absl::string_view data) { Update(data.data(), data.size()); }
  // The digest of everything given to Update(); the object is spent.
  Digest Finish();

  static Digest Hash(absl::string_view data);

 private:
  uint32_t state_[8];
  uint64_t total_bytes_ = 0;
  uint8_t buffer_[kBlockBytes];
  size_t buffered_ = 0;
};

class HmacSha256 {
 public:
  // Keys longer than a block are hashed first (RFC 2104).
  explicit HmacSha256(absl::string_view key);

  // HMAC over the concatenation of `pieces`.
  Sha256::Digest Mac(std::initializer_list<absl::string_view> pieces) const;
  std::string MacString(std::initializer_list<absl::string_view> pieces) const;

 private:
  Sha256 inner_;  // after absorbing key ^ ipad
  Sha256 outer_;  // after absorbing key ^ opad
};

// Compares without an early exit, so that the time taken does not tell an
// attacker how many leading bytes of a MAC were right.
bool ConstantTimeEqual(absl::string_view a, absl::string_view b);

namespace sha256_internal {

// The compression function over `blocks` 64-byte blocks, portable and with
// the x86 SHA extensions; Sha256 picks one. For tests.
void CompressPortable(uint32_t state[8], const uint8_t* data, size_t blocks);
// Only where HaveShaExtensions().
void CompressShaExtensions(uint32_t state[8], const uint8_t* data,
                           size_t blocks);
bool HaveShaExtensions();

}  // namespace sha256_internal

}  // namespace net
}  // namespace kolo

#endif  // KOLO_RUNTIME_NET_SHA256_H_
