#include "runtime/net/secure_channel.h"

#include <errno.h>
#include <sys/random.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/os/errno_text.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace net {

// See Note [Handshake and frames] in the header for the protocol.

namespace {

constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = SecureChannel::kFrameMacBytes;  // HMAC-SHA256
constexpr size_t kHeaderBytes = SecureChannel::kFrameHeaderBytes;
static_assert(kMacBytes == Sha256::kDigestBytes, "frames carry HMAC-SHA256");

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

absl::string_view AsView(const Sha256::Digest& digest) {
  return absl::string_view(reinterpret_cast<const char*>(digest.data()),
                           digest.size());
}

// `len` bytes from the kernel's random source (getrandom(2) without flags:
// blocks only until the pool is first initialised at boot). Never falls back
// to anything weaker.
absl::Status FillRandom(void* data, size_t len) {
  char* p = static_cast<char*>(data);
  while (len > 0) {
    ssize_t got = ::getrandom(p, len, 0);
    if (got < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      return absl::InternalError(
          absl::StrCat("getrandom failed: ", os::ErrnoText(err),
                       " (the kernel gives no randomness)"));
    }
    p += got;
    len -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  absl::Status st = FillRandom(&out[0], n);
  if (!st.ok()) return st;
  return out;
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

void PutHeader(size_t length, uint64_t sequence, char* header) {
  PutBigEndian32(static_cast<uint32_t>(length), header);
  PutBigEndian64(sequence, header + 4);
}

uint64_t GetBigEndian(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v = (v << 8) | static_cast<unsigned char>(in[i]);
  }
  return v;
}

absl::Status CheckSecret(const std::string& secret) {
  if (secret.empty()) {
    return absl::InvalidArgumentError(
        "the job secret is empty: an empty secret authenticates nobody");
  }
  return absl::OkStatus();
}

std::string PeerName(const std::string& peer) {
  return peer.empty() ? "peer" : peer;
}

absl::Status HandshakeError(const absl::Status& status,
                            const std::string& peer) {
  return absl::Status(
      status.code(),
      absl::StrCat("handshake with ", PeerName(peer), ": ", status.message()));
}

}  // namespace

SecureChannel::SecureChannel(Socket socket, const std::string& session_key,
                             bool is_client, size_t max_frame_bytes)
    : socket_(std::move(socket)),
      session_mac_(session_key),
      is_client_(is_client),
      max_frame_bytes_(max_frame_bytes) {}

absl::StatusOr<std::unique_ptr<SecureChannel>> SecureChannel::Client(
    Socket socket, const std::string& secret, absl::Time deadline,
    size_t max_frame_bytes) {
  absl::Status valid = CheckSecret(secret);
  if (!valid.ok()) return valid;
  const std::string peer = socket.PeerAddress();
  const HmacSha256 keyed(secret);

  std::string server_nonce(kNonceBytes, '\0');
  absl::Status st = socket.RecvAll(&server_nonce[0], kNonceBytes, deadline);
  if (!st.ok()) return HandshakeError(st, peer);

  absl::StatusOr<std::string> client_nonce = RandomBytes(kNonceBytes);
  if (!client_nonce.ok()) return client_nonce.status();
  std::string message =
      *client_nonce +
      keyed.MacString({kClientLabel, server_nonce, *client_nonce});
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
  if (!ConstantTimeEqual(
          server_proof,
          AsView(keyed.Mac({kServerLabel, *client_nonce, server_nonce})))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "authentication failed: ", peer, " did not prove the job secret"));
  }
  const std::string key =
      keyed.MacString({kSessionLabel, server_nonce, *client_nonce});
  return std::unique_ptr<SecureChannel>(new SecureChannel(
      std::move(socket), key, /*is_client=*/true, max_frame_bytes));
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
  return ServerFinish(socket, secret, *server_nonce, answer, deadline,
                      max_frame_bytes);
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
    Socket& socket, const std::string& secret, const std::string& server_nonce,
    const std::string& answer, absl::Time deadline, size_t max_frame_bytes) {
  static_assert(kClientAnswerBytes == kNonceBytes + kMacBytes,
                "answer = client nonce + proof");
  absl::Status valid = CheckSecret(secret);
  if (!valid.ok()) return valid;
  const std::string peer = PeerName(socket.PeerAddress());
  if (answer.size() != kClientAnswerBytes) {
    return absl::PermissionDeniedError(absl::StrCat(
        "authentication failed: ", peer, " sent a malformed handshake"));
  }
  absl::string_view client_nonce(answer.data(), kNonceBytes);
  absl::string_view client_proof(answer.data() + kNonceBytes, kMacBytes);

  const HmacSha256 keyed(secret);
  if (!ConstantTimeEqual(
          client_proof,
          AsView(keyed.Mac({kClientLabel, server_nonce, client_nonce})))) {
    // The caller closes without answering.
    return absl::PermissionDeniedError(absl::StrCat(
        "authentication failed: ", peer, " did not prove the job secret"));
  }

  const Sha256::Digest server_proof =
      keyed.Mac({kServerLabel, client_nonce, server_nonce});
  absl::Status st = socket.SendAll(server_proof.data(), kMacBytes, deadline);
  if (!st.ok()) return HandshakeError(st, peer);

  const std::string key =
      keyed.MacString({kSessionLabel, server_nonce, client_nonce});
  return std::unique_ptr<SecureChannel>(new SecureChannel(
      std::move(socket), key, /*is_client=*/false, max_frame_bytes));
}

