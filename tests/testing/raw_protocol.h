// kolo's authenticated framing spoken by hand (Note [Handshake and frames]
// in runtime/net/secure_channel.h), independently of secure_channel.cc: for
// tests that check the implementation against the written protocol and for
// tests that send hostile bytes.
#ifndef KOLO_TESTS_TESTING_RAW_PROTOCOL_H_
#define KOLO_TESTS_TESTING_RAW_PROTOCOL_H_

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "runtime/net/socket.h"

namespace kolo {
namespace testing {

inline std::string Hmac(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out,
       &len);
  return std::string(reinterpret_cast<char*>(out), len);
}

inline std::string BigEndian(uint64_t v, int bytes) {
  std::string out(bytes, '\0');
  for (int i = bytes - 1; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  return out;
}

// One frame as the Note describes it; dir 1 = client->server.
inline std::string EncodeFrame(const std::string& key, uint8_t dir,
                               uint64_t seq, const std::string& payload) {
  std::string length = BigEndian(payload.size(), 4);
  std::string sequence = BigEndian(seq, 8);
  std::string mac = Hmac(key, std::string(1, static_cast<char>(dir)) +
                                  sequence + length + payload);
  return length + sequence + payload + mac;
}

// The client side of the handshake by hand. Returns the session key, or ""
// if the server did not prove it holds the secret; the socket stays raw so
// the caller can write any bytes.
inline std::string RawClientHandshake(net::Socket& socket,
                                      const std::string& secret) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  std::string ns(32, '\0');
  if (!socket.RecvAll(&ns[0], 32, deadline).ok()) return "";
  std::string nc(32, '\0');
  RAND_bytes(reinterpret_cast<unsigned char*>(&nc[0]), 32);
  std::string answer = nc + Hmac(secret, "kolo-client" + ns + nc);
  if (!socket.SendAll(answer.data(), answer.size(), deadline).ok()) return "";
  std::string server_proof(32, '\0');
  if (!socket.RecvAll(&server_proof[0], 32, deadline).ok()) return "";
  if (server_proof != Hmac(secret, "kolo-server" + nc + ns)) return "";
  return Hmac(secret, "kolo-session" + ns + nc);
}

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_TESTING_RAW_PROTOCOL_H_
