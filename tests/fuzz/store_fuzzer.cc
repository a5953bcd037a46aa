// Fuzzes kolo's own ports end to end: a real TCP store server (the same
// framing and authentication as the control channel). Each input is split
// in two: the first byte picks the attack; the rest is sent as raw bytes
// before the handshake, as raw bytes after a valid handshake, or as the
// payload of a correctly authenticated frame (reaching the request parser).
// The server must survive and keep answering.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "runtime/net/socket.h"
#include "runtime/rendezvous/tcp_store.h"
#include "tests/testing/raw_protocol.h"

namespace {

constexpr char kSecret[] = "fuzz-secret-0123456789abcdef";

kolo::rendezvous::TcpStoreServer& Server() {
  static auto* server = [] {
    auto s = kolo::rendezvous::TcpStoreServer::Start("127.0.0.1", 0, kSecret);
    if (!s.ok()) abort();
    return s->release();
  }();
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  kolo::rendezvous::TcpStoreServer& server = Server();
  auto socket = kolo::net::Socket::Connect("127.0.0.1", server.port(),
                                           absl::Now() + absl::Seconds(5));
  if (!socket.ok()) abort();
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  std::string bytes;
  switch (data[0] % 3) {
    case 0:
      bytes = body;  // instead of the handshake
      break;
    case 1: {
      if (kolo::testing::RawClientHandshake(*socket, kSecret).empty()) abort();
      bytes = body;  // unauthenticated frame bytes
      break;
    }
    default: {
      const std::string key = kolo::testing::RawClientHandshake(*socket, kSecret);
      if (key.empty()) abort();
      bytes = kolo::testing::EncodeFrame(key, 1, 0, body);
      break;
    }
  }
  socket->SendAll(bytes.data(), bytes.size(), deadline).IgnoreError();
  socket->ShutdownBoth();
  // The server stays up and keeps serving authenticated clients.
  static int checks = 0;
  if (++checks % 256 == 0) {
    auto client = kolo::rendezvous::ConnectTcpStore("127.0.0.1", server.port(),
                                                    kSecret, absl::Seconds(5));
    if (!client.ok() || !(*client)->Set("alive", "1").ok()) abort();
  }
  return 0;
}
