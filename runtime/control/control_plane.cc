#include "runtime/control/control_plane.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <new>
#include <system_error>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kolo/work.h"
#include "runtime/control/control_internal.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/poll_timeout.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/format.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace {

using control_internal::kMaxControlFrame;
using control_internal::RankLostError;
using control_internal::Serialize;

constexpr char kAddressKey[] = "control/address";
constexpr char kShmNameKey[] = "control/shm/name";
constexpr char kShmUseKey[] = "control/shm/use";
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(3);

// Out of descriptors on accept: how long the listener rests.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);
// Accepts per turn of the listen loop (see the store's kAcceptsPerTurn).
constexpr int kAcceptsPerTurn = 16;

// std::thread's constructor throws when the system has no thread to give
// (EAGAIN under a pids limit or RLIMIT_NPROC): an error, never an abort.
absl::Status ThreadError(absl::string_view what, const std::system_error& e) {
  return absl::ResourceExhaustedError(
      absl::StrCat("control channel: cannot start ", what, ": ", e.what()));
}

}  // namespace

ControlPlane::ControlPlane(int rank, int size, ControlCallbacks callbacks,
                           Liveness liveness)
    : rank_(rank),
      size_(size),
      callbacks_(std::move(callbacks)),
      liveness_(liveness) {
  channels_.resize(rank == 0 ? size : 1);
  leaving_.resize(size, false);
  ended_.resize(size, false);
}

ControlPlane::~ControlPlane() { Close(); }

absl::StatusOr<std::unique_ptr<ControlPlane>> ControlPlane::Create(
    int rank, int size, std::shared_ptr<Store> store, const std::string& secret,
    const std::string& bind_addr, absl::Time deadline,
    ControlCallbacks callbacks, Liveness liveness) {
  std::unique_ptr<ControlPlane> plane(
      new ControlPlane(rank, size, std::move(callbacks), liveness));
  absl::Status s =
      rank == 0 ? plane->StartCoordinator(store, secret, bind_addr, deadline)
                : plane->StartRank(store, secret, deadline);
  if (s.ok()) {
    try {
      plane->heartbeat_thread_ =
          std::thread(&ControlPlane::HeartbeatLoop, plane.get());
    } catch (const std::system_error& e) {
      s = ThreadError("the heartbeat thread", e);
    }
  }
  if (!s.ok()) {
    plane->Close();
    return s;
  }
  return plane;
}

void ControlPlane::HeartbeatLoop() {
  wire::ControlMessage beat;
  beat.mutable_heartbeat();
  const std::string bytes = Serialize(beat);
  MutexLock lock(&mu_);
  while (!closed_) {
    const absl::Time next = absl::Now() + liveness_.heartbeat_interval;
    while (!closed_ && closed_cv_.WaitUntil(&mu_, next)) {
    }
    if (closed_) return;
    std::vector<std::shared_ptr<net::SecureChannel>> targets;
    for (auto& c : channels_) {
      if (c) targets.push_back(c);
    }
    lock.Unlock();
    // A stopped peer stops reading: never block longer than one interval.
    const absl::Time deadline = absl::Now() + liveness_.heartbeat_interval;
    for (auto& c : targets) c->Send(bytes, deadline).IgnoreError();
    lock.Lock();
  }
}