// MAC of one frame: HMAC(K, dir || sequence || length || payload).
Sha256::Digest SecureChannel::FrameMac(bool outgoing, uint64_t sequence,
                                       absl::string_view payload) const {
  const bool client_to_server = outgoing == is_client_;
  char fields[1 + 8 + 4];
  fields[0] = static_cast<char>(client_to_server ? kDirClientToServer
                                                 : kDirServerToClient);
  PutBigEndian64(sequence, fields + 1);
  PutBigEndian32(static_cast<uint32_t>(payload.size()), fields + 9);
  return session_mac_.Mac({absl::string_view(fields, sizeof(fields)), payload});
}

void SecureChannel::AppendFrameLocked(absl::string_view payload,
                                      std::string* out) {
  char header[kHeaderBytes];
  PutHeader(payload.size(), send_seq_, header);
  const Sha256::Digest mac = FrameMac(/*outgoing=*/true, send_seq_, payload);
  out->reserve(out->size() + kHeaderBytes + payload.size() + kMacBytes);
  out->append(header, kHeaderBytes);
  out->append(payload.data(), payload.size());
  out->append(AsView(mac).data(), kMacBytes);
}

absl::Status SecureChannel::CheckSendable(absl::string_view payload) const {
  if (payload.size() > max_frame_bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame of ", payload.size(), " bytes exceeds the ",
                     max_frame_bytes_, "-byte limit"));
  }
  if (shut_down_.load()) {
    return absl::UnavailableError("connection closed (channel shut down)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SecureChannel::Seal(absl::string_view payload) {
  absl::Status sendable = CheckSendable(payload);
  if (!sendable.ok()) return sendable;
  std::string frame;
  MutexLock lock(&send_mu_);
  AppendFrameLocked(payload, &frame);
  ++send_seq_;
  return frame;
}

absl::Status SecureChannel::Send(absl::string_view payload,
                                 absl::Time deadline) {
  absl::Status sendable = CheckSendable(payload);
  if (!sendable.ok()) return sendable;
  MutexLock lock(&send_mu_);
  absl::Status st;
  if (payload.size() <= kCoalesceBytes) {
    std::string frame;
    AppendFrameLocked(payload, &frame);
    st = socket_.SendAll(frame.data(), frame.size(), deadline);
  } else {
    char header[kHeaderBytes];
    PutHeader(payload.size(), send_seq_, header);
    const Sha256::Digest mac = FrameMac(/*outgoing=*/true, send_seq_, payload);
    st = socket_.SendAll(header, kHeaderBytes, deadline);
    if (st.ok()) st = socket_.SendAll(payload.data(), payload.size(), deadline);
    if (st.ok()) st = socket_.SendAll(mac.data(), mac.size(), deadline);
  }
  if (!st.ok()) {
    // Part of a frame may be out: the stream cannot be resynchronised.
    socket_.ShutdownBoth();
    return st;
  }
  ++send_seq_;
  return absl::OkStatus();
}

absl::Status SecureChannel::CheckHeader(const char* header,
                                        uint64_t* length) const {
  *length = GetBigEndian(header, 4);
  const uint64_t sequence = GetBigEndian(header + 4, 8);
  const std::string& peer = socket_.PeerAddress();
  // Checked before reading on: a forged length must not make us allocate
  // or wait for gigabytes.
  if (*length > max_frame_bytes_) {
    return absl::DataLossError(absl::StrCat(
        "frame of ", *length, " bytes from ", peer, " exceeds the ",
        max_frame_bytes_, "-byte limit; connection closed"));
  }
  if (sequence != recv_seq_) {
    return absl::DataLossError(absl::StrCat(
        "frame from ", peer, " has sequence number ", sequence, ", expected ",
        recv_seq_, " (replayed or lost frame); connection closed"));
  }
  return absl::OkStatus();
}

absl::Status SecureChannel::CheckMac(absl::string_view payload,
                                     absl::string_view mac) const {
  if (!ConstantTimeEqual(
          mac, AsView(FrameMac(/*outgoing=*/false, recv_seq_, payload)))) {
    return absl::DataLossError(
        absl::StrCat("frame from ", socket_.PeerAddress(),
                     " failed authentication (bad MAC); connection closed"));
  }
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
  uint64_t length = 0;
  st = CheckHeader(header, &length);
  if (!st.ok()) return fail(st);
  std::string payload(length, '\0');
  if (length > 0) {
    st = socket_.RecvAll(&payload[0], length, deadline);
    if (!st.ok()) return fail(st);
  }
  char mac[kMacBytes];
  st = socket_.RecvAll(mac, kMacBytes, deadline);
  if (!st.ok()) return fail(st);
  st = CheckMac(payload, absl::string_view(mac, kMacBytes));
  if (!st.ok()) return fail(st);
  ++recv_seq_;
  return payload;
}

absl::StatusOr<SecureChannel::Opened> SecureChannel::Open(
    absl::string_view buffer) {
  if (shut_down_.load()) {
    return absl::UnavailableError("connection closed (channel shut down)");
  }
  Opened opened;
  if (buffer.size() < kHeaderBytes) return opened;
  uint64_t length = 0;
  absl::Status st = CheckHeader(buffer.data(), &length);
  if (!st.ok()) return st;
  const size_t frame_bytes = kHeaderBytes + length + kMacBytes;
  if (buffer.size() < frame_bytes) return opened;
  const absl::string_view payload = buffer.substr(kHeaderBytes, length);
  st = CheckMac(payload, buffer.substr(kHeaderBytes + length, kMacBytes));
  if (!st.ok()) return st;
  ++recv_seq_;
  opened.consumed = frame_bytes;
  opened.payload = std::string(payload);
  return opened;
}

void SecureChannel::Shutdown() {
  shut_down_.store(true);
  socket_.ShutdownBoth();
}

std::string GenerateSecret() {
  unsigned char bytes[32];
  absl::Status st = FillRandom(bytes, sizeof(bytes));
  if (!st.ok()) {
    // Without randomness there is no safe secret to hand out, and this
    // function has no error channel: stop rather than return a weak one.
    std::fprintf(stderr, "kolo: cannot generate a job secret: %s\n",
                 std::string(st.message()).c_str());
    std::abort();
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), sizeof(bytes)));
}

}  // namespace net
}  // namespace kolo
