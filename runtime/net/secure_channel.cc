#include "runtime/net/secure_channel.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace kolo {
namespace net {

// See Note [Handshake and frames] in the header for the protocol.

namespace {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;        // HMAC-SHA256
constexpr size_t kHeaderBytes = 4 + 8;  // u32 length | u64 sequence

// Labels that keep the three handshake MACs from standing in for each other.
constexpr absl::string_view kClientLabel = "kolo-client";
constexpr absl::string_view kServerLabel = "kolo-server";
constexpr absl::string_view kSessionLabel = "kolo-session";

// The `dir` byte of a frame's MAC: a frame reflected back at its sender
// fails authentication.
constexpr unsigned char kDirClientToServer = 0x01;
constexpr unsigned char kDirServerToClient = 0x02;

// Below this size a frame goes out in one send() (header, payload and MAC
// in one segment); above it the copy would cost more than the extra calls.
constexpr size_t kCoalesceBytes = 16 << 10;

// The HMAC algorithm object, fetched once: fetching takes a lock inside
// OpenSSL and the object is immutable and shared by every thread.
EVP_MAC* HmacAlgorithm() {
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  return mac;
}

// HMAC-SHA256 over the concatenation of `pieces`.
absl::StatusOr<std::string> HmacSha256(
    absl::string_view key, std::initializer_list<absl::string_view> pieces) {
  EVP_MAC* algorithm = HmacAlgorithm();
  if (algorithm == nullptr) {
    return absl::InternalError("OpenSSL provides no HMAC implementation");
  }
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(algorithm);
  if (ctx == nullptr) return absl::InternalError("EVP_MAC_CTX_new failed");
  char digest_name[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
      OSSL_PARAM_construct_end()};
  bool ok =
      EVP_MAC_init(ctx, reinterpret_cast<const unsigned char*>(key.data()),
                   key.size(), params) == 1;
  for (absl::string_view piece : pieces) {
    if (!ok) break;
    ok = EVP_MAC_update(ctx,
                        reinterpret_cast<const unsigned char*>(piece.data()),
                        piece.size()) == 1;
  }
  std::string out(kMacBytes, '\0');
  size_t out_len = 0;
  ok = ok && EVP_MAC_final(ctx, reinterpret_cast<unsigned char*>(&out[0]),
                           &out_len, out.size()) == 1;
  EVP_MAC_CTX_free(ctx);
  if (!ok || out_len != kMacBytes) {
    return absl::InternalError("HMAC-SHA256 computation failed");
  }
  return out;
}

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(&out[0]),
                 static_cast<int>(n)) != 1) {
    return absl::InternalError("RAND_bytes failed");
  }
  return out;
}

bool ConstantTimeEqual(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

void PutBigEndian32(uint32_t v, char* out) {
  for (int i = 3; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

void PutBigEndian64(uint64_t v, char* out) {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
}

uint64_t GetBigEndian(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v = (v << 8) | static_cast<unsigned char>(in[i]);
  }
  return v;
}

// MAC of one frame: HMAC(K, dir || sequence || length || payload).
absl::StatusOr<std::string> FrameMac(absl::string_view session_key,
                                     unsigned char dir, uint64_t sequence,
                                     absl::string_view payload) {
  char fields[1 + 8 + 4];
  fields[0] = static_cast<char>(dir);
  PutBigEndian64(sequence, fields + 1);
  PutBigEndian32(static_cast<uint32_t>(payload.size()), fields + 9);
  return HmacSha256(session_key,
                    {absl::string_view(fields, sizeof(fields)), payload});
}

absl::Status CheckSecret(const std::string& secret) {
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        "the job secret is empty: an empty secret authenticates nobody");
  }
  return absl::OkStatus();
}

absl::Status HandshakeError(const absl::Status& status,
                            const std::string& peer) {
  return absl::Status(status.code(), absl::StrCat("handshake with ",
                                                  peer.empty() ? "peer" : peer,
                                                  ": ", status.message()));
}

}  // namespace

SecureChannel::SecureChannel(Socket socket, std::string session_key,
                             bool is_client, size_t max_frame_bytes)
    : socket_(std::move(socket)),
      session_key_(std::move(session_key)),
      is_client_(is_client),
      max_frame_bytes_(max_frame_bytes) {}