absl::Status ControlPlane::StartCoordinator(std::shared_ptr<Store> store,
                                            const std::string& secret,
                                            const std::string& bind_addr,
                                            absl::Time deadline) {
  auto listener = net::Listener::Bind(bind_addr, 0);
  if (!listener.ok()) return listener.status();
  listener_ = std::make_unique<net::Listener>(std::move(*listener));
  auto handshakes = net::HandshakeQueue::Create(secret, kMaxControlFrame);
  if (!handshakes.ok()) return handshakes.status();
  handshakes_ = std::move(*handshakes);
  absl::StatusOr<os::Pipe> wake_pipe = os::MakePipe(O_CLOEXEC | O_NONBLOCK);
  if (!wake_pipe.ok()) {
    return absl::Status(wake_pipe.status().code(),
                        absl::StrCat("control channel: cannot create a pipe: ",
                                     wake_pipe.status().message()));
  }
  wake_pipe_ = *std::move(wake_pipe);
  try {
    listen_thread_ = std::thread(&ControlPlane::ListenLoop, this);
  } catch (const std::system_error& e) {
    return ThreadError("the listen thread", e);
  }
  KOLO_RETURN_IF_ERROR(store->Set(
      kAddressKey, absl::StrCat(listener_->addr(), ":", listener_->port())));

  MutexLock lock(&mu_);
  while (joined_ < size_ - 1) {
    if (!start_error_.ok()) return start_error_;
    if (!joined_cv_.WaitUntil(&mu_, deadline) && joined_ < size_ - 1) {
      std::vector<int> missing;
      for (int r = 1; r < size_; ++r) {
        if (!channels_[r]) missing.push_back(r);
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous: rank", missing.size() > 1 ? "s " : " ",
          absl::StrJoin(missing, ", "),
          " did not connect to the coordinator (rank 0) within the start "
          "timeout (KOLO_START_TIMEOUT); check that every rank was started "
          "and that the job secret matches"));
    }
  }
  return absl::OkStatus();
}

absl::Status ControlPlane::StartRank(std::shared_ptr<Store> store,
                                     const std::string& secret,
                                     absl::Time deadline) {
  auto address = store->Get(kAddressKey, deadline - absl::Now());
  if (!address.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank_,
        ": the coordinator (rank 0) did not publish its address within the "
        "start timeout: ",
        address.status().message()));
  }
  std::pair<std::string, std::string> host_port =
      absl::StrSplit(*address, absl::MaxSplits(':', 1));
  int port = 0;
  if (!absl::SimpleAtoi(host_port.second, &port)) {
    return absl::InternalError("bad coordinator address in the store");
  }
  auto socket = net::Socket::Connect(host_port.first, port, deadline);
  if (!socket.ok()) return socket.status();
  auto channel = net::SecureChannel::Client(std::move(*socket), secret,
                                            deadline, kMaxControlFrame);
  if (!channel.ok()) return channel.status();
  std::shared_ptr<net::SecureChannel> shared(std::move(*channel));
  wire::ControlMessage hello;
  hello.mutable_hello()->set_rank(rank_);
  hello.mutable_hello()->set_size(size_);
  KOLO_RETURN_IF_ERROR(shared->Send(Serialize(hello), deadline));
  MutexLock lock(&mu_);
  channels_[0] = shared;
  absl::Status started;
  if (!StartThreadLocked([this, shared] { ReadLoop(0, shared.get()); },
                         &started)) {
    return started;
  }
  return absl::OkStatus();
}

bool ControlPlane::StartThreadLocked(std::function<void()> body,
                                     absl::Status* error) {
  try {
    threads_.emplace_back(std::move(body));
    return true;
  } catch (const std::system_error& e) {
    *error = ThreadError("a reader thread", e);
  } catch (const std::bad_alloc&) {
    *error = absl::ResourceExhaustedError(
        "control channel: no memory for a reader thread");
  }
  return false;
}

