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
// its MAC checks: callers get payload bytes only from Receive().
// A replayed frame fails (wrong sequence, or wrong session key on another
// connection). HMAC comes from OpenSSL's libcrypto.
//
// Thread safety: Send() may be called from several threads (serialized
// internally); Receive() from one thread at a time; Shutdown() from any.
#ifndef KOLO_RUNTIME_NET_SECURE_CHANNEL_H_
#define KOLO_RUNTIME_NET_SECURE_CHANNEL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "runtime/net/socket.h"

namespace kolo {
namespace net {

class SecureChannel {
 public:
  static constexpr size_t kDefaultMaxFrameBytes = 256u << 20;

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
  // checks it and completes the handshake like Server().
  static constexpr size_t kClientAnswerBytes = 64;
  static absl::StatusOr<std::string> ServerHello(Socket& socket,
                                                 absl::Time deadline);
  static absl::StatusOr<std::unique_ptr<SecureChannel>> ServerFinish(
      Socket socket, const std::string& secret, const std::string& server_nonce,
      const std::string& client_answer, absl::Time deadline,
      size_t max_frame_bytes = kDefaultMaxFrameBytes);

  // Sends one frame. Unavailable once the connection is closed.
  absl::Status Send(absl::string_view payload,
                    absl::Time deadline = absl::InfiniteFuture());

  // Receives one authenticated frame's payload. Unavailable("connection
  // closed") on EOF or after Shutdown(); DataLoss for a bad MAC, sequence
  // number or oversized length (the connection is then unusable);
  // DeadlineExceeded when the deadline passes.
  absl::StatusOr<std::string> Receive(
      absl::Time deadline = absl::InfiniteFuture());

  // Unblocks Send/Receive in other threads; the channel is then closed.
  void Shutdown();
  std::string PeerAddress() const { return socket_.PeerAddress(); }

 private:
  SecureChannel(Socket socket, std::string session_key, bool is_client,
                size_t max_frame_bytes);

  Socket socket_;
  const std::string session_key_;
  const bool is_client_;
  const size_t max_frame_bytes_;
  std::mutex send_mu_;
  uint64_t send_seq_ = 0;  // guarded by send_mu_
  uint64_t recv_seq_ = 0;  // owned by the receiving thread
  // Set by Shutdown() so later calls say why the channel is closed.
  std::atomic<bool> shut_down_{false};
};

// 32 random bytes from OpenSSL, hex-encoded (64 characters).
std::string GenerateSecret();

}  // namespace net
}  // namespace kolo

#endif  // KOLO_RUNTIME_NET_SECURE_CHANNEL_H_