absl::StatusOr<std::unique_ptr<SecureChannel>> SecureChannel::Client(
    Socket socket, const std::string& secret, absl::Time deadline,
    size_t max_frame_bytes) {
  absl::Status valid = CheckSecret(secret);
  if (!valid.ok()) return valid;
  const std::string peer = socket.PeerAddress();

  std::string server_nonce(kNonceBytes, '\0');
  absl::Status st = socket.RecvAll(&server_nonce[0], kNonceBytes, deadline);
  if (!st.ok()) return HandshakeError(st, peer);

  absl::StatusOr<std::string> client_nonce = RandomBytes(kNonceBytes);
  if (!client_nonce.ok()) return client_nonce.status();
  absl::StatusOr<std::string> proof =
      HmacSha256(secret, {kClientLabel, server_nonce, *client_nonce});
  if (!proof.ok()) return proof.status();
  std::string message = *client_nonce + *proof;
  st = socket.SendAll(message.data(), message.size(), deadline);
  if (!st.ok()) return HandshakeError(st, peer);

  std::string server_proof(kMacBytes, '\0');
  st = socket.RecvAll(&server_proof[0], kMacBytes, deadline);
  if (absl::IsUnavailable(st)) {
    // The server hangs up without a word when our proof does not check:
    // the protocol has no rejection message, so that gives nothing away.
    return absl::PermissionDeniedError(absl::StrCat(
        "authentication failed: ", peer,
        " closed the connection during the handshake (does it hold the "
        "same job secret?)"));
  }
  if (!st.ok()) return HandshakeError(st, peer);
  absl::StatusOr<std::string> expected =
      HmacSha256(secret, {kServerLabel, *client_nonce, server_nonce});
  if (!expected.ok()) return expected.status();
  if (!ConstantTimeEqual(server_proof, *expected)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "authentication failed: ", peer, " did not prove the job secret"));
  }

  absl::StatusOr<std::string> key =
      HmacSha256(secret, {kSessionLabel, server_nonce, *client_nonce});
  if (!key.ok()) return key.status();
  return std::unique_ptr<SecureChannel>(new SecureChannel(
      std::move(socket), std::move(*key), /*is_client=*/true, max_frame_bytes));
}

absl::StatusOr<std::unique_ptr<SecureChannel>> SecureChannel::Server(
    Socket socket, const std::string& secret, absl::Time deadline,
    size_t max_frame_bytes) {
  absl::Status valid = CheckSecret(secret);
  if (!valid.ok()) return valid;
  absl::StatusOr<std::string> server_nonce = ServerHello(socket, deadline);
  if (!server_nonce.ok()) return server_nonce.status();
  std::string answer(kClientAnswerBytes, '\0');
  absl::Status st = socket.RecvAll(&answer[0], answer.size(), deadline);
  if (!st.ok()) return HandshakeError(st, socket.PeerAddress());
  return ServerFinish(std::move(socket), secret, *server_nonce, answer,
                      deadline, max_frame_bytes);
}

absl::StatusOr<std::string> SecureChannel::ServerHello(Socket& socket,
                                                       absl::Time deadline) {
  absl::StatusOr<std::string> server_nonce = RandomBytes(kNonceBytes);
  if (!server_nonce.ok()) return server_nonce.status();
  absl::Status st = socket.SendAll(server_nonce->data(), kNonceBytes, deadline);
  if (!st.ok()) return HandshakeError(st, socket.PeerAddress());
  return server_nonce;
}

absl::StatusOr<std::unique_ptr<SecureChannel>> SecureChannel::ServerFinish(
    Socket socket, const std::string& secret, const std::string& server_nonce,
    const std::string& answer, absl::Time deadline, size_t max_frame_bytes) {
  static_assert(kClientAnswerBytes == kNonceBytes + kMacBytes,
                "answer = client nonce + proof");
  absl::Status valid = CheckSecret(secret);
  if (!valid.ok()) return valid;
  const std::string peer = socket.PeerAddress();
  if (answer.size() != kClientAnswerBytes) {
    return absl::PermissionDeniedError(
        absl::StrCat("authentication failed: ", peer.empty() ? "peer" : peer,
                     " sent a malformed handshake"));
  }
  absl::string_view client_nonce(answer.data(), kNonceBytes);
  absl::string_view client_proof(answer.data() + kNonceBytes, kMacBytes);

  absl::StatusOr<std::string> expected =
      HmacSha256(secret, {kClientLabel, server_nonce, client_nonce});
  if (!expected.ok()) return expected.status();
  if (!ConstantTimeEqual(client_proof, *expected)) {
    // Close without answering (the socket goes with this scope).
    return absl::PermissionDeniedError(
        absl::StrCat("authentication failed: ", peer.empty() ? "peer" : peer,
                     " did not prove the job secret"));
  }

  absl::StatusOr<std::string> server_proof =
      HmacSha256(secret, {kServerLabel, client_nonce, server_nonce});
  if (!server_proof.ok()) return server_proof.status();
  absl::Status st = socket.SendAll(server_proof->data(), kMacBytes, deadline);
  if (!st.ok()) return HandshakeError(st, peer);

  absl::StatusOr<std::string> key =
      HmacSha256(secret, {kSessionLabel, server_nonce, client_nonce});
  if (!key.ok()) return key.status();
  return std::unique_ptr<SecureChannel>(
      new SecureChannel(std::move(socket), std::move(*key), /*is_client=*/false,
                        max_frame_bytes));
}