void ControlPlane::ListenLoop() {
  absl::Time accept_resume = absl::InfinitePast();
  while (!closed_) {
    absl::Time now = absl::Now();
    const bool accepting = accept_resume <= now && handshakes_->HasRoom(now);
    absl::Time next = handshakes_->NextDeadline();
    if (accept_resume > now) next = std::min(next, accept_resume);
    pollfd fds[3] = {
        {wake_pipe_.read_end.get(), POLLIN, 0},
        {handshakes_->fd(), POLLIN, 0},
        {listener_->fd(), static_cast<short>(accepting ? POLLIN : 0), 0}};
    if (poll(fds, 3, os::PollTimeoutMs(next, now)) < 0 && errno != EINTR) {
      // Only a bug gets here (EFAULT, EINVAL): accept no more ranks.
      MutexLock lock(&mu_);
      start_error_ = absl::InternalError(
          absl::StrCat("control channel: poll: ", os::ErrnoText(errno)));
      joined_cv_.NotifyAll();
      return;
    }
    if (fds[0].revents) {
      char drain[64];
      while (read(wake_pipe_.read_end.get(), drain, sizeof(drain)) > 0) {
      }
      continue;  // Close(): the loop condition says whether to stop.
    }
    now = absl::Now();
    if (fds[2].revents) {
      for (int i = 0; i < kAcceptsPerTurn && handshakes_->HasRoom(now); ++i) {
        absl::StatusOr<net::Socket> socket = listener_->TryAccept();
        if (!socket.ok()) {
          accept_resume = now + kAcceptPause;  // Out of descriptors: rest.
          break;
        }
        if (!socket->valid()) break;
        handshakes_->Add(std::move(*socket), now);
      }
    }
    if (fds[1].revents || handshakes_->NextDeadline() <= now) {
      for (auto& channel : handshakes_->Process(now)) {
        std::shared_ptr<net::SecureChannel> shared(std::move(channel));
        MutexLock lock(&mu_);
        if (closed_) return;
        absl::Status error;
        if (StartThreadLocked([this, shared] { ServeConnection(shared); },
                              &error)) {
          continue;
        }
        shared->Shutdown();
        // While ranks are joining this rank would be missing: say why.
        if (joined_ < size_ - 1 && start_error_.ok()) {
          start_error_ = absl::Status(error.code(),
                                      absl::StrCat(error.message(), " (for ",
                                                   shared->PeerAddress(), ")"));
          joined_cv_.NotifyAll();
        }
      }
    }
  }
}

void ControlPlane::ServeConnection(std::shared_ptr<net::SecureChannel> shared) {
  auto frame = shared->Receive(absl::Now() + kHandshakeTimeout);
  wire::ControlMessage hello;
  if (!frame.ok() || !hello.ParseFromString(*frame) || !hello.has_hello() ||
      hello.hello().size() != size_ || hello.hello().rank() <= 0 ||
      hello.hello().rank() >= size_) {
    shared->Shutdown();
    return;
  }
  const int peer = hello.hello().rank();
  {
    MutexLock lock(&mu_);
    if (channels_[peer] || closed_) {
      shared->Shutdown();
      return;
    }
    channels_[peer] = shared;
    ++joined_;
  }
  joined_cv_.NotifyAll();
  ReadLoop(peer, shared.get());
}

void ControlPlane::ReadLoop(int peer, net::SecureChannel* channel) {
  while (true) {
    auto frame = channel->Receive(absl::Now() + liveness_.heartbeat_timeout);
    if (!frame.ok()) {
      if (absl::IsDeadlineExceeded(frame.status())) {
        PeerLost(
            peer,
            absl::StrCat("no heartbeat for ",
                         FormatSeconds(liveness_.heartbeat_timeout),
                         "; the process may be stopped, hung or unreachable"));
      } else {
        PeerLost(peer, std::string(frame.status().message()));
      }
      return;
    }
    wire::ControlMessage message;
    if (!message.ParseFromString(*frame)) {
      PeerLost(peer, "malformed control message");
      return;
    }
    if (message.has_heartbeat()) continue;
    if (message.has_leaving()) {
      if (rank_ == 0) {
        MutexLock lock(&mu_);
        leaving_[peer] = true;
      }
      continue;
    }
    if (message.has_rank_lost() && rank_ != 0) {
      const auto& lost = message.rank_lost();
      shutting_down_ = true;  // The job is over; the coordinator will close.
      if (!lost_reported_.exchange(true)) {
        callbacks_.on_fatal(RankLostError(
            lost.rank(),
            absl::StrCat("rank ", lost.rank(), " lost: ", lost.reason(),
                         " (reported by the coordinator)")));
      }
      continue;
    }
    if (message.has_job_failed() && rank_ != 0) {
      shutting_down_ = true;  // The coordinator ends the job.
      if (!lost_reported_.exchange(true)) {
        callbacks_.on_fatal(absl::Status(
            static_cast<absl::StatusCode>(message.job_failed().code()),
            message.job_failed().message()));
      }
      continue;
    }
    if (message.has_response_list() && message.response_list().shutdown()) {
      shutting_down_ = true;  // The coordinator closes after this message.
    }
    if (rank_ == 0 && message.has_request_list() &&
        message.request_list().shutdown()) {
      MutexLock lock(&mu_);
      leaving_[peer] = true;
    }
    if (rank_ == 0 && message.has_host_requests()) {
      // A leader's relayed goodbyes (the background thread checks that
      // the ranks are on its host).
      MutexLock lock(&mu_);
      for (const wire::RelayedList& l : message.host_requests().lists()) {
        if (l.list().shutdown() && l.rank() > 0 && l.rank() < size_) {
          leaving_[l.rank()] = true;
        }
      }
    }
    Push(peer, std::move(message));
  }
}

