// Test helpers for the executor's tests (executor_test.cc,
// executor_collectives_test.cc, executor_device_test.cc): recording fake
// backends for one rank of a simulated set, and builders of responses and
// entries as LogExecutor::ExecuteResponse hands them to the executor.
//
// The fakes simulate the other ranks of the set as if every rank had this
// rank's input (Allreduce sum: data * size), and fill what other ranks send
// (broadcast, allgather, alltoall) with PeerByte(rank, offset).
#ifndef KOLO_TESTS_RUNTIME_LOOP_EXECUTOR_TESTING_H_
#define KOLO_TESTS_RUNTIME_LOOP_EXECUTOR_TESTING_H_

#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kolo/work.h"
#include "ops/cpu/reduce.h"
#include "runtime/api/work_state.h"
#include "runtime/loop/backend.h"
#include "runtime/loop/tensor_queue.h"
#include "runtime/sync/mutex.h"
#include "runtime/wire.pb.h"

namespace kolo {
namespace executor_testing {

// What rank `rank` contributes at byte `offset` of its block, in the fakes.
inline uint8_t PeerByte(int rank, size_t offset) {
  return static_cast<uint8_t>(offset * 13 + rank * 41 + 1);
}

// A host-memory backend for rank `rank` of a set of `size` that records
// every call. Memory is counted so that leaks show.
class RecordingBackend : public Backend {
 public:
  RecordingBackend(int rank, int size) : rank_(rank), size_(size) {}

  const char* name() const override { return "fake"; }

  // ---- Knobs --------------------------------------------------------------
  // AllreducePieces offered for counts >= pieces_from (never when < 0).
  int64_t pieces_from = -1;
  // The next collective fails with this.
  absl::Status fail_next;
  // Alltoallv: what each other rank sends is what this rank sends to itself
  // (every rank has the same input), instead of PeerByte.
  bool peers_mirror_me = false;

  // ---- Records -------------------------------------------------------------
  std::vector<std::string> calls;  // collectives, in order
  struct Pieces {
    std::vector<FusedPiece> pieces;
    size_t count = 0;
  };
  std::vector<Pieces> pieces_calls;
  std::vector<std::vector<size_t>> allgather_bytes;
  std::vector<std::vector<size_t>> alltoall_send, alltoall_recv;
  std::vector<double> scale_factors;
  mutable std::vector<std::pair<size_t, DataType>> supports_queries;
  int allocations = 0;
  int frees = 0;
  int copies = 0;
  int live() const { return allocations - frees; }

