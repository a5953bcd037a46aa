// Cost of one frame MAC: the OpenSSL code the channel used before (an
// EVP_MAC_CTX set up per frame) against kolo's HmacSha256 with the key's
// padded states precomputed once per session.
//
//   bazel run //tests/runtime/net:mac_bench
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "runtime/net/sha256.h"

namespace {

// What secure_channel.cc did before (HmacSha256 over OpenSSL 3's EVP_MAC).
std::string OpenSslFrameMac(EVP_MAC* algorithm, const std::string& key,
                            const std::string& fields,
                            const std::string& payload) {
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(algorithm);
  char digest_name[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
      OSSL_PARAM_construct_end()};
  EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()),
               key.size(), params);
  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(fields.data()),
                 fields.size());
  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(payload.data()),
                 payload.size());
  std::string out(32, '\0');
  size_t out_len = 0;
  EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(&out[0]), &out_len,
                out.size());
  EVP_MAC_CTX_free(ctx);
  return out;
}

template <typename F>
double NanosPerCall(F&& f, size_t payload_bytes) {
  // Enough calls for ~0.3 s at either speed.
  const int calls = static_cast<int>(std::max<size_t>(
      200, std::min<size_t>(2000000, (300u << 20) / (payload_bytes + 64))));
  volatile char sink = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) sink = sink + f()[0];
  const auto end = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(end - start).count() / calls;
}

}  // namespace

int main() {
  EVP_MAC* algorithm = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  const std::string key(32, 'k');
  const std::string fields(13, 'f');
  const kolo::net::HmacSha256 session(key);
  std::printf("SHA extensions: %s\n",
              kolo::net::sha256_internal::HaveShaExtensions() ? "yes" : "no");
  std::printf("%10s %16s %16s %16s %8s\n", "payload", "openssl ns/frame",
              "kolo ns/frame", "kolo MB/s", "speedup");
  for (size_t size : {0, 64, 1024, 16 << 10, 1 << 20, 16 << 20}) {
    const std::string payload(size, 'p');
    if (OpenSslFrameMac(algorithm, key, fields, payload) !=
        session.MacString({fields, payload})) {
      std::printf("MISMATCH at %zu bytes\n", size);
      return 1;
    }
    const double old_ns = NanosPerCall(
        [&] { return OpenSslFrameMac(algorithm, key, fields, payload); }, size);
    const double new_ns = NanosPerCall(
        [&] {
          return session.Mac({fields, payload});
        },
        size);
    std::printf("%10zu %16.0f %16.0f %16.0f %7.2fx\n", size, old_ns, new_ns,
                (size + 13) / new_ns * 1e3, old_ns / new_ns);
  }
  EVP_MAC_free(algorithm);
  return 0;
}
