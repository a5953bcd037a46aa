// Fuzzes kolo's own ports end to end: a real TCP store server (the same
// framing and authentication as the control channel). The first byte of
// an input picks the attack; the rest is
//   0: raw bytes instead of the handshake;
//   1: raw bytes after a valid handshake;
//   2: the payload of one correctly authenticated frame (reaching the
//      request parser);
//   3: several authenticated frames sent at once (the rest cut at its 0x00
//      bytes), so that the server takes many frames from one read and parks
//      some of them;
//   4: no server: the bytes of an authenticated frame holding the rest,
//      followed by the rest itself as raw bytes, fed to
//      SecureChannel::Open() in pieces whose sizes come from the input;
//      Open must take exactly the frame, then reject or wait on the rest,
//      never read past what it was given.
// The server must survive and keep answering authenticated clients.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "runtime/net/secure_channel.h"
#include "runtime/net/socket.h"
#include "runtime/rendezvous/tcp_store.h"
#include "runtime/wire.pb.h"
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

// A server-side channel and the key of its hand-driven client, for Open().
struct OpenTarget {
  std::unique_ptr<kolo::net::SecureChannel> channel;
  std::string key;
};

OpenTarget MakeOpenTarget() {
  auto listener = kolo::net::Listener::Bind("127.0.0.1", 0);
  if (!listener.ok()) abort();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  auto client =
      kolo::net::Socket::Connect("127.0.0.1", listener->port(), deadline);
  if (!client.ok()) abort();
  auto accepted = listener->Accept(deadline);
  if (!accepted.ok()) abort();
  OpenTarget target;
  std::thread server([&] {
    auto channel = kolo::net::SecureChannel::Server(std::move(*accepted),
                                                    kSecret, deadline, 4096);
    if (!channel.ok()) abort();
    target.channel = std::move(*channel);
  });
  target.key = kolo::testing::RawClientHandshake(*client, kSecret);
  server.join();
  if (target.key.empty()) abort();
  return target;
}

std::string StoreFrame(const std::string& key, uint64_t seq,
                       const std::string& body) {
  kolo::wire::StoreRequest request;
  // Every fourth piece a GET or WAIT of a key nobody sets, with a short
  // timeout: it parks and holds the frames behind it.
  switch (body.size() % 4) {
    case 0:
      request.set_op(kolo::wire::STORE_GET);
      request.set_key(body);
      request.set_timeout_ms(body.size() % 3);
      break;
    case 1:
      request.set_op(kolo::wire::STORE_SET);
      request.set_key(body.substr(0, 8));
      request.set_value(body);
      break;
    case 2:
      request.set_op(kolo::wire::STORE_WAIT);
      request.add_keys(body);
      request.set_timeout_ms(1);
      break;
    default:
      // Not a StoreRequest at all, most likely: answered InvalidArgument.
      return kolo::testing::EncodeFrame(key, 1, seq, body);
  }
  std::string bytes;
  request.SerializeToString(&bytes);
  return kolo::testing::EncodeFrame(key, 1, seq, bytes);
}

void FuzzOpen(const std::string& body) {
  static OpenTarget* target = new OpenTarget(MakeOpenTarget());
  // The channel's receive sequence only moves on an accepted frame: a fresh
  // channel per input would cost a handshake each, so the frame carries the
  // number the channel expects next.
  static uint64_t next_seq = 0;
  const std::string payload = body.substr(0, 4096);
  const std::string frame =
      kolo::testing::EncodeFrame(target->key, 1, next_seq, payload);
  const std::string bytes = frame + body;
  size_t given = 0;
  size_t cut = 0;
  bool opened = false;
  while (given < bytes.size()) {
    given =
        std::min(bytes.size(),
                 given + 1 + static_cast<uint8_t>(bytes[cut++ % bytes.size()]));
    auto result =
        target->channel->Open(absl::string_view(bytes).substr(0, given));
    if (!result.ok()) abort();  // The frame is valid.
    if (result->consumed == 0) continue;
    if (result->consumed != frame.size() || result->payload != payload) abort();
    opened = true;
    ++next_seq;
    break;
  }
  if (!opened) abort();
  // What follows is garbage to the channel: rejected or incomplete, never
  // accepted (it cannot carry a valid MAC), never read out of bounds.
  auto rest = target->channel->Open(body);
  if (rest.ok() && rest->consumed != 0) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 5 == 4) {
    FuzzOpen(body);
    return 0;
  }
  kolo::rendezvous::TcpStoreServer& server = Server();
  auto socket = kolo::net::Socket::Connect("127.0.0.1", server.port(),
                                           absl::Now() + absl::Seconds(5));
  if (!socket.ok()) abort();
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  std::string bytes;
  switch (data[0] % 5) {
    case 0:
      bytes = body;  // instead of the handshake
      break;
    case 1: {
      if (kolo::testing::RawClientHandshake(*socket, kSecret).empty()) abort();
      bytes = body;  // unauthenticated frame bytes
      break;
    }
    case 2: {
      const std::string key =
          kolo::testing::RawClientHandshake(*socket, kSecret);
      if (key.empty()) abort();
      bytes = kolo::testing::EncodeFrame(key, 1, 0, body);
      break;
    }
    default: {
      const std::string key =
          kolo::testing::RawClientHandshake(*socket, kSecret);
      if (key.empty()) abort();
      uint64_t seq = 0;
      size_t start = 0;
      for (size_t i = 0; i <= body.size(); ++i) {
        if (i == body.size() || body[i] == '\0') {
          bytes += StoreFrame(key, seq++, body.substr(start, i - start));
          start = i + 1;
        }
      }
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