  bool SupportsAllreducePieces(size_t count, DataType dtype) const override {
    supports_queries.emplace_back(count, dtype);
    return pieces_from >= 0 && count >= static_cast<size_t>(pieces_from);
  }
  absl::Status AllreducePieces(const std::vector<FusedPiece>& pieces,
                               size_t count, DataType dtype,
                               ReduceOp op) override {
    calls.push_back(absl::StrCat("AllreducePieces(", count, ",",
                                 DataTypeName(dtype), ",", ReduceOpName(op),
                                 ")"));
    pieces_calls.push_back({pieces, count});
    if (absl::Status s = TakeFailure(); !s.ok()) return s;
    for (const FusedPiece& p : pieces) {
      const size_t bytes = p.count * DataTypeSize(dtype);
      if (bytes && p.output != p.input) std::memcpy(p.output, p.input, bytes);
      Reduce(p.output, p.count, dtype, op);
    }
    return absl::OkStatus();
  }
  absl::Status Allreduce(void* data, size_t count, DataType dtype,
                         ReduceOp op) override {
    calls.push_back(absl::StrCat("Allreduce(", count, ",", DataTypeName(dtype),
                                 ",", ReduceOpName(op), ")"));
    if (absl::Status s = TakeFailure(); !s.ok()) return s;
    Reduce(data, count, dtype, op);
    return absl::OkStatus();
  }
  absl::Status AllreduceScaled(void* data, size_t count, DataType dtype,
                               ReduceOp op, double prescale,
                               double postscale) override {
    calls.push_back(absl::StrCat("AllreduceScaled(pre=", prescale,
                                 ",post=", postscale, ")"));
    return Backend::AllreduceScaled(data, count, dtype, op, prescale,
                                    postscale);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    calls.push_back(absl::StrCat("Broadcast(", bytes, ",root=", root, ")"));
    if (absl::Status s = TakeFailure(); !s.ok()) return s;
    if (rank_ != root) {
      for (size_t i = 0; i < bytes; ++i) {
        static_cast<uint8_t*>(data)[i] = PeerByte(root, i);
      }
    }
    return absl::OkStatus();
  }
  absl::Status Allgatherv(const void* input, void* output,
                          const std::vector<size_t>& bytes_per_rank) override {
    calls.push_back(
        absl::StrCat("Allgatherv(", absl::StrJoin(bytes_per_rank, ","), ")"));
    allgather_bytes.push_back(bytes_per_rank);
    if (absl::Status s = TakeFailure(); !s.ok()) return s;
    uint8_t* out = static_cast<uint8_t*>(output);
    for (int k = 0; k < size_; ++k) {
      if (k == rank_) {
        if (bytes_per_rank[k]) std::memcpy(out, input, bytes_per_rank[k]);
      } else {
        for (size_t i = 0; i < bytes_per_rank[k]; ++i) out[i] = PeerByte(k, i);
      }
      out += bytes_per_rank[k];
    }
    return absl::OkStatus();
  }
  absl::Status Alltoallv(const void* input,
                         const std::vector<size_t>& send_bytes, void* output,
                         const std::vector<size_t>& recv_bytes) override {
    calls.push_back(absl::StrCat("Alltoallv(", absl::StrJoin(send_bytes, ","),
                                 ";", absl::StrJoin(recv_bytes, ","), ")"));
    alltoall_send.push_back(send_bytes);
    alltoall_recv.push_back(recv_bytes);
    if (absl::Status s = TakeFailure(); !s.ok()) return s;
    const uint8_t* in = static_cast<const uint8_t*>(input);
    size_t to_me = 0;  // offset of the block this rank sends itself
    for (int k = 0; k < rank_; ++k) to_me += send_bytes[k];
    uint8_t* out = static_cast<uint8_t*>(output);
    for (int k = 0; k < size_; ++k) {
      if (k == rank_ || peers_mirror_me) {
        EXPECT_EQ(recv_bytes[k], send_bytes[rank_]) << "block from " << k;
        if (recv_bytes[k]) std::memcpy(out, in + to_me, recv_bytes[k]);
      } else {
        for (size_t i = 0; i < recv_bytes[k]; ++i) out[i] = PeerByte(k, i);
      }
      out += recv_bytes[k];
    }
    return absl::OkStatus();
  }
  void Combine(void* out, const void* in, size_t count, DataType dtype,
               ReduceOp op) override {
    calls.push_back(absl::StrCat("Combine(", count, ")"));
    cpu::Reduce(op, dtype, out, out, in, count);
  }
  void Scale(void* data, size_t count, DataType dtype, double factor) override {
    scale_factors.push_back(factor);
    cpu::Scale(dtype, data, count, factor);
  }
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    ++allocations;
    return Backend::Allocate(bytes);
  }
  void Free(void* data) override {
    ++frees;
    Backend::Free(data);
  }
  void Copy(void* dst, const void* src, size_t bytes) override {
    ++copies;
    Backend::Copy(dst, src, bytes);
  }

 protected:
  absl::Status TakeFailure() {
    absl::Status s = fail_next;
    fail_next = absl::OkStatus();
    return s;
  }
  // As if every rank had this rank's data.
  void Reduce(void* data, size_t count, DataType dtype, ReduceOp op) {
    if (op != ReduceOp::kSum) return;  // min/max of equal inputs
    for (size_t i = 0; i < count; ++i) {
      switch (dtype) {
        case DataType::kFloat32:
          static_cast<float*>(data)[i] *= static_cast<float>(size_);
          break;
        case DataType::kInt32:
          static_cast<int32_t*>(data)[i] *= size_;
          break;
        default:
          ADD_FAILURE() << "fake reduces float32 and int32 only";
          return;
      }
    }
  }

  const int rank_;
  const int size_;
};

// A device backend (host_memory() false): completion only when the test
// calls the `done` it was handed, from whichever thread it likes.
class DeviceBackend : public RecordingBackend {
 public:
  using RecordingBackend::RecordingBackend;
  bool host_memory() const override { return false; }

  absl::Status WaitReady(
      const std::vector<std::shared_ptr<ReadyEvent>>& ready) override {
    calls.push_back(absl::StrCat("WaitReady(", ready.size(), ")"));
    ready_events.push_back(ready);
    return absl::OkStatus();
  }
  absl::Status Reducescatterv(const void* input, void* output,
                              const std::vector<size_t>& counts, DataType dtype,
                              ReduceOp op, double prescale,
                              double postscale) override {
    calls.push_back(absl::StrCat("Reducescatterv(", absl::StrJoin(counts, ","),
                                 ",", ReduceOpName(op), ",pre=", prescale,
                                 ",post=", postscale, ")"));
    return absl::OkStatus();
  }
  void Finish(std::function<void(absl::Status)> done) override {
    MutexLock lock(&mu);
    pending_done.push_back(std::move(done));
  }

