#include "ops/gloo/gloo_backend.h"

#include <atomic>
#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "gloo/allgatherv.h"
#include "gloo/allreduce.h"
#include "gloo/alltoallv.h"
#include "gloo/broadcast.h"
#include "ops/cpu/host_backend.h"
#include "ops/cpu/reduce.h"
#include "ops/gloo/gloo_context.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace gloo_backend {
namespace {

absl::Status GlooError(const char* what, const std::exception& e) {
  // gloo reports a dead or hung peer as an I/O error or a timeout.
  return absl::UnavailableError(absl::StrCat(
      "gloo ", what, " failed: ", e.what(),
      " (a peer may have died, or the op timed out; see earlier errors)"));
}

template <typename T>
void SetAllreduceBuffers(::gloo::AllreduceOptions& opts, void* data,
                         size_t count) {
  opts.setOutput(static_cast<T*>(data), count);
}

class GlooBackend : public cpu::HostBackend {
 public:
  explicit GlooBackend(const BackendContext& c)
      : rank_(c.rank), size_(c.size) {}

  absl::Status Connect(const BackendContext& c) {
    if (size_ == 1) return absl::OkStatus();
    auto context = ConnectGlooContext(rank_, size_, c.store, c.bind_addr,
                                      c.start_timeout, c.op_timeout);
    if (!context.ok()) return context.status();
    context_ = std::move(*context);
    return absl::OkStatus();
  }

  const char* name() const override { return "gloo"; }

  absl::Status Allreduce(void* data, size_t count, DataType dtype,
                         ReduceOp op) override {
    if (size_ == 1 || count == 0) return absl::OkStatus();
    try {
      ::gloo::AllreduceOptions opts(context_);
      opts.setTimeout(context_->getTimeout());
      switch (DataTypeSize(dtype)) {
        case 1:
          SetAllreduceBuffers<uint8_t>(opts, data, count);
          break;
        case 2:
          SetAllreduceBuffers<uint16_t>(opts, data, count);
          break;
        case 4:
          SetAllreduceBuffers<uint32_t>(opts, data, count);
          break;
        default:
          SetAllreduceBuffers<uint64_t>(opts, data, count);
          break;
      }
      opts.setReduceFunction(
          [dtype, op](void* out, const void* a, const void* b, size_t n) {
            cpu::Reduce(op, dtype, out, a, b, n);
          });
      ::gloo::allreduce(opts);
    } catch (const std::exception& e) {
      return GlooError("allreduce", e);
    }
    return absl::OkStatus();
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    if (size_ == 1 || bytes == 0) return absl::OkStatus();
    try {
      ::gloo::BroadcastOptions opts(context_);
      opts.setTimeout(context_->getTimeout());
      opts.setRoot(root);
      if (rank_ == root) opts.setInput(static_cast<uint8_t*>(data), bytes);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      ::gloo::broadcast(opts);
    } catch (const std::exception& e) {
      return GlooError("broadcast", e);
    }
    return absl::OkStatus();
  }

  absl::Status Allgatherv(const void* input, void* output,
                          const std::vector<size_t>& bytes_per_rank) override {
    if (size_ == 1) {
      if (bytes_per_rank[0] && input != output) {
        std::memmove(output, input, bytes_per_rank[0]);
      }
      return absl::OkStatus();
    }
    size_t total = 0;
    for (size_t b : bytes_per_rank) total += b;
    if (total == 0) return absl::OkStatus();
    try {
      ::gloo::AllgathervOptions opts(context_);
      opts.setTimeout(context_->getTimeout());
      // gloo wants a non-null input even for zero bytes.
      uint8_t dummy = 0;
      const void* in = bytes_per_rank[rank_] ? input : &dummy;
      opts.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)),
                    bytes_per_rank[rank_]);
      opts.setOutput(static_cast<uint8_t*>(output), bytes_per_rank);
      ::gloo::allgatherv(opts);
    } catch (const std::exception& e) {
      return GlooError("allgather", e);
    }
    return absl::OkStatus();
  }

  absl::Status Alltoallv(const void* input,
                         const std::vector<size_t>& send_bytes, void* output,
                         const std::vector<size_t>& recv_bytes) override {
    if (size_ == 1) {
      if (send_bytes[0] && input != output) {
        std::memmove(output, input, send_bytes[0]);
      }
      return absl::OkStatus();
    }
    size_t sent = 0, received = 0;
    for (size_t b : send_bytes) sent += b;
    for (size_t b : recv_bytes) received += b;
    if (sent == 0 && received == 0) return absl::OkStatus();
    try {
      ::gloo::AlltoallvOptions opts(context_);
      opts.setTimeout(context_->getTimeout());
      // gloo wants non-null buffers even for zero bytes.
      uint8_t dummy_in = 0, dummy_out = 0;
      uint8_t* in =
          sent ? static_cast<uint8_t*>(const_cast<void*>(input)) : &dummy_in;
      uint8_t* out = received ? static_cast<uint8_t*>(output) : &dummy_out;
      opts.setInput(in,
                    std::vector<int64_t>(send_bytes.begin(), send_bytes.end()));
      opts.setOutput(
          out, std::vector<int64_t>(recv_bytes.begin(), recv_bytes.end()));
      ::gloo::alltoallv(opts);
    } catch (const std::exception& e) {
      return GlooError("alltoall", e);
    }
    return absl::OkStatus();
  }

  void Close() override {
    // gloo has no abort. Closing our pairs makes every peer's I/O with us
    // fail at once (they see the connection close), so peers stuck in a
    // collective with this rank end quickly; a collective of ours that is
    // blocked fails the same way or at gloo's timeout. gloo's pairs lock
    // around their state, so this may run while a collective is in flight.
    if (closed_.exchange(true) || !context_) return;
    try {
      context_->closeConnections();
    } catch (const std::exception&) {
      // Already broken: nothing left to close.
    }
  }

 private:
  const int rank_;
  const int size_;
  std::atomic<bool> closed_{false};
  std::shared_ptr<::gloo::Context> context_;
};

const BackendRegistrar kRegistrar(DeviceType::kCpu, "gloo",
                                  [](const BackendContext& c) {
                                    return CreateGlooBackend(c);
                                  });

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateGlooBackend(
    const BackendContext& context) {
  auto backend = std::make_unique<GlooBackend>(context);
  KOLO_RETURN_IF_ERROR(backend->Connect(context));
  return std::unique_ptr<Backend>(std::move(backend));
}

}  // namespace gloo_backend
}  // namespace kolo
