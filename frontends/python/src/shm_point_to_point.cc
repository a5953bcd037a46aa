// ShmPointToPoint's engine: the segment's layout, the Works, the progress
// thread (Note [Point-to-point over shared memory] in shm_point_to_point.h).
// How a group decides on it and maps its segment: shm_connect.cc.
#include "frontends/python/src/shm_point_to_point.h"

#include <c10/util/Exception.h>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "frontends/python/src/work.h"
#include "runtime/os/shared_segment.h"
#include "runtime/os/unique_fd.h"
#include "runtime/sync/mutex.h"
#include "runtime/sync/wakeup.h"

namespace kolo {
namespace torch {
namespace {

// ---- The segment's layout ------------------------------------------------

constexpr uint64_t kSlots = 64;  // descriptors (and clears) per channel
// While something is pending, how often the peers' processes are checked.
constexpr absl::Duration kLivenessPoll = absl::Milliseconds(20);

// While something is pending, how long the thread polls its doorbell
// before it sleeps (Note [Spin then block]): a peer's answer usually comes
// sooner than a kernel wake-up would.
constexpr absl::Duration kSpin = absl::Microseconds(50);
// How long Close() waits for the progress thread to let go of the
// operations it fails.
constexpr absl::Duration kCloseBound = absl::Seconds(5);

struct Descriptor {
  int64_t tag;
  uint64_t bytes;
};

// Per rank.
struct RankWords {
  WakeupWord doorbell;                       // its progress thread sleeps on it
  alignas(64) std::atomic<uint32_t> closed;  // 1: it no longer takes part
};

// Per ordered pair s -> d. s writes posted, head, desc; d writes cleared,
// tail, cts.
struct Channel {
  alignas(64) std::atomic<uint64_t> posted;   // descriptors written
  alignas(64) std::atomic<uint64_t> cleared;  // clears written
  alignas(64) std::atomic<uint64_t> head;     // payload bytes written
  alignas(64) std::atomic<uint64_t> tail;     // payload bytes consumed
  alignas(64) Descriptor desc[kSlots];        // [seq % kSlots]
  uint64_t cts[kSlots];                       // [clear % kSlots]: a seq
};

constexpr size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Byte ring per channel: 1 MiB, halved until all channels fit in 8 MiB
// (16 KiB at least): every group has a segment, and a container's /dev/shm
// (64 MiB by default) must still hold them and kolo's collective segments.
size_t RingBytes(int size) {
  const size_t channels = static_cast<size_t>(size) * (size - 1);
  size_t ring = size_t{1} << 20;
  while (ring > (size_t{16} << 10) && ring * channels > (size_t{8} << 20)) {
    ring /= 2;
  }
  return ring;
}

size_t HeaderBytes(int size) {
  const size_t channels = static_cast<size_t>(size) * (size - 1);
  return RoundUp(sizeof(RankWords) * size + sizeof(Channel) * channels, 4096);
}

size_t ChannelIndex(int size, int from, int to) {
  return static_cast<size_t>(from) * (size - 1) + (to < from ? to : to - 1);
}

// ---- Works ----------------------------------------------------------------

class ShmWork : public c10d::Work {
 public:
  ShmWork(int rank, c10d::OpType type, std::string what, at::Tensor target,
          at::Tensor staged, std::weak_ptr<ShmPointToPoint> owner,
          std::chrono::milliseconds timeout)
      : c10d::Work(rank, type),
        what_(std::move(what)),
        target_(std::move(target)),
        staged_(std::move(staged)),
        owner_(std::move(owner)),
        timeout_(timeout) {}

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override {
    const std::chrono::milliseconds limit =
        timeout == kNoTimeout ? timeout_ : timeout;
    bool done;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      done = cv_.wait_for(lock, limit, [&] { return completed_; });
    }
    if (!done) {
      const std::string error =
          absl::StrCat(what_, " timed out after ", limit.count(),
                       " ms (the group's timeout; KOLO_OP_TIMEOUT unless "
                       "init_process_group or new_group set one); the group's "
                       "point-to-point is closed after it");
      if (std::shared_ptr<ShmPointToPoint> owner = owner_.lock()) {
        owner->Close(error);
      }
      Complete(-1, std::make_exception_ptr(std::runtime_error(error)));
    }
    // Note [Tensors are let go off the progress thread].
    if (std::shared_ptr<ShmPointToPoint> owner = owner_.lock()) {
      owner->Collect();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_) std::rethrow_exception(exception_);
    // A recv into a non-contiguous tensor went into a contiguous stand-in:
    // copied here, on the caller's thread, under its modes (inference,
    // autograd), as the gloo path does.
    if (!copied_ && retrieveOpType() != c10d::OpType::SEND &&
        target_.data_ptr() != staged_.data_ptr()) {
      target_.copy_(staged_);
      copied_ = true;
    }
    return true;
  }