void ControlPlane::PeerLost(int peer, const std::string& reason) {
  // Counted once per peer when handled, whichever way it went (a broken
  // ring reports the same peer on every drain).
  struct Counted {
    ControlPlane* plane;
    int peer;
    ~Counted() {
      MutexLock lock(&plane->mu_);
      if (plane->ended_[peer]) return;
      plane->ended_[peer] = true;
      ++plane->connections_ended_;
      plane->ended_cv_.NotifyAll();
    }
  } counted{this, peer};
  if (closed_ || shutting_down_) return;
  // Over shared memory the goodbye may still sit in a ring when the
  // connection closes: the sender set a flag before it sent it.
  ShmControlSegment* shm = shm_.load();
  if (shm && shm->leaving(rank_ == 0 ? peer : 0)) return;
  if (rank_ == 0) {
    {
      MutexLock lock(&mu_);
      if (leaving_[peer]) return;  // Left after asking to: not a loss.
    }
    if (lost_reported_.exchange(true)) return;
    wire::ControlMessage notice;
    notice.mutable_rank_lost()->set_rank(peer);
    notice.mutable_rank_lost()->set_reason(reason);
    Broadcast(notice).IgnoreError();  // Best effort: some may be gone too.
    callbacks_.on_fatal(
        RankLostError(peer, absl::StrCat("rank ", peer, " lost: ", reason)));
  } else {
    if (lost_reported_.exchange(true)) return;
    callbacks_.on_fatal(
        RankLostError(0, absl::StrCat("lost coordinator (rank 0): ", reason)));
  }
}

int ControlPlane::connections_ended() const {
  MutexLock lock(&mu_);
  return connections_ended_;
}

bool ControlPlane::WaitConnectionsEnded(int n, absl::Time deadline) const {
  MutexLock lock(&mu_);
  while (connections_ended_ < n) {
    if (!ended_cv_.WaitUntil(&mu_, deadline)) return connections_ended_ >= n;
  }
  return true;
}

void ControlPlane::Push(int from_rank, wire::ControlMessage message) {
  {
    MutexLock lock(&mu_);
    events_.push_back({from_rank, std::move(message)});
  }
  callbacks_.notify();
}

std::vector<ControlEvent> ControlPlane::TakeEvents() {
  std::vector<ControlEvent> out;
  {
    MutexLock lock(&mu_);
    out.swap(events_);
  }
  if (shm_.load() || host_.load()) {
    DrainShm();
    if (out.empty()) {
      out.swap(shm_events_);
    } else {
      for (auto& e : shm_events_) out.push_back(std::move(e));
      shm_events_.clear();
    }
  }
  return out;
}

