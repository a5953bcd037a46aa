#include "runtime/net/secure_channel.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "runtime/net/socket.h"
#include "tests/testing/raw_protocol.h"

namespace kolo {
namespace net {
namespace {

// Everything here that speaks the protocol by hand follows Note [Handshake
// and frames] in secure_channel.h, independently of secure_channel.cc: the
// tests check the implementation against the written protocol.

constexpr char kSecret[] = "test-secret-0123456789";

absl::Time In(absl::Duration d) { return absl::Now() + d; }

using testing::BigEndian;
using testing::EncodeFrame;
using testing::Hmac;

// A TCP connection whose server end is `server_socket` and client end a raw
// socket (for hand-written protocol bytes).
struct RawPair {
  Socket client;
  Socket server;
};

RawPair ConnectRaw() {
  absl::StatusOr<Listener> listener = Listener::Bind("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok()) << listener.status();
  absl::StatusOr<Socket> client =
      Socket::Connect("127.0.0.1", listener->port(), In(absl::Seconds(10)));
  EXPECT_TRUE(client.ok()) << client.status();
  absl::StatusOr<Socket> server = listener->Accept(In(absl::Seconds(10)));
  EXPECT_TRUE(server.ok()) << server.status();
  return RawPair{std::move(*client), std::move(*server)};
}

struct Channels {
  absl::StatusOr<std::unique_ptr<SecureChannel>> client =
      absl::UnknownError("not run");
  absl::StatusOr<std::unique_ptr<SecureChannel>> server =
      absl::UnknownError("not run");
};

Channels Handshake(
    const std::string& client_secret, const std::string& server_secret,
    size_t max_frame_bytes = SecureChannel::kDefaultMaxFrameBytes) {
  RawPair raw = ConnectRaw();
  Channels channels;
  std::thread server([&] {
    channels.server =
        SecureChannel::Server(std::move(raw.server), server_secret,
                              In(absl::Seconds(10)), max_frame_bytes);
  });
  channels.client =
      SecureChannel::Client(std::move(raw.client), client_secret,
                            In(absl::Seconds(10)), max_frame_bytes);
  server.join();
  return channels;
}

std::string RawClientHandshake(Socket& socket, const std::string& secret) {
  std::string key = testing::RawClientHandshake(socket, secret);
  EXPECT_FALSE(key.empty()) << "the server did not complete the handshake";
  return key;
}

// A SecureChannel server talking to a hand-driven raw client.
struct RawClientSession {
  std::unique_ptr<SecureChannel> server;
  Socket client;
  std::string key;
};

RawClientSession StartRawClientSession(
    size_t max_frame_bytes = SecureChannel::kDefaultMaxFrameBytes) {
  RawPair raw = ConnectRaw();
  RawClientSession session;
  absl::StatusOr<std::unique_ptr<SecureChannel>> server =
      absl::UnknownError("not run");
  std::thread server_thread([&] {
    server = SecureChannel::Server(std::move(raw.server), kSecret,
                                   In(absl::Seconds(10)), max_frame_bytes);
  });
  session.key = RawClientHandshake(raw.client, kSecret);
  server_thread.join();
  EXPECT_TRUE(server.ok()) << server.status();
  session.server = std::move(*server);
  session.client = std::move(raw.client);
  return session;
}

void SendRaw(Socket& socket, const std::string& bytes) {
  ASSERT_TRUE(
      socket.SendAll(bytes.data(), bytes.size(), In(absl::Seconds(10))).ok());
}

TEST(SecureChannelTest, ManyFramesBothWays) {
  Channels c = Handshake(kSecret, kSecret);
  ASSERT_TRUE(c.client.ok()) << c.client.status();
  ASSERT_TRUE(c.server.ok()) << c.server.status();
  SecureChannel& client = **c.client;
  SecureChannel& server = **c.server;
  for (int i = 0; i < 500; ++i) {
    std::string message(i % 97, static_cast<char>('a' + i % 26));
    ASSERT_TRUE(client.Send(message, In(absl::Seconds(5))).ok());
    absl::StatusOr<std::string> got = server.Receive(In(absl::Seconds(5)));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, message);
    ASSERT_TRUE(server.Send(message + "!", In(absl::Seconds(5))).ok());
    got = client.Receive(In(absl::Seconds(5)));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, message + "!");
  }
}

TEST(SecureChannelTest, ManyFramesInFlight) {
  Channels c = Handshake(kSecret, kSecret);
  ASSERT_TRUE(c.client.ok() && c.server.ok());
  std::thread sender([&] {
    for (int i = 0; i < 2000; ++i) {
      ASSERT_TRUE((*c.client)->Send(std::to_string(i)).ok());
    }
  });
  for (int i = 0; i < 2000; ++i) {
    absl::StatusOr<std::string> got =
        (*c.server)->Receive(In(absl::Seconds(10)));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, std::to_string(i));
  }
  sender.join();
}

TEST(SecureChannelTest, LargeAndEmptyFrames) {
  Channels c = Handshake(kSecret, kSecret);
  ASSERT_TRUE(c.client.ok() && c.server.ok());
  std::string large(24 << 20, '\0');
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<char>(i * 7);
  absl::Status sent;
  std::thread sender([&] {
    sent = (*c.client)->Send(large, In(absl::Seconds(60)));
    if (sent.ok()) sent = (*c.client)->Send("", In(absl::Seconds(60)));
  });
  absl::StatusOr<std::string> got = (*c.server)->Receive(In(absl::Seconds(60)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == large);
  got = (*c.server)->Receive(In(absl::Seconds(60)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "");
  sender.join();
  EXPECT_TRUE(sent.ok()) << sent;
}

TEST(SecureChannelTest, FramesMatchTheWrittenProtocol) {
  RawClientSession s = StartRawClientSession();
  // Raw client -> channel.
  SendRaw(s.client, EncodeFrame(s.key, 1, 0, "from raw"));
  absl::StatusOr<std::string> got = s.server->Receive(In(absl::Seconds(5)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "from raw");
  // Channel -> raw client: byte-for-byte what the Note says (dir 2).
  ASSERT_TRUE(s.server->Send("from channel").ok());
  std::string expected = EncodeFrame(s.key, 2, 0, "from channel");
  std::string bytes(expected.size(), '\0');
  ASSERT_TRUE(
      s.client.RecvAll(&bytes[0], bytes.size(), In(absl::Seconds(5))).ok());
  EXPECT_EQ(bytes, expected);
}

TEST(SecureChannelTest, WrongSecretFailsOnBothSides) {
  Channels c = Handshake("client-secret", "server-secret");
  ASSERT_FALSE(c.client.ok());
  ASSERT_FALSE(c.server.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(c.client.status())) << c.client.status();
  EXPECT_TRUE(absl::IsPermissionDenied(c.server.status())) << c.server.status();
  EXPECT_TRUE(
      absl::StartsWith(c.client.status().message(), "authentication failed"))
      << c.client.status();
  EXPECT_TRUE(
      absl::StartsWith(c.server.status().message(), "authentication failed"))
      << c.server.status();
  // The secrets never appear in errors.
  for (const absl::Status& st : {c.client.status(), c.server.status()}) {
    EXPECT_FALSE(absl::StrContains(st.message(), "client-secret")) << st;
    EXPECT_FALSE(absl::StrContains(st.message(), "server-secret")) << st;
  }
}

TEST(SecureChannelTest, ServerWithoutTheSecretIsRejectedByClient) {
  // An impostor server: sends a nonce, then a proof it cannot compute.
  RawPair raw = ConnectRaw();
  std::thread impostor([&] {
    std::string ns(32, 'n');
    SendRaw(raw.server, ns);
    std::string answer(64, '\0');
    ASSERT_TRUE(raw.server.RecvAll(&answer[0], 64, In(absl::Seconds(10))).ok());
    SendRaw(raw.server, std::string(32, 'p'));
  });
  absl::StatusOr<std::unique_ptr<SecureChannel>> client = SecureChannel::Client(
      std::move(raw.client), kSecret, In(absl::Seconds(10)));
  impostor.join();
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(client.status())) << client.status();
  EXPECT_TRUE(
      absl::StartsWith(client.status().message(), "authentication failed"))
      << client.status();
}

TEST(SecureChannelTest, ClientWithoutTheSecretIsRejectedByServer) {
  RawPair raw = ConnectRaw();
  absl::StatusOr<std::unique_ptr<SecureChannel>> server =
      absl::UnknownError("not run");
  std::thread server_thread([&] {
    server = SecureChannel::Server(std::move(raw.server), kSecret,
                                   In(absl::Seconds(10)));
  });
  std::string ns(32, '\0');
  ASSERT_TRUE(raw.client.RecvAll(&ns[0], 32, In(absl::Seconds(10))).ok());
  SendRaw(raw.client, std::string(64, 'g'));
  // The server hangs up without a proof of its own.
  char byte;
  absl::Status st = raw.client.RecvAll(&byte, 1, In(absl::Seconds(10)));
  server_thread.join();
  EXPECT_TRUE(absl::IsUnavailable(st)) << st;
  ASSERT_FALSE(server.ok());
  EXPECT_TRUE(absl::IsPermissionDenied(server.status())) << server.status();
  EXPECT_TRUE(
      absl::StartsWith(server.status().message(), "authentication failed"))
      << server.status();
}

TEST(SecureChannelTest, HandshakeDeadline) {
  RawPair raw = ConnectRaw();
  // The raw client never answers the server's nonce.
  absl::StatusOr<std::unique_ptr<SecureChannel>> server = SecureChannel::Server(
      std::move(raw.server), kSecret, In(absl::Milliseconds(200)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(server.status())) << server.status();
}

TEST(SecureChannelTest, EmptySecretIsRejected) {
  RawPair raw = ConnectRaw();
  EXPECT_TRUE(absl::IsInvalidArgument(
      SecureChannel::Client(std::move(raw.client), "", In(absl::Seconds(1)))
          .status()));
}

TEST(SecureChannelTest, OversizedLengthIsRejectedBeforeThePayload) {
  RawClientSession s = StartRawClientSession();
  // Only a header: if the server tried to read 2^31-1 payload bytes it would
  // wait out its deadline instead of failing at once.
  SendRaw(s.client, BigEndian(0x7fffffffu, 4) + BigEndian(0, 8));
  absl::StatusOr<std::string> got = s.server->Receive(In(absl::Seconds(30)));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  // The connection is closed afterwards.
  char byte;
  EXPECT_TRUE(
      absl::IsUnavailable(s.client.RecvAll(&byte, 1, In(absl::Seconds(10)))));
}

TEST(SecureChannelTest, FrameCapIsConfigurable) {
  RawClientSession s = StartRawClientSession(/*max_frame_bytes=*/1024);
  SendRaw(s.client, EncodeFrame(s.key, 1, 0, std::string(1024, 'x')));
  absl::StatusOr<std::string> got = s.server->Receive(In(absl::Seconds(5)));
  ASSERT_TRUE(got.ok()) << got.status();
  SendRaw(s.client, EncodeFrame(s.key, 1, 1, std::string(1025, 'x')));
  got = s.server->Receive(In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  // And Send refuses what the peer would reject.
  EXPECT_TRUE(absl::IsInvalidArgument(s.server->Send(std::string(1025, 'y'))));
}

TEST(SecureChannelTest, TamperedMacIsDataLoss) {
  RawClientSession s = StartRawClientSession();
  std::string frame = EncodeFrame(s.key, 1, 0, "payload");
  frame.back() ^= 0x01;
  SendRaw(s.client, frame);
  absl::StatusOr<std::string> got = s.server->Receive(In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
}

TEST(SecureChannelTest, TamperedPayloadIsDataLoss) {
  RawClientSession s = StartRawClientSession();
  std::string frame = EncodeFrame(s.key, 1, 0, "payload");
  frame[12] ^= 0x01;  // First payload byte.
  SendRaw(s.client, frame);
  absl::StatusOr<std::string> got = s.server->Receive(In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
}

TEST(SecureChannelTest, ReflectedFrameIsDataLoss) {
  RawClientSession s = StartRawClientSession();
  // A valid server->client frame sent back to the server.
  SendRaw(s.client, EncodeFrame(s.key, 2, 0, "reflected"));
  absl::StatusOr<std::string> got = s.server->Receive(In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
}

TEST(SecureChannelTest, ReplayedFrameIsDataLoss) {
  RawClientSession s = StartRawClientSession();
  std::string frame = EncodeFrame(s.key, 1, 0, "transfer 100");
  SendRaw(s.client, frame);
  absl::StatusOr<std::string> got = s.server->Receive(In(absl::Seconds(5)));
  ASSERT_TRUE(got.ok()) << got.status();
  SendRaw(s.client, frame);
  got = s.server->Receive(In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
}

TEST(SecureChannelTest, FrameReplayedOnAnotherConnectionIsDataLoss) {
  RawClientSession first = StartRawClientSession();
  std::string frame = EncodeFrame(first.key, 1, 0, "transfer 100");
  RawClientSession second = StartRawClientSession();
  SendRaw(second.client, frame);  // Right sequence, wrong session key.
  absl::StatusOr<std::string> got =
      second.server->Receive(In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
}

TEST(SecureChannelTest, ReceiveDeadlineLeavesTheChannelUsable) {
  Channels c = Handshake(kSecret, kSecret);
  ASSERT_TRUE(c.client.ok() && c.server.ok());
  absl::StatusOr<std::string> got =
      (*c.server)->Receive(In(absl::Milliseconds(100)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(got.status())) << got.status();
  ASSERT_TRUE((*c.client)->Send("late").ok());
  got = (*c.server)->Receive(In(absl::Seconds(5)));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "late");
}

TEST(SecureChannelTest, EofIsUnavailable) {
  Channels c = Handshake(kSecret, kSecret);
  ASSERT_TRUE(c.client.ok() && c.server.ok());
  c.client->reset();
  absl::StatusOr<std::string> got = (*c.server)->Receive(In(absl::Seconds(5)));
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_TRUE(absl::StartsWith(got.status().message(), "connection closed"))
      << got.status();
}

TEST(SecureChannelTest, ShutdownUnblocksReceive) {
  Channels c = Handshake(kSecret, kSecret);
  ASSERT_TRUE(c.client.ok() && c.server.ok());
  absl::StatusOr<std::string> got = absl::UnknownError("not run");
  std::thread receiver([&] { got = (*c.server)->Receive(); });
  (*c.server)->Shutdown();
  receiver.join();
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_TRUE(absl::IsUnavailable((*c.server)->Send("after shutdown")));
}

// Seal() writes what the Note says, byte for byte (the MACs are those of
// OpenSSL's HMAC in raw_protocol.h), across the coalescing threshold, and
// shares the sequence numbers with Send().
TEST(SecureChannelTest, SealMatchesTheWrittenProtocolAndSend) {
  RawClientSession s = StartRawClientSession();
  uint64_t seq = 0;
  for (size_t size : {0, 1, 100, 16 << 10, (16 << 10) + 1, 1 << 20}) {
    std::string payload(size, '\0');
    for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>(i * 13);
    absl::StatusOr<std::string> frame = s.server->Seal(payload);
    ASSERT_TRUE(frame.ok()) << frame.status();
    EXPECT_TRUE(*frame == EncodeFrame(s.key, 2, seq++, payload)) << size;
    // Send() goes on with the next number.
    ASSERT_TRUE(s.server->Send(payload, In(absl::Seconds(10))).ok());
    const std::string expected = EncodeFrame(s.key, 2, seq++, payload);
    std::string sent(expected.size(), '\0');
    ASSERT_TRUE(
        s.client.RecvAll(&sent[0], sent.size(), In(absl::Seconds(10))).ok());
    EXPECT_TRUE(sent == expected) << size;
  }
  EXPECT_TRUE(absl::IsInvalidArgument(
      s.server->Seal(std::string(SecureChannel::kDefaultMaxFrameBytes + 1, 'x'))
          .status()));
  s.server->Shutdown();
  EXPECT_TRUE(absl::IsUnavailable(s.server->Seal("late").status()));
}

// Open() takes nothing until a frame is complete, however the bytes are
// cut, and then exactly one frame.
TEST(SecureChannelTest, OpenIsIncremental) {
  RawClientSession s = StartRawClientSession();
  const std::string bytes = EncodeFrame(s.key, 1, 0, "first") +
                            EncodeFrame(s.key, 1, 1, "") +
                            EncodeFrame(s.key, 1, 2, std::string(70000, 'z'));
  std::vector<std::string> payloads;
  std::string buffer;
  for (char c : bytes) {
    buffer.push_back(c);
    absl::StatusOr<SecureChannel::Opened> opened = s.server->Open(buffer);
    ASSERT_TRUE(opened.ok()) << opened.status();
    if (opened->consumed > 0) {
      EXPECT_EQ(opened->consumed, buffer.size());
      payloads.push_back(opened->payload);
      buffer.clear();
    }
  }
  ASSERT_EQ(payloads.size(), 3u);
  EXPECT_EQ(payloads[0], "first");
  EXPECT_EQ(payloads[1], "");
  EXPECT_EQ(payloads[2], std::string(70000, 'z'));
  // Two frames in one buffer: one at a time.
  buffer = EncodeFrame(s.key, 1, 3, "a") + EncodeFrame(s.key, 1, 4, "b");
  absl::StatusOr<SecureChannel::Opened> opened = s.server->Open(buffer);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->payload, "a");
  opened = s.server->Open(absl::string_view(buffer).substr(opened->consumed));
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->payload, "b");
  EXPECT_EQ(s.server->fd() >= 0, true);
}

// Hostile bytes: Open() fails as Receive() does, with the same message
// (but for the peer's port), and a forged length fails on the header alone.
TEST(SecureChannelTest, OpenRejectsWhatReceiveRejects) {
  auto frame_with_bad_mac = [](const std::string& key) {
    std::string frame = EncodeFrame(key, 1, 0, "payload");
    frame.back() ^= 0x01;
    return frame;
  };
  const std::vector<
      std::pair<const char*, std::function<std::string(const std::string&)>>>
      attacks = {
          {"huge length",
           [](const std::string&) {
             return BigEndian(0x7fffffffu, 4) + BigEndian(0, 8);
           }},
          {"wrong sequence",
           [](const std::string& key) {
             return EncodeFrame(key, 1, 5, "payload");
           }},
          {"bad MAC", frame_with_bad_mac},
          {"reflected",
           [](const std::string& key) {
             return EncodeFrame(key, 2, 0, "payload");
           }},
      };
  for (const auto& [name, attack] : attacks) {
    SCOPED_TRACE(name);
    RawClientSession blocking = StartRawClientSession();
    SendRaw(blocking.client, attack(blocking.key));
    absl::StatusOr<std::string> received =
        blocking.server->Receive(In(absl::Seconds(10)));
    ASSERT_TRUE(absl::IsDataLoss(received.status())) << received.status();

    RawClientSession polled = StartRawClientSession();
    absl::StatusOr<SecureChannel::Opened> opened =
        polled.server->Open(attack(polled.key));
    ASSERT_TRUE(absl::IsDataLoss(opened.status())) << opened.status();
    EXPECT_EQ(absl::StrReplaceAll(opened.status().message(),
                                  {{polled.server->PeerAddress(), "PEER"}}),
              absl::StrReplaceAll(received.status().message(),
                                  {{blocking.server->PeerAddress(), "PEER"}}));
    EXPECT_TRUE(absl::StrContains(opened.status().message(),
                                  polled.server->PeerAddress()));
  }
}

TEST(SecureChannelTest, GenerateSecret) {
  std::string a = GenerateSecret();
  std::string b = GenerateSecret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);
}

}  // namespace
}  // namespace net
}  // namespace kolo