  Mutex mu;
  std::vector<std::function<void(absl::Status)>> pending_done
      KOLO_GUARDED_BY(mu);
  std::vector<std::vector<std::shared_ptr<ReadyEvent>>> ready_events;

  // Runs every pending `done` with `status` on another thread (as a device
  // backend's completion thread would) and waits for it.
  void CompleteOnAnotherThread(absl::Status status) {
    std::vector<std::function<void(absl::Status)>> done;
    {
      MutexLock lock(&mu);
      done.swap(pending_done);
    }
    std::thread t([&] {
      for (auto& d : done) d(status);
    });
    t.join();
  }
  size_t waiting() {
    MutexLock lock(&mu);
    return pending_done.size();
  }
};

class NeverReady : public ReadyEvent {
 public:
  bool Ready() override { return false; }
};

// ---- Building responses and entries ---------------------------------------

inline wire::Response MakeResponse(wire::ResponseType type,
                                   const std::vector<std::string>& names,
                                   const std::vector<int64_t>& elements,
                                   DataType dtype = DataType::kFloat32,
                                   ReduceOp op = ReduceOp::kSum) {
  wire::Response r;
  r.set_type(type);
  for (const std::string& n : names) r.add_names(n);
  for (int64_t e : elements) r.add_elements(e);
  r.set_dtype(static_cast<int>(dtype));
  r.set_op(static_cast<int>(op));
  r.set_prescale(1);
  r.set_postscale(1);
  return r;
}

inline wire::CollectiveType RequestTypeOf(wire::ResponseType type) {
  switch (type) {
    case wire::RESPONSE_BROADCAST:
      return wire::BROADCAST;
    case wire::RESPONSE_ALLGATHER:
      return wire::ALLGATHER;
    case wire::RESPONSE_ALLTOALL:
      return wire::ALLTOALL;
    case wire::RESPONSE_REDUCESCATTER:
      return wire::REDUCESCATTER;
    case wire::RESPONSE_BARRIER:
      return wire::BARRIER;
    case wire::RESPONSE_JOIN:
      return wire::JOIN;
    default:
      return wire::ALLREDUCE;
  }
}

inline std::unique_ptr<TensorEntry> MakeEntry(const std::string& name,
                                              wire::ResponseType type,
                                              void* input, void* output,
                                              DataType dtype,
                                              std::vector<int64_t> shape) {
  auto e = std::make_unique<TensorEntry>();
  e->request.set_name(name);
  e->request.set_type(RequestTypeOf(type));
  e->request.set_dtype(static_cast<int>(dtype));
  for (int64_t d : shape) e->request.add_shape(d);
  e->input = TensorView(input, dtype, shape);
  e->output = TensorView(output, dtype, shape);
  e->work = std::make_shared<internal::WorkState>();
  return e;
}

inline std::unique_ptr<TensorEntry> FloatEntry(const std::string& name,
                                               wire::ResponseType type,
                                               std::vector<float>& in,
                                               std::vector<float>& out) {
  return MakeEntry(name, type, in.data(), out.data(), DataType::kFloat32,
                   {static_cast<int64_t>(in.size())});
}

// Entries keep only a pointer to their Work state: the test keeps these.
inline std::vector<std::shared_ptr<internal::WorkState>> WorksOf(
    const std::vector<std::unique_ptr<TensorEntry>>& entries) {
  std::vector<std::shared_ptr<internal::WorkState>> works;
  for (const auto& e : entries) works.push_back(e->work);
  return works;
}

inline std::vector<float> Iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

inline std::vector<float> Times(std::vector<float> v, float factor) {
  for (float& x : v) x *= factor;
  return v;
}

// An allocator that hands out `storage` resized to the shape's elements,
// and records the shape.
inline OutputAllocator VectorAllocator(std::vector<uint8_t>* storage,
                                       size_t elem_bytes,
                                       std::vector<int64_t>* shape_seen) {
  return [=](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
    *shape_seen = shape;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    storage->assign(n * elem_bytes + 1, 0xEE);  // +1: never null
    return static_cast<void*>(storage->data());
  };
}

inline constexpr absl::Duration kWait = absl::Seconds(10);

}  // namespace executor_testing
}  // namespace kolo

#endif  // KOLO_TESTS_RUNTIME_LOOP_EXECUTOR_TESTING_H_
