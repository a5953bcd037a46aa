// PointToPoint: see point_to_point.h (Note [Point-to-point of a process
// group]).
#include "frontends/python/src/point_to_point.h"

#include <c10/util/Exception.h>

#include <exception>
#include <stdexcept>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gloo/context.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace torch {
namespace {

// gloo's rendezvous Store on top of torch's (the group's). gloo reports
// errors by throwing.
class TorchStoreAdapter : public ::gloo::rendezvous::Store {
 public:
  TorchStoreAdapter(c10::intrusive_ptr<c10d::Store> store,
                    std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::vector<uint8_t>(data.begin(), data.end()));
  }
  std::vector<char> get(const std::string& key) override {
    store_->wait({key}, timeout_);
    std::vector<uint8_t> value = store_->get(key);
    return std::vector<char>(value.begin(), value.end());
  }
  void wait(const std::vector<std::string>& keys) override {
    store_->wait(keys, timeout_);
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout);
  }

 private:
  const c10::intrusive_ptr<c10d::Store> store_;
  const std::chrono::milliseconds timeout_;
};

// One send or recv. wait() finishes it on the caller's thread (gloo's wait
// blocks on a condition variable); torch's Python reads the source of a
// recv from any rank through sourceRank() after wait().
class PointToPointWork : public c10d::Work {
 public:
  PointToPointWork(c10d::OpType type, std::string what, int rank, int peer,
                   at::Tensor target, at::Tensor staged,
                   std::unique_ptr<::gloo::transport::UnboundBuffer> buffer,
                   std::shared_ptr<::gloo::Context> context,
                   std::chrono::milliseconds timeout)
      : c10d::Work(rank, type),
        recv_(type != c10d::OpType::SEND),
        peer_(peer),
        what_(std::move(what)),
        target_(std::move(target)),
        staged_(std::move(staged)),
        buffer_(std::move(buffer)),
        context_(std::move(context)),
        timeout_(timeout) {}

  // A Work dropped before its wait: gloo's pairs hold the unbound buffer
  // weakly, so nothing is written into (or read from) a tensor that is
  // gone, as with ProcessGroupGloo.

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override {
    std::exception_ptr error;
    {
      MutexLock lock(&mu_);
      if (!done_) {
        const std::chrono::milliseconds limit =
            timeout == kNoTimeout ? timeout_ : timeout;
        error_ = Finish(limit);
        done_ = true;
        finish(error_);
      }
      error = error_;
    }
    if (error) std::rethrow_exception(error);
    return true;
  }

  int sourceRank() const override {
    MutexLock lock(&mu_);
    return source_;
  }

  std::vector<at::Tensor> result() override { return {target_}; }

 private:
  bool recv() const { return recv_; }

  std::exception_ptr Finish(std::chrono::milliseconds limit)
      KOLO_REQUIRES(mu_) {
    try {
      int peer = -1;
      if (recv()) {
        buffer_->waitRecv(&peer, limit);
        if (staged_.data_ptr() != target_.data_ptr()) target_.copy_(staged_);
      } else {
        buffer_->waitSend(&peer, limit);
      }
      source_ = peer;
      return nullptr;
    } catch (const std::exception& e) {
      const std::string text = e.what();
      if (absl::StrContains(text, "Timed out")) {
        return std::make_exception_ptr(std::runtime_error(
            absl::StrCat(what_, " timed out after ", limit.count(),
                         " ms (the group's timeout; KOLO_OP_TIMEOUT unless "
                         "init_process_group or new_group set one); the "
                         "group's point-to-point is closed after it: ",
                         text)));
      }
      // gloo fails a pair's operations when its connection breaks.
      return std::make_exception_ptr(std::runtime_error(absl::StrCat(
          what_, " failed: ",
          peer_ < 0 ? std::string("a peer") : absl::StrCat("rank ", peer_),
          " lost (connection to it broken): ", text)));
    }
  }

  const bool recv_;
  const int peer_;  // -1: any
  const std::string what_;
  const at::Tensor target_;  // the caller's tensor
  const at::Tensor staged_;  // contiguous: target_ itself, or a copy
  const std::unique_ptr<::gloo::transport::UnboundBuffer> buffer_;
  const std::shared_ptr<::gloo::Context> context_;  // outlives buffer_
  const std::chrono::milliseconds timeout_;
  mutable Mutex mu_;
  bool done_ KOLO_GUARDED_BY(mu_) = false;
  std::exception_ptr error_ KOLO_GUARDED_BY(mu_);
  int source_ KOLO_GUARDED_BY(mu_) = -1;
};