  int sourceRank() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return source_;
  }

  std::vector<at::Tensor> result() override { return {target_}; }

  const std::string& what() const { return what_; }

  // The first completion wins.
  void Complete(int source, std::exception_ptr error) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (completed_) return;
      completed_ = true;
      exception_ = error;
      source_ = source;
    }
    cv_.notify_all();
  }

 private:
  const std::string what_;
  const at::Tensor target_;
  const at::Tensor staged_;  // target_, or its contiguous stand-in
  const std::weak_ptr<ShmPointToPoint> owner_;
  const std::chrono::milliseconds timeout_;
  // Under c10d::Work's mutex_ (LibTorch's std::mutex, Note [Annotated
  // locks]).
  int source_ = -1;
  bool copied_ = false;
};

// One send or recv (or a drained message: `discard`).
struct Op {
  bool recv = false;
  int peer = -1;  // -1: a recv from any source
  int64_t tag = 0;
  uint8_t* data = nullptr;  // in work's staged tensor
  uint64_t bytes = 0;
  uint64_t done = 0;
  bool discard = false;
  int source = -1;
  c10::intrusive_ptr<ShmWork> work;  // null for a drained message; holds
                                     // the tensors
};
using OpPtr = std::shared_ptr<Op>;

}  // namespace

// ---- The engine ------------------------------------------------------------