absl::Status ControlPlane::EnableSharedMemory(Store& store, absl::Time deadline,
                                              bool hit_board,
                                              int64_t fusion_threshold_bytes) {
  if (size_ < 2) return absl::OkStatus();
  const absl::Duration timeout =
      std::max(absl::ZeroDuration(), deadline - absl::Now());
  std::unique_ptr<ShmControlSegment> segment;
  if (rank_ == 0) {
    std::string name;
    auto created =
        ShmControlSegment::Create(rank_, size_, kMaxControlFrame, &name,
                                  hit_board, fusion_threshold_bytes);
    absl::Status s = store.Set(kShmNameKey, created.ok() ? name : "");
    if (!s.ok()) {
      if (created.ok()) ShmControlSegment::Unlink(name);
      return s;
    }
    bool all = created.ok();
    for (int r = 1; r < size_; ++r) {
      auto attached =
          store.Get(absl::StrCat("control/shm/attached/", r), timeout);
      if (!attached.ok()) {
        if (created.ok()) ShmControlSegment::Unlink(name);
        return attached.status();
      }
      all = all && *attached == "1";
    }
    // Note [Segment lifetime] (runtime/os/shared_segment.h): mapped by
    // all, unlinked.
    if (created.ok()) ShmControlSegment::Unlink(name);
    KOLO_RETURN_IF_ERROR(store.Set(kShmUseKey, all ? "1" : "0"));
    if (all) segment = std::move(*created);
  } else {
    auto name = store.Get(kShmNameKey, timeout);
    if (!name.ok()) return name.status();
    absl::StatusOr<std::unique_ptr<ShmControlSegment>> opened =
        absl::UnavailableError("the coordinator has no segment");
    if (!name->empty()) {
      opened = ShmControlSegment::Open(*name, rank_, size_, kMaxControlFrame);
    }
    KOLO_RETURN_IF_ERROR(store.Set(absl::StrCat("control/shm/attached/", rank_),
                                   opened.ok() ? "1" : "0"));
    auto use = store.Get(kShmUseKey, timeout);
    if (!use.ok()) return use.status();
    if (*use == "1" && opened.ok()) segment = std::move(*opened);
  }
  if (segment) {
    shm_owner_ = std::move(segment);
    shm_.store(shm_owner_.get());
  }
  return absl::OkStatus();
}

Wakeup* ControlPlane::doorbell() {
  if (ShmControlSegment* shm = shm_.load()) return &shm->doorbell();
  if (ShmControlSegment* host = host_.load()) return &host->doorbell();
  return nullptr;
}

bool ControlPlane::DrainShm() {
  if (ShmControlSegment* host = host_.load(); host && host_index_ == 0) {
    if (!DrainHost(*host)) return false;
  }
  ShmControlSegment* shm = shm_.load();
  if (!shm) return true;
  std::vector<std::string> frames;
  const int first = rank_ == 0 ? 1 : rank_;
  const int last = rank_ == 0 ? size_ - 1 : rank_;
  for (int peer = first; peer <= last; ++peer) {
    ShmRing& ring = rank_ == 0 ? shm->up(peer) : shm->down(peer);
    frames.clear();
    absl::Status s = ring.ReadAll(&frames);
    const int from = rank_ == 0 ? peer : 0;
    for (std::string& frame : frames) {
      wire::ControlMessage message;
      if (!message.ParseFromString(frame)) {
        s = absl::DataLossError("malformed control message");
        break;
      }
      // What ReadLoop does for the same messages over TCP.
      if (message.has_response_list() && message.response_list().shutdown()) {
        shutting_down_ = true;
      }
      if (rank_ == 0 && message.has_request_list() &&
          message.request_list().shutdown()) {
        MutexLock lock(&mu_);
        leaving_[peer] = true;
      }
      shm_events_.push_back({from, std::move(message)});
    }
    if (!s.ok()) {
      PeerLost(from, std::string(s.message()));
      return false;
    }
  }
  return true;
}

absl::Status ControlPlane::WriteShm(ShmControlSegment& segment, ShmRing& ring,
                                    int to, const std::string& bytes) {
  // A full ring waits for its reader; meanwhile this thread keeps reading
  // its own rings so that two writers cannot wait for each other.
  absl::Status s =
      ring.Write(bytes, absl::Now() + liveness_.heartbeat_timeout, [&] {
        segment.Notify(to);  // The reader may be asleep: let it read.
        DrainShm();
        return !closed_ && !lost_reported_;
      });
  if (s.ok()) segment.Notify(to);
  return s;
}