at::Tensor CheckedTensor(const at::Tensor& tensor, const std::string& what) {
  TORCH_CHECK(tensor.device().is_cpu(),
              "kolo's torch.distributed backend: ", what,
              ": point-to-point takes CPU tensors (this one is on ",
              tensor.device().str(), ")");
  TORCH_CHECK(tensor.layout() == at::kStrided,
              "kolo's torch.distributed backend: ", what,
              ": point-to-point takes dense tensors");
  return tensor;
}

}  // namespace

PointToPoint::PointToPoint(std::string group, int rank, int size,
                           std::string transport,
                           std::shared_ptr<ShmPointToPoint> shm,
                           std::shared_ptr<::gloo::Context> context)
    : group_(std::move(group)),
      rank_(rank),
      size_(size),
      transport_(std::move(transport)),
      shm_(std::move(shm)),
      context_(std::move(context)) {}

std::shared_ptr<PointToPoint> PointToPoint::Connect(
    const std::string& group, int rank, int size,
    const c10::intrusive_ptr<c10d::Store>& store, bool shm,
    const std::string& bind_addr, std::chrono::milliseconds start_timeout) {
  try {
    std::string why_not = "KOLO_SHM=0";
    if (size < 2) {
      why_not = "the group has one rank";
    } else if (shm) {
      std::shared_ptr<ShmPointToPoint> local = ShmPointToPoint::Connect(
          group, rank, size, store, start_timeout, &why_not);
      if (local) {
        return std::shared_ptr<PointToPoint>(new PointToPoint(
            group, rank, size, "shared memory", std::move(local), nullptr));
      }
    }
    ::gloo::transport::tcp::attr attr;
    attr.hostname = bind_addr;
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    context->setTimeout(start_timeout);
    TorchStoreAdapter adapter(store, start_timeout);
    ::gloo::rendezvous::PrefixStore prefixed("kolo-point-to-point", adapter);
    context->connectFullMesh(prefixed, device);
    return std::shared_ptr<PointToPoint>(
        new PointToPoint(group, rank, size, "gloo (TCP): " + why_not, nullptr,
                         std::move(context)));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "kolo's torch.distributed backend: group \"", group,
                "\": rank ", rank, " could not connect point-to-point to its ",
                size - 1, " peers within ", start_timeout.count(),
                " ms (KOLO_START_TIMEOUT): ", e.what());
  }
}

c10::intrusive_ptr<c10d::Work> PointToPoint::Send(
    const at::Tensor& tensor, int peer, int tag,
    std::chrono::milliseconds timeout) {
  const std::string what = absl::StrCat("send to rank ", peer, " (tag ", tag,
                                        ") in group \"", group_, "\"");
  TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_,
              "kolo's torch.distributed backend: ", what,
              ": the destination must be another rank of the group's ", size_);
  at::Tensor staged = CheckedTensor(tensor, what).contiguous();
  if (shm_) {
    return shm_->Post(/*recv=*/false, peer, tag, tensor, staged, what, timeout);
  }
  auto buffer =
      context_->createUnboundBuffer(staged.data_ptr(), staged.nbytes());
  buffer->send(peer, static_cast<uint32_t>(tag));
  return c10::make_intrusive<PointToPointWork>(
      c10d::OpType::SEND, what, rank_, peer, tensor, staged, std::move(buffer),
      context_, timeout);
}

c10::intrusive_ptr<c10d::Work> PointToPoint::Recv(
    const at::Tensor& tensor, int peer, int tag,
    std::chrono::milliseconds timeout) {
  const std::string what =
      peer < 0 ? absl::StrCat("recv from any rank (tag ", tag, ") in group \"",
                              group_, "\"")
               : absl::StrCat("recv from rank ", peer, " (tag ", tag,
                              ") in group \"", group_, "\"");
  TORCH_CHECK(peer < size_ && peer != rank_,
              "kolo's torch.distributed backend: ", what,
              ": the source must be another rank of the group's ", size_);
  CheckedTensor(tensor, what);
  at::Tensor staged =
      tensor.is_contiguous()
          ? tensor
          : at::empty_like(tensor, at::MemoryFormat::Contiguous);
  if (shm_) {
    return shm_->Post(/*recv=*/true, peer, tag, tensor, staged, what, timeout);
  }
  auto buffer =
      context_->createUnboundBuffer(staged.data_ptr(), staged.nbytes());
  if (peer < 0) {
    std::vector<int> others;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) others.push_back(r);
    }
    buffer->recv(others, static_cast<uint32_t>(tag));
  } else {
    buffer->recv(peer, static_cast<uint32_t>(tag));
  }
  return c10::make_intrusive<PointToPointWork>(
      peer < 0 ? c10d::OpType::RECVANYSOURCE : c10d::OpType::RECV, what, rank_,
      peer, tensor, staged, std::move(buffer), context_, timeout);
}

}  // namespace torch
}  // namespace kolo
