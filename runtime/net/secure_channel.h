// SecureChannel: kolo's authenticated framing, used by the rendezvous store
// and the control channel.
//
// Note [Handshake and frames]
// Both sides hold the per-job secret S. The server sends a 32-byte random
// nonce Ns; the client answers with its nonce Nc and
// HMAC-SHA256(S, "kolo-client" || Ns || Nc); the server checks it (constant
// time) and answers HMAC-SHA256(S, "kolo-server" || Nc || Ns), which the
// client checks. Both then derive the session key
// K = HMAC-SHA256(S, "kolo-session" || Ns || Nc). Every frame is
//   u32 length (big endian) | u64 sequence | payload | HMAC-SHA256(K, dir ||
//   sequence || length || payload)
// where dir distinguishes client->server from server->client and sequence
// counts frames per direction from 0. A frame whose length exceeds the cap
// is rejected before anything is read past the header; a frame whose MAC or
// sequence number is wrong closes the connection. Nothing is parsed before
// its MAC checks: callers get payload bytes only from Receive() or Open().
// A replayed frame fails (wrong sequence, or wrong session key on another
// connection). HMAC-SHA256 is kolo's own (runtime/net/sha256.h, Note [No
// library state on kolo's threads]) and nonces come from getrandom(2).
//
// Note [Frames without blocking]
// Send() and Receive() block (up to a deadline) on the socket. A server
// that serves many connections from one thread uses Seal() and Open()
// instead: Seal() turns a payload into the bytes of its frame (taking the
// next send sequence number), and Open() looks at the bytes received so far
// and takes one frame off their front once all of it is there. Open()
// checks exactly what Receive() checks, in the same order and with the
// same messages: the length cap as soon as the 12-byte header is in (so a
// forged length is refused before its payload is waited for), then the
// sequence number, then, once the frame is complete, the MAC. The caller
// owns the socket's I/O (fd()); after an error from Open() the stream
// cannot be resynchronised and the caller must close the connection.
//
// Thread safety: Send() and Seal() may be called from several threads
// (serialized internally); Receive() and Open() from one thread at a time;
// Shutdown() from any.
#ifndef KOLO_RUNTIME_NET_SECURE_CHANNEL_H_
#define KOLO_RUNTIME_NET_SECURE_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/net/sha256.h"
#include "runtime/net/socket.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace net {

class SecureChannel {
 public:
  static constexpr size_t kDefaultMaxFrameBytes = 256u << 20;
  // Header (u32 length, u64 sequence) and MAC around every payload.
  static constexpr size_t kFrameHeaderBytes = 4 + 8;
  static constexpr size_t kFrameMacBytes = 32;

  // Runs the handshake; PermissionDenied("authentication failed: ...") when
  // the peer does not hold the secret, DeadlineExceeded if it does not
  // complete by `deadline`.
  static absl::StatusOr<std::unique_ptr<SecureChannel>> Client(
      Socket socket, const std::string& secret, absl::Time deadline,
      size_t max_frame_bytes = kDefaultMaxFrameBytes);
  static absl::StatusOr<std::unique_ptr<SecureChannel>> Server(
      Socket socket, const std::string& secret, absl::Time deadline,
      size_t max_frame_bytes = kDefaultMaxFrameBytes);

  // The server's handshake in two steps, for servers that multiplex many
  // pending handshakes on one thread (so that unauthenticated connections
  // cost no thread): ServerHello sends the server nonce and returns it;
  // once the client's answer (kClientAnswerBytes) has arrived, ServerFinish
  // checks it and completes the handshake like Server(). On success the
  // socket moves into the channel; on failure it stays with the caller, still
  // open, so that the caller decides when the peer sees it close (after
  // counting the failure, say).
  static constexpr size_t kClientAnswerBytes = 64;
  static absl::StatusOr<std::string> ServerHello(Socket& socket,
                                                 absl::Time deadline);
  static absl::StatusOr<std::unique_ptr<SecureChannel>> ServerFinish(
      Socket& socket, const std::string& secret,
      const std::string& server_nonce, const std::string& client_answer,
      absl::Time deadline, size_t max_frame_bytes = kDefaultMaxFrameBytes);

  // Sends one frame. Unavailable once the connection is closed.
  absl::Status Send(absl::string_view payload,
                    absl::Time deadline = absl::InfiniteFuture());

  // Receives one authenticated frame's payload. Unavailable("connection
  // closed") on EOF or after Shutdown(); DataLoss for a bad MAC, sequence
  // number or oversized length (the connection is then unusable);
  // DeadlineExceeded when the deadline passes.
  absl::StatusOr<std::string> Receive(
      absl::Time deadline = absl::InfiniteFuture());

  // Note [Frames without blocking]. Seal: the whole frame of `payload`;
  // InvalidArgument over the cap, Unavailable after Shutdown().
  absl::StatusOr<std::string> Seal(absl::string_view payload);
  // Open: `consumed` is 0 while `buffer` holds no complete frame yet;
  // otherwise the frame's size, with its payload. Errors as Receive().
  struct Opened {
    size_t consumed = 0;
    std::string payload;
  };
  absl::StatusOr<Opened> Open(absl::string_view buffer);
  // The connected socket, for polling; the channel keeps owning it.
  int fd() const { return socket_.fd(); }
  size_t max_frame_bytes() const { return max_frame_bytes_; }

  // Unblocks Send/Receive in other threads; the channel is then closed.
  void Shutdown();
  const std::string& PeerAddress() const { return socket_.PeerAddress(); }

 private:
  SecureChannel(Socket socket, const std::string& session_key, bool is_client,
                size_t max_frame_bytes);

  // InvalidArgument over the cap, Unavailable after Shutdown().
  absl::Status CheckSendable(absl::string_view payload) const;
  // Appends the frame of `payload` with sequence number send_seq_.
  void AppendFrameLocked(absl::string_view payload, std::string* out)
      KOLO_REQUIRES(send_mu_);
  Sha256::Digest FrameMac(bool outgoing, uint64_t sequence,
                          absl::string_view payload) const;
  // The checks of Note [Frames without blocking], shared by Receive and Open.
  absl::Status CheckHeader(const char* header, uint64_t* length) const;
  absl::Status CheckMac(absl::string_view payload, absl::string_view mac) const;

  Socket socket_;
  const HmacSha256 session_mac_;  // keyed with the session key
  const bool is_client_;
  const size_t max_frame_bytes_;
  Mutex send_mu_;
  uint64_t send_seq_ KOLO_GUARDED_BY(send_mu_) = 0;
  uint64_t recv_seq_ = 0;  // owned by the receiving thread
  // Set by Shutdown() so later calls say why the channel is closed.
  std::atomic<bool> shut_down_{false};
};

// 32 random bytes from getrandom(2), hex-encoded (64 characters). Aborts
// with a message if the kernel gives no randomness: it has no error channel
// and must never hand out a weak secret.
std::string GenerateSecret();

}  // namespace net
}  // namespace kolo

#endif  // KOLO_RUNTIME_NET_SECURE_CHANNEL_H_