absl::Status ControlPlane::SendToCoordinator(const wire::ControlMessage& m) {
  if (ShmControlSegment* shm = shm_.load(); shm && m.has_request_list()) {
    if (m.request_list().shutdown()) shm->SetLeaving(rank_);
    absl::Status s = WriteShm(*shm, shm->up(rank_), 0, Serialize(m));
    if (!s.ok()) {
      return RankLostError(
          0, absl::StrCat("lost coordinator (rank 0): ", s.message()));
    }
    return s;
  }
  if (ShmControlSegment* host = host_.load();
      host && host_index_ > 0 && m.has_request_list()) {
    KOLO_RETURN_IF_ERROR(HostLeaderStatus());
    if (m.request_list().shutdown()) {
      // Note [Host relay]: said over this rank's own connection first, so
      // that its closing is no loss even before the goodbye arrives.
      wire::ControlMessage leaving;
      leaving.mutable_leaving();
      std::shared_ptr<net::SecureChannel> channel;
      {
        MutexLock lock(&mu_);
        channel = channels_[0];
      }
      if (!channel || !channel->Send(Serialize(leaving)).ok()) {
        return RankLostError(0, "lost coordinator (rank 0)");
      }
    }
    host_out_.push_back(Serialize(m));
    PushHostOut();
    return absl::OkStatus();
  }
  std::shared_ptr<net::SecureChannel> channel;
  {
    MutexLock lock(&mu_);
    channel = channels_[0];
  }
  if (!channel) return RankLostError(0, "lost coordinator (rank 0)");
  absl::Status s = channel->Send(Serialize(m));
  if (!s.ok()) {
    return RankLostError(
        0, absl::StrCat("lost coordinator (rank 0): ", s.message()));
  }
  return s;
}

absl::Status ControlPlane::FailJob(const absl::Status& status) {
  lost_reported_ = true;  // Before the first rank can act on the message.
  wire::ControlMessage message;
  message.mutable_job_failed()->set_code(static_cast<int>(status.code()));
  message.mutable_job_failed()->set_message(std::string(status.message()));
  return Broadcast(message);
}

absl::Status ControlPlane::Broadcast(const wire::ControlMessage& m) {
  std::vector<int> all;
  for (int r = 1; r < size_; ++r) all.push_back(r);
  return SendTo(all, m);
}

absl::Status ControlPlane::SendTo(const std::vector<int>& ranks,
                                  const wire::ControlMessage& m) {
  if (ShmControlSegment* shm = shm_.load(); shm && m.has_response_list()) {
    if (m.response_list().shutdown()) shm->SetCoordinatorDone();
    const std::string bytes = Serialize(m);
    absl::Status first;
    for (int r : ranks) {
      if (r <= 0 || r >= size_) continue;
      absl::Status s = WriteShm(*shm, shm->down(r), r, bytes);
      if (!s.ok() && first.ok()) {
        first =
            RankLostError(r, absl::StrCat("rank ", r, " lost: ", s.message()));
      }
    }
    return first;
  }
  const std::string bytes = Serialize(m);
  std::vector<std::pair<int, std::shared_ptr<net::SecureChannel>>> targets;
  {
    MutexLock lock(&mu_);
    for (int r : ranks) {
      if (r > 0 && r < static_cast<int>(channels_.size()) && channels_[r]) {
        targets.emplace_back(r, channels_[r]);
      }
    }
  }
  absl::Status first;
  for (auto& [r, channel] : targets) {
    absl::Status s = channel->Send(bytes);
    if (!s.ok() && first.ok()) {
      first =
          RankLostError(r, absl::StrCat("rank ", r, " lost: ", s.message()));
    }
  }
  return first;
}

void ControlPlane::Close() {
  {
    MutexLock lock(&mu_);
    if (closed_.exchange(true)) return;
  }
  closed_cv_.NotifyAll();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
  if (wake_pipe_.write_end.valid()) {
    char byte = 1;
    (void)!write(wake_pipe_.write_end.get(), &byte, 1);
  }
  std::vector<std::thread> threads;
  {
    MutexLock lock(&mu_);
    for (auto& c : channels_) {
      if (c) c->Shutdown();
    }
  }
  if (listen_thread_.joinable()) listen_thread_.join();
  // The listen thread is gone: its listener and pending handshakes close.
  if (listener_) listener_->Close();
  if (handshakes_) handshakes_->CloseAll();
  wake_pipe_ = os::Pipe();
  {
    MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

}  // namespace kolo