class ShmPointToPoint::Impl {
 public:
  Impl(std::string group, int rank, int size,
       std::unique_ptr<os::SharedSegment> segment,
       std::vector<os::UniqueFd> pidfds)
      : group_(std::move(group)),
        rank_(rank),
        size_(size),
        ring_(RingBytes(size)),
        segment_(std::move(segment)),
        words_(static_cast<RankWords*>(segment_->data())),
        bell_(&words_[rank].doorbell, /*shared=*/true),
        peers_(size) {
    auto* base = static_cast<uint8_t*>(segment_->data());
    auto* channels =
        reinterpret_cast<Channel*>(base + sizeof(RankWords) * size);
    uint8_t* rings = base + HeaderBytes(size);
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      Peer& peer = peers_[p];
      const size_t out = ChannelIndex(size, rank, p);
      const size_t in = ChannelIndex(size, p, rank);
      peer.out = &channels[out];
      peer.in = &channels[in];
      peer.out_ring = rings + out * ring_;
      peer.in_ring = rings + in * ring_;
      peer.bell = std::make_unique<Wakeup>(&words_[p].doorbell, true);
      peer.pidfd = std::move(pidfds[p]);
    }
    thread_ = std::thread([this] { Run(); });
  }

  ~Impl() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    bell_.Notify();
    JoinWithoutGil(thread_);
  }

  int rank() const { return rank_; }

  void Post(OpPtr op) {
    std::vector<OpPtr> dead;  // let go here, outside the lock
    {
      MutexLock lock(&mu_);
      fresh_.push_back(std::move(op));
      dead.swap(dead_);
    }
    bell_.Notify();
  }

  // Lets go of the Ops that ended (Note [Tensors are let go off the
  // progress thread]). Not on the progress thread.
  void Collect() {
    std::vector<OpPtr> dead;  // let go after the lock
    {
      MutexLock lock(&mu_);
      dead.swap(dead_);
    }
  }

  // Returns once the progress thread has failed every pending operation
  // (so it touches no caller's tensor any more), or after kCloseBound.
  void Close(const std::string& error) {
    MutexLock lock(&mu_);
    if (closed_.empty()) closed_ = error;
    bell_.Notify();
    const absl::Time deadline = absl::Now() + kCloseBound;
    while (!closed_done_) {
      if (!closed_cv_.WaitUntil(&mu_, deadline)) break;
    }
  }

 private:
  struct Incoming {
    uint64_t seq;
    int64_t tag;
    uint64_t bytes;
    uint64_t arrival;
  };

  // The progress thread's view of one peer.
  struct Peer {
    Channel* out = nullptr;  // this rank -> peer
    Channel* in = nullptr;   // peer -> this rank
    uint8_t* out_ring = nullptr;
    uint8_t* in_ring = nullptr;
    std::unique_ptr<Wakeup> bell;
    os::UniqueFd pidfd;
    std::string lost;  // why it is gone; empty while it takes part
    // Sending.
    std::deque<OpPtr> unposted;                  // waiting for a slot
    std::unordered_map<uint64_t, OpPtr> posted;  // by seq, not yet cleared
    std::deque<OpPtr> streaming_out;             // cleared, in clear order
    uint64_t next_seq = 0, clears_read = 0, head = 0;
    // Receiving.
    std::deque<Incoming> unmatched;
    std::deque<OpPtr> streaming_in;  // matched, in clear order
    uint64_t descriptors_read = 0, clears_written = 0, tail = 0;

    bool busy() const {
      return !unposted.empty() || !posted.empty() || !streaming_out.empty() ||
             !streaming_in.empty();
    }
  };

  // Note [Tensors are let go off the progress thread]
  // A tensor that Python made and then dropped (an isend's temporary) lives
  // on in its Op, and letting go of it last takes the GIL (torch then frees
  // its Python object). The progress thread must never wait for the GIL: a
  // thread that holds it may be waiting for the progress thread (the
  // group's destructor joins it). So every Op that ends (Finish) is kept in
  // retired_ and handed to dead_ before the thread sleeps, and a caller's
  // thread empties dead_: the next Post(), a Work's wait(), or the
  // destructor after the join. The tensors of the last operations to end
  // may so live until the group's next operation. For the same reason (and
  // for the caller's modes: inference, autograd) a recv into a
  // non-contiguous tensor is copied into it by Work::wait(), not here.
  void Finish(const OpPtr& op, std::exception_ptr error) {
    retired_.push_back(op);
    if (op->work) op->work->Complete(op->source, error);
  }

  void Fail(const OpPtr& op, const std::string& why) {
    const std::string what = op->work ? op->work->what() : "a drained message";
    Finish(op, std::make_exception_ptr(
                   std::runtime_error(absl::StrCat(what, " failed: ", why))));
  }

  // Fails and forgets the operations pending with `peer`.
  void FailAll(Peer& peer, const std::string& why) {
    for (const OpPtr& op : peer.unposted) Fail(op, why);
    for (const auto& [seq, op] : peer.posted) Fail(op, why);
    for (const OpPtr& op : peer.streaming_out) Fail(op, why);
    for (const OpPtr& op : peer.streaming_in) Fail(op, why);
    peer.unposted.clear();
    peer.posted.clear();
    peer.streaming_out.clear();
    peer.streaming_in.clear();
  }

  // Hands retired_ to dead_ (Note [Tensors are let go off the progress
  // thread]).
  void HandOver() {
    if (retired_.empty()) return;
    MutexLock lock(&mu_);
    for (OpPtr& op : retired_) dead_.push_back(std::move(op));
    retired_.clear();
  }

  void Run() {
    absl::Time next_check = absl::InfinitePast();
    for (;;) {
      HandOver();
      const uint32_t epoch = bell_.Epoch();
      std::deque<OpPtr> fresh;
      std::string closed;
      bool stopping;
      {
        MutexLock lock(&mu_);
        fresh.swap(fresh_);
        closed = closed_;
        stopping = stopping_;
      }
      if (stopping && closed.empty()) {
        closed = absl::StrCat("the group \"", group_, "\" was destroyed");
      }
      if (!closed.empty()) {
        for (const OpPtr& op : fresh) Fail(op, closed);
        if (!closed_here_) CloseHere(closed);
        if (stopping) {
          HandOver();
          return;
        }
      } else {
        for (OpPtr& op : fresh) Accept(std::move(op));
      }
      bool moved = closed_here_ ? false : Step();
      if (!closed_here_) moved |= CheckPeers(&next_check);
      if (moved || !fresh.empty()) continue;
      const bool pending = Pending();
      HandOver();
      bell_.Wait(epoch, pending ? next_check : absl::InfiniteFuture(),
                 pending ? kSpin : absl::ZeroDuration());
    }
  }

  void Accept(OpPtr op) {
    if (op->peer >= 0 && !peers_[op->peer].lost.empty()) {
      Fail(op, peers_[op->peer].lost);
    } else if (op->peer < 0 && AllLost()) {
      Fail(op, last_lost_);
    } else if (op->recv) {
      recvs_.push_back(std::move(op));
    } else {
      peers_[op->peer].unposted.push_back(std::move(op));
    }
  }

  bool AllLost() const {
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && peers_[p].lost.empty()) return false;
    }
    return true;
  }

  bool Pending() const {
    if (!recvs_.empty()) return true;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && peers_[p].busy()) return true;
    }
    return false;
  }

  // One round over every channel; whether anything moved.
  bool Step() {
    bool moved = false;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !peers_[p].lost.empty()) continue;
      Peer& peer = peers_[p];
      moved |= PostSends(peer);
      moved |= ReadClears(p, peer);
      if (!peer.lost.empty()) continue;  // it broke the protocol
      moved |= StreamOut(peer);
      moved |= ReadDescriptors(peer);
    }
    moved |= Match();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !peers_[p].lost.empty()) continue;
      moved |= StreamIn(peers_[p]);
    }
    return moved;
  }

  bool PostSends(Peer& peer) {
    bool moved = false;
    while (!peer.unposted.empty() &&
           peer.posted.size() + peer.streaming_out.size() < kSlots) {
      OpPtr op = std::move(peer.unposted.front());
      peer.unposted.pop_front();
      const uint64_t seq = peer.next_seq++;
      peer.out->desc[seq % kSlots] = Descriptor{op->tag, op->bytes};
      peer.out->posted.store(peer.next_seq, std::memory_order_release);
      peer.posted.emplace(seq, std::move(op));
      moved = true;
    }
    if (moved) peer.bell->Notify();
    return moved;
  }

  bool ReadClears(int p, Peer& peer) {
    bool moved = false;
    const uint64_t cleared = peer.out->cleared.load(std::memory_order_acquire);
    while (peer.clears_read < cleared) {
      const uint64_t seq = peer.out->cts[peer.clears_read % kSlots];
      ++peer.clears_read;
      auto it = peer.posted.find(seq);
      if (it == peer.posted.end()) {
        Lose(p, absl::StrCat("rank ", p, " broke the protocol (cleared ",
                             "message ", seq, ", which is not pending)"));
        return true;
      }
      peer.streaming_out.push_back(std::move(it->second));
      peer.posted.erase(it);
      moved = true;
    }
    return moved;
  }

  void CopyIn(uint8_t* ring, uint64_t pos, const uint8_t* src, size_t n) {
    const size_t at = pos & (ring_ - 1);
    const size_t first = std::min(n, ring_ - at);
    std::memcpy(ring + at, src, first);
    std::memcpy(ring, src + first, n - first);
  }

  void CopyOut(const uint8_t* ring, uint64_t pos, uint8_t* dst, size_t n) {
    const size_t at = pos & (ring_ - 1);
    const size_t first = std::min(n, ring_ - at);
    std::memcpy(dst, ring + at, first);
    std::memcpy(dst + first, ring, n - first);
  }

  bool StreamOut(Peer& peer) {
    bool moved = false, wrote = false;
    while (!peer.streaming_out.empty()) {
      const OpPtr& op = peer.streaming_out.front();
      const uint64_t room =
          ring_ - (peer.head - peer.out->tail.load(std::memory_order_acquire));
      const uint64_t n = std::min(room, op->bytes - op->done);
      if (n > 0) {
        CopyIn(peer.out_ring, peer.head, op->data + op->done, n);
        peer.head += n;
        op->done += n;
        peer.out->head.store(peer.head, std::memory_order_release);
        wrote = moved = true;
      }
      if (op->done < op->bytes) break;
      op->source = rank_;
      Finish(op, nullptr);
      peer.streaming_out.pop_front();
      moved = true;
    }
    if (wrote) peer.bell->Notify();
    return moved;
  }

  bool ReadDescriptors(Peer& peer) {
    bool moved = false;
    const uint64_t posted = peer.in->posted.load(std::memory_order_acquire);
    while (peer.descriptors_read < posted) {
      const Descriptor d = peer.in->desc[peer.descriptors_read % kSlots];
      peer.unmatched.push_back(
          Incoming{peer.descriptors_read, d.tag, d.bytes, arrivals_++});
      ++peer.descriptors_read;
      moved = true;
    }
    return moved;
  }

  // Gives each recv, in the order they were posted, the earliest message
  // of its tag from its source (any peer's: the earliest seen).
  bool Match() {
    bool moved = false;
    for (auto it = recvs_.begin(); it != recvs_.end();) {
      const OpPtr op = *it;
      int from = -1;
      std::deque<Incoming>::iterator found;
      uint64_t earliest = std::numeric_limits<uint64_t>::max();
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || (op->peer >= 0 && p != op->peer)) continue;
        Peer& peer = peers_[p];
        if (!peer.lost.empty()) continue;
        for (auto in = peer.unmatched.begin(); in != peer.unmatched.end();
             ++in) {
          if (in->tag != op->tag) continue;
          if (in->arrival < earliest) {
            earliest = in->arrival;
            from = p;
            found = in;
          }
          break;
        }
      }
      if (from < 0) {
        ++it;
        continue;
      }
      Peer& peer = peers_[from];
      const Incoming message = *found;
      peer.unmatched.erase(found);
      it = recvs_.erase(it);
      OpPtr target = op;
      if (message.bytes != op->bytes) {
        Fail(op, absl::StrCat("rank ", from, " sent ", message.bytes,
                              " bytes, the tensor has ", op->bytes,
                              " (the message is dropped)"));
        target = std::make_shared<Op>();
        target->recv = true;
        target->discard = true;
        target->bytes = message.bytes;
      }
      target->source = from;
      peer.in->cts[peer.clears_written % kSlots] = message.seq;
      ++peer.clears_written;
      peer.in->cleared.store(peer.clears_written, std::memory_order_release);
      peer.bell->Notify();
      peer.streaming_in.push_back(std::move(target));
      moved = true;
    }
    return moved;
  }

  bool StreamIn(Peer& peer) {
    bool moved = false, read = false;
    while (!peer.streaming_in.empty()) {
      const OpPtr& op = peer.streaming_in.front();
      const uint64_t available =
          peer.in->head.load(std::memory_order_acquire) - peer.tail;
      const uint64_t n = std::min(available, op->bytes - op->done);
      if (n > 0) {
        if (!op->discard) {
          CopyOut(peer.in_ring, peer.tail, op->data + op->done, n);
        }
        peer.tail += n;
        op->done += n;
        peer.in->tail.store(peer.tail, std::memory_order_release);
        read = moved = true;
      }
      if (op->done < op->bytes) break;
      Finish(op, nullptr);
      peer.streaming_in.pop_front();
      moved = true;
    }
    if (read) peer.bell->Notify();
    return moved;
  }

  // Peers that closed (their words) or whose process ended (their pidfd,
  // polled every kLivenessPoll while anything is pending). What such a peer
  // wrote before it went is taken first: a sender may exit as soon as its
  // last byte is in the ring.
  bool CheckPeers(absl::Time* next_check) {
    std::vector<std::pair<int, std::string>> gone;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || !peers_[p].lost.empty()) continue;
      if (words_[p].closed.load(std::memory_order_acquire) != 0) {
        gone.emplace_back(p, absl::StrCat("rank ", p,
                                          " closed its point-to-point (a "
                                          "timeout, an error or the group's "
                                          "end there)"));
      }
    }
    const absl::Time now = absl::Now();
    if (Pending() && now >= *next_check) {
      *next_check = now + kLivenessPoll;
      std::vector<pollfd> fds;
      std::vector<int> ranks;
      for (int p = 0; p < size_; ++p) {
        if (p == rank_ || !peers_[p].lost.empty()) continue;
        fds.push_back(pollfd{peers_[p].pidfd.get(), POLLIN, 0});
        ranks.push_back(p);
      }
      if (!fds.empty() && poll(fds.data(), fds.size(), 0) > 0) {
        for (size_t i = 0; i < fds.size(); ++i) {
          if (fds[i].revents != 0) {
            gone.emplace_back(
                ranks[i],
                absl::StrCat("rank ", ranks[i], " lost (its process exited)"));
          }
        }
      }
    } else if (!Pending()) {
      *next_check = absl::InfinitePast();  // check at once when work comes
    }
    if (gone.empty()) return false;
    // Bounded: traffic with the other peers must not hold this up.
    for (int i = 0; i < 64 && Step(); ++i) {
    }
    for (const auto& [p, why] : gone) Lose(p, why);
    return true;
  }

  // Fails everything pending with `p`, and the recvs from any source once
  // no peer is left.
  void Lose(int p, const std::string& why) {
    Peer& peer = peers_[p];
    if (!peer.lost.empty()) return;
    peer.lost = why;
    last_lost_ = why;
    const bool none_left = AllLost();
    FailAll(peer, why);
    peer.unmatched.clear();
    for (auto it = recvs_.begin(); it != recvs_.end();) {
      if ((*it)->peer == p || ((*it)->peer < 0 && none_left)) {
        Fail(*it, why);
        it = recvs_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // Fails everything with `why` and tells the peers.
  void CloseHere(const std::string& why) {
    closed_here_ = true;
    for (const OpPtr& op : recvs_) Fail(op, why);
    recvs_.clear();
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      Peer& peer = peers_[p];
      FailAll(peer, why);
      if (peer.lost.empty()) peer.lost = why;
    }
    words_[rank_].closed.store(1, std::memory_order_release);
    for (int p = 0; p < size_; ++p) {
      if (p != rank_) peers_[p].bell->Notify();
    }
    MutexLock lock(&mu_);  // Close() waits for this
    closed_done_ = true;
    closed_cv_.NotifyAll();
  }

  const std::string group_;
  const int rank_, size_;
  const size_t ring_;
  const std::unique_ptr<os::SharedSegment> segment_;
  RankWords* const words_;
  Wakeup bell_;  // this rank's doorbell

  Mutex mu_;
  std::deque<OpPtr> fresh_ KOLO_GUARDED_BY(mu_);   // posted, not yet taken
  std::string closed_ KOLO_GUARDED_BY(mu_);        // Close()'s error
  bool closed_done_ KOLO_GUARDED_BY(mu_) = false;  // CloseHere() ran
  CondVar closed_cv_;
  // Ended Ops for a caller's thread to let go of.
  std::vector<OpPtr> dead_ KOLO_GUARDED_BY(mu_);
  bool stopping_ KOLO_GUARDED_BY(mu_) = false;

  // The progress thread's own.
  std::vector<Peer> peers_;  // [rank]; this rank's entry unused
  std::deque<OpPtr> recvs_;  // unmatched, in the order posted
  uint64_t arrivals_ = 0;
  std::vector<OpPtr> retired_;  // ended, not yet handed over
  std::string last_lost_;       // the last peer's Lose() reason
  bool closed_here_ = false;
  std::thread thread_;
};

// ---- ShmPointToPoint ------------------------------------------------------

ShmPointToPoint::ShmPointToPoint(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

ShmPointToPoint::~ShmPointToPoint() = default;

void ShmPointToPoint::Close(const std::string& error) { impl_->Close(error); }

void ShmPointToPoint::Collect() { impl_->Collect(); }

c10::intrusive_ptr<c10d::Work> ShmPointToPoint::Post(
    bool recv, int peer, int tag, at::Tensor target, at::Tensor staged,
    std::string what, std::chrono::milliseconds timeout) {
  auto op = std::make_shared<Op>();
  op->recv = recv;
  op->peer = peer;
  op->tag = tag;
  op->data = static_cast<uint8_t*>(staged.data_ptr());
  op->bytes = staged.nbytes();
  const c10d::OpType type = !recv      ? c10d::OpType::SEND
                            : peer < 0 ? c10d::OpType::RECVANYSOURCE
                                       : c10d::OpType::RECV;
  op->work = c10::make_intrusive<ShmWork>(impl_->rank(), type, std::move(what),
                                          std::move(target), std::move(staged),
                                          weak_from_this(), timeout);
  c10::intrusive_ptr<c10d::Work> work = op->work;
  impl_->Post(std::move(op));
  return work;
}

size_t ShmPointToPoint::SegmentBytes(int size) {
  return HeaderBytes(size) +
         RingBytes(size) * static_cast<size_t>(size) * (size - 1);
}

std::shared_ptr<ShmPointToPoint> ShmPointToPoint::Start(
    const std::string& group, int rank, int size,
    std::unique_ptr<os::SharedSegment> segment,
    std::vector<os::UniqueFd> pidfds) {
  segment->Populate();
  return std::shared_ptr<ShmPointToPoint>(
      new ShmPointToPoint(std::make_unique<Impl>(
          group, rank, size, std::move(segment), std::move(pidfds))));
}

}  // namespace torch
}  // namespace kolo