absl::Status SecureChannel::Send(absl::string_view payload,
                                 absl::Time deadline) {
  if (payload.size() > max_frame_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", payload.size(), " bytes exceeds the ",
                     max_frame_bytes_, "-byte limit"));
  }
  if (shut_down_.load()) {
    return absl::UnavailableError("connection closed (channel shut down)");
  }
  std::lock_guard<std::mutex> lock(send_mu_);
  const unsigned char dir =
      is_client_ ? kDirClientToServer : kDirServerToClient;
  absl::StatusOr<std::string> mac =
      FrameMac(session_key_, dir, send_seq_, payload);
  if (!mac.ok()) return mac.status();
  char header[kHeaderBytes];
  PutBigEndian32(static_cast<uint32_t>(payload.size()), header);
  PutBigEndian64(send_seq_, header + 4);

  absl::Status st;
  if (payload.size() <= kCoalesceBytes) {
    std::string frame;
    frame.reserve(kHeaderBytes + payload.size() + kMacBytes);
    frame.append(header, kHeaderBytes);
    frame.append(payload.data(), payload.size());
    frame.append(*mac);
    st = socket_.SendAll(frame.data(), frame.size(), deadline);
  } else {
    st = socket_.SendAll(header, kHeaderBytes, deadline);
    if (st.ok()) st = socket_.SendAll(payload.data(), payload.size(), deadline);
    if (st.ok()) st = socket_.SendAll(mac->data(), mac->size(), deadline);
  }
  if (!st.ok()) {
    // Part of a frame may be out: the stream cannot be resynchronised.
    socket_.ShutdownBoth();
    return st;
  }
  ++send_seq_;
  return absl::OkStatus();
}

absl::StatusOr<std::string> SecureChannel::Receive(absl::Time deadline) {
  if (shut_down_.load()) {
    return absl::UnavailableError("connection closed (channel shut down)");
  }
  // Waiting for the first byte separately keeps the channel usable when the
  // deadline passes with nothing sent; once a frame has started, any
  // failure leaves the stream torn and the connection is closed.
  absl::Status st = socket_.WaitReadable(deadline);
  if (!st.ok()) return st;
  auto fail = [this](absl::Status status) {
    socket_.ShutdownBoth();
    if (shut_down_.load()) {
      return absl::UnavailableError("connection closed (channel shut down)");
    }
    return status;
  };

  char header[kHeaderBytes];
  st = socket_.RecvAll(header, kHeaderBytes, deadline);
  if (!st.ok()) return fail(st);
  const uint64_t length = GetBigEndian(header, 4);
  const uint64_t sequence = GetBigEndian(header + 4, 8);
  const std::string peer = socket_.PeerAddress();
  // Checked before reading on: a forged length must not make us allocate
  // or wait for gigabytes.
  if (length > max_frame_bytes_) {
    return fail(absl::DataLossError(
        absl::StrCat("frame of ", length, " bytes from ", peer, " exceeds the ",
                     max_frame_bytes_, "-byte limit; connection closed")));
  }
  if (sequence != recv_seq_) {
    return fail(absl::DataLossError(absl::StrCat(
        "frame from ", peer, " has sequence number ", sequence, ", expected ",
        recv_seq_, " (replayed or lost frame); connection closed")));
  }
  std::string payload(length, '\0');
  if (length > 0) {
    st = socket_.RecvAll(&payload[0], length, deadline);
    if (!st.ok()) return fail(st);
  }
  char mac[kMacBytes];
  st = socket_.RecvAll(mac, kMacBytes, deadline);
  if (!st.ok()) return fail(st);

  const unsigned char dir =
      is_client_ ? kDirServerToClient : kDirClientToServer;
  absl::StatusOr<std::string> expected =
      FrameMac(session_key_, dir, recv_seq_, payload);
  if (!expected.ok()) return fail(expected.status());
  if (!ConstantTimeEqual(absl::string_view(mac, kMacBytes), *expected)) {
    return fail(absl::DataLossError(
        absl::StrCat("frame from ", peer,
                     " failed authentication (bad MAC); connection closed")));
  }
  ++recv_seq_;
  return payload;
}

void SecureChannel::Shutdown() {
  shut_down_.store(true);
  socket_.ShutdownBoth();
}

std::string GenerateSecret() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
    // Without randomness there is no safe secret to hand out, and this
    // function has no error channel: stop rather than return a weak one.
    std::fprintf(stderr, "kolo: RAND_bytes failed while generating a secret\n");
    std::abort();
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace net
}  // namespace kolo
