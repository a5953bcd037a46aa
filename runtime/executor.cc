#include "runtime/executor.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/controller.h"

namespace kolo {
namespace {

std::string Names(const wire::Response& r) {
  if (r.names_size() == 1) return absl::StrCat("\"", r.names(0), "\"");
  return absl::StrCat(r.names_size(), " fused tensors (\"", r.names(0),
                      "\", ...)");
}

// Note [Fusion without a buffer]
// A fused allreduce packs its tensors into the fusion buffer, reduces it and
// unpacks it: two extra copies of every byte. A backend that implements
// Backend::AllreducePieces (shm) instead reads each input and writes each
// output in place, with bitwise the same results; the runtime packs only
// when the backend does not offer it for this size (small lists, other
// backends), when a prescale factor must be applied to the inputs first, or
// when this rank's tensors share memory (the packed order of reads and
// writes is then what the caller gets; the backend lets ranks mix the two
// paths). A postscale factor is applied to each output afterwards
// (elementwise, so the same bits as scaling the buffer).
bool Overlapping(const std::vector<FusedPiece>& pieces, size_t elem) {
  // [begin, end, piece] of every input and output range, sorted.
  std::vector<std::tuple<uintptr_t, uintptr_t, size_t>> ranges;
  ranges.reserve(2 * pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    const size_t bytes = pieces[i].count * elem;
    if (bytes == 0) continue;
    const auto in = reinterpret_cast<uintptr_t>(pieces[i].input);
    const auto out = reinterpret_cast<uintptr_t>(pieces[i].output);
    ranges.emplace_back(in, in + bytes, i);
    if (out != in) ranges.emplace_back(out, out + bytes, i);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k) {
    if (std::get<0>(ranges[k]) < std::get<1>(ranges[k - 1])) return true;
  }
  return false;
}

void CompleteAll(std::vector<std::unique_ptr<TensorEntry>>& entries,
                 const absl::Status& status) {
  for (auto& e : entries) e->Complete(status);
}

}  // namespace

template <typename F>
auto Executor::Phase(const wire::Response& r, const char* phase, F&& body,
                     const std::string& args) {
  const bool on = timeline_ && timeline_->enabled();
  if (on) {
    for (const std::string& name : r.names()) timeline_->Begin(name, phase, args);
  }
  auto result = body();
  if (on) {
    for (const std::string& name : r.names()) timeline_->End(name, phase);
  }
  return result;
}

const char* Executor::CollectivePhase(const char* op) {
  // "GLOO_ALLREDUCE": backend name and collective, stable for the run.
  std::string phase = absl::StrCat(backend_->name(), "_", op);
  for (char& c : phase) c = static_cast<char>(std::toupper(c));
  return phase_names_.insert(std::move(phase)).first->c_str();
}

uint8_t* Executor::FusionBuffer(size_t bytes) {
  if (fusion_.size() < bytes) fusion_.resize(bytes);
  return fusion_.data();
}

absl::Status Executor::Execute(
    const wire::Response& r,
    std::vector<std::unique_ptr<TensorEntry>>& entries) {
  if (r.type() == wire::RESPONSE_ERROR) {
    CompleteAll(entries, absl::Status(static_cast<absl::StatusCode>(r.error_code()),
                                      r.error()));
    return absl::OkStatus();
  }
  if (timeline_ && timeline_->enabled()) {
    ++batch_;
    for (const std::string& name : r.names()) timeline_->End(name, "QUEUE");
  }
  absl::Status s;
  const char* what = "allreduce";
  switch (r.type()) {
    case wire::RESPONSE_BARRIER:
      CompleteAll(entries, absl::OkStatus());
      return absl::OkStatus();
    case wire::RESPONSE_JOIN:
      for (auto& e : entries) e->Complete(absl::OkStatus(), {r.value()});
      return absl::OkStatus();
    case wire::RESPONSE_ALLTOALL:
      what = "alltoall";
      s = Alltoall(r, *entries[0]);
      break;
    case wire::RESPONSE_REDUCESCATTER:
      what = "reducescatter";
      s = Reducescatter(r, *entries[0]);
      break;
    case wire::RESPONSE_ALLREDUCE:
      s = Allreduce(r, entries);
      break;
    case wire::RESPONSE_BROADCAST:
      what = "broadcast";
      s = Broadcast(r, entries);
      break;
    case wire::RESPONSE_ALLGATHER:
      what = "allgather";
      s = Allgather(r, entries);
      break;
    default:
      s = absl::InternalError("unknown response type");
  }
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat(what, " of ", Names(r), " on rank ",
                                            rank_, ": ", s.message()));
    CompleteAll(entries, s);
  }
  return s;
}

absl::Status Executor::Allreduce(
    const wire::Response& r,
    std::vector<std::unique_ptr<TensorEntry>>& entries) {
  const DataType dtype = static_cast<DataType>(r.dtype());
  const size_t elem = DataTypeSize(dtype);
  ReduceOp op = static_cast<ReduceOp>(r.op());
  double postscale = r.postscale();
  if (op == ReduceOp::kAverage) {
    op = ReduceOp::kSum;
    // While ranks have joined, only `contributors` ranks sent data.
    postscale /= (r.contributors() > 0 && !average_over_set_size_)
                     ? r.contributors()
                     : size_;
  }
  const bool scale_in = r.prescale() != 1.0;
  const bool scale_out = postscale != 1.0;

  uint8_t* buffer;
  size_t total = 0;
  for (int64_t e : r.elements()) total += e;
  if (entries.size() > 1 && !scale_in &&
      backend_->SupportsAllreducePieces(total, dtype)) {
    // Note [Fusion without a buffer]: the backend reads and writes the
    // tensors in place, saving two copies of every byte.
    std::vector<FusedPiece> pieces(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      pieces[i] = {entries[i]->input.data, entries[i]->output.data,
                   static_cast<size_t>(r.elements(i))};
    }
    if (!Overlapping(pieces, elem)) {
      absl::Status s = Phase(
          r, CollectivePhase("ALLREDUCE"),
          [&] { return backend_->AllreducePieces(pieces, total, dtype, op); },
          absl::StrCat("\"size\": ", total * elem, ", \"batch\": ", batch_,
                       ", \"tensors\": ", entries.size()));
      if (!s.ok()) return s;
      if (scale_out) {
        for (const FusedPiece& p : pieces) {
          backend_->Scale(p.output, p.count, dtype, postscale);
        }
      }
      CompleteAll(entries, absl::OkStatus());
      return absl::OkStatus();
    }
  }
  if (entries.size() == 1) {
    // In place on the caller's output.
    TensorEntry& e = *entries[0];
    buffer = static_cast<uint8_t*>(e.output.data);
    if (total && e.output.data != e.input.data) {
      std::memcpy(buffer, e.input.data, total * elem);
    }
  } else {
    buffer = FusionBuffer(total * elem);
    Phase(r, "MEMCPY_IN_FUSION_BUFFER", [&] {
      size_t offset = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t bytes = r.elements(i) * elem;
        if (bytes) std::memcpy(buffer + offset, entries[i]->input.data, bytes);
        offset += bytes;
      }
      return 0;
    });
  }
  if (scale_in) backend_->Scale(buffer, total, dtype, r.prescale());
  absl::Status s = Phase(
      r, CollectivePhase("ALLREDUCE"),
      [&] { return backend_->Allreduce(buffer, total, dtype, op); },
      absl::StrCat("\"size\": ", total * elem, ", \"batch\": ", batch_,
                   ", \"tensors\": ", entries.size()));
  if (!s.ok()) return s;
  if (scale_out) backend_->Scale(buffer, total, dtype, postscale);
  if (entries.size() > 1) {
    Phase(r, "MEMCPY_OUT_FUSION_BUFFER", [&] {
      size_t offset = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t bytes = r.elements(i) * elem;
        if (bytes) std::memcpy(entries[i]->output.data, buffer + offset, bytes);
        offset += bytes;
      }
      return 0;
    });
  }
  CompleteAll(entries, absl::OkStatus());
  return absl::OkStatus();
}

absl::Status Executor::Broadcast(
    const wire::Response& r,
    std::vector<std::unique_ptr<TensorEntry>>& entries) {
  const size_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  const int root = r.root();
  absl::Status s;
  if (entries.size() == 1) {
    s = Phase(r, CollectivePhase("BROADCAST"), [&] {
      return backend_->Broadcast(entries[0]->input.data, r.elements(0) * elem,
                                 root);
    });
  } else {
    size_t total = 0;
    for (int64_t e : r.elements()) total += e * elem;
    uint8_t* buffer = FusionBuffer(total);
    if (rank_ == root) {
      size_t offset = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t bytes = r.elements(i) * elem;
        if (bytes) std::memcpy(buffer + offset, entries[i]->input.data, bytes);
        offset += bytes;
      }
    }
    s = Phase(r, CollectivePhase("BROADCAST"),
              [&] { return backend_->Broadcast(buffer, total, root); });
    if (s.ok() && rank_ != root) {
      size_t offset = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t bytes = r.elements(i) * elem;
        if (bytes) std::memcpy(entries[i]->input.data, buffer + offset, bytes);
        offset += bytes;
      }
    }
  }
  if (!s.ok()) return s;
  CompleteAll(entries, absl::OkStatus());
  return absl::OkStatus();
}

absl::Status Executor::Allgather(
    const wire::Response& r,
    std::vector<std::unique_ptr<TensorEntry>>& entries) {
  const size_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  const size_t n = entries.size();
  // first_dims[i * size + k]: rows of tensor i on rank k.
  auto rows = [&](size_t i, int k) {
    return static_cast<size_t>(r.first_dims(i * size_ + k));
  };
  std::vector<size_t> row_bytes(n);
  std::vector<void*> outputs(n);
  std::vector<absl::Status> alloc_status(n);
  std::vector<std::vector<uint8_t>> fallback(n);  // when an allocator fails
  for (size_t i = 0; i < n; ++i) {
    row_bytes[i] = r.elements(i) * elem;
    std::vector<int64_t> shape = entries[i]->input.shape;
    size_t total_rows = 0;
    for (int k = 0; k < size_; ++k) total_rows += rows(i, k);
    shape[0] = static_cast<int64_t>(total_rows);
    auto out = entries[i]->allocator(shape);
    if (out.ok() && (*out != nullptr || total_rows * row_bytes[i] == 0)) {
      outputs[i] = *out;
    } else {
      alloc_status[i] = out.ok() ? absl::InternalError("allocator returned null")
                                 : out.status();
      // Still take part, so that the other ranks do not hang.
      fallback[i].resize(total_rows * row_bytes[i]);
      outputs[i] = fallback[i].data();
    }
  }

  std::vector<size_t> block_bytes(size_, 0);
  for (int k = 0; k < size_; ++k) {
    for (size_t i = 0; i < n; ++i) block_bytes[k] += rows(i, k) * row_bytes[i];
  }
  absl::Status s;
  if (n == 1) {
    s = Phase(r, CollectivePhase("ALLGATHER"), [&] {
      return backend_->Allgatherv(entries[0]->input.data, outputs[0],
                                  block_bytes);
    });
  } else {
    if (gather_send_.size() < block_bytes[rank_]) {
      gather_send_.resize(block_bytes[rank_]);
    }
    size_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      const size_t bytes = rows(i, rank_) * row_bytes[i];
      if (bytes) std::memcpy(gather_send_.data() + offset, entries[i]->input.data, bytes);
      offset += bytes;
    }
    size_t total = 0;
    for (size_t b : block_bytes) total += b;
    uint8_t* buffer = FusionBuffer(total);
    s = Phase(r, CollectivePhase("ALLGATHER"), [&] {
      return backend_->Allgatherv(gather_send_.data(), buffer, block_bytes);
    });
    if (s.ok()) {
      // Block k holds rank k's rows of tensor 0, then of tensor 1, ...
      std::vector<size_t> out_offset(n, 0);
      size_t in_offset = 0;
      for (int k = 0; k < size_; ++k) {
        for (size_t i = 0; i < n; ++i) {
          const size_t bytes = rows(i, k) * row_bytes[i];
          if (bytes) {
            std::memcpy(static_cast<uint8_t*>(outputs[i]) + out_offset[i],
                        buffer + in_offset, bytes);
          }
          out_offset[i] += bytes;
          in_offset += bytes;
        }
      }
    }
  }
  if (!s.ok()) return s;
  for (size_t i = 0; i < n; ++i) {
    std::vector<int64_t> splits(size_);
    for (int k = 0; k < size_; ++k) splits[k] = rows(i, k);
    if (!alloc_status[i].ok()) {
      entries[i]->Complete(absl::Status(
          alloc_status[i].code(),
          absl::StrCat("allgather \"", r.names(i),
                       "\": output allocator failed: ",
                       alloc_status[i].message())));
    } else {
      entries[i]->Complete(absl::OkStatus(), std::move(splits));
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::Alltoall(const wire::Response& r, TensorEntry& e) {
  const size_t row_bytes =
      r.elements(0) * DataTypeSize(static_cast<DataType>(r.dtype()));
  // first_dims[k * size + j]: rows rank k sends to rank j.
  std::vector<size_t> send(size_), recv(size_);
  std::vector<int64_t> splits(size_);
  int64_t rows = 0;
  for (int k = 0; k < size_; ++k) {
    send[k] = r.first_dims(rank_ * size_ + k) * row_bytes;
    splits[k] = r.first_dims(k * size_ + rank_);
    recv[k] = splits[k] * row_bytes;
    rows += splits[k];
  }
  std::vector<int64_t> shape = e.input.shape;
  shape[0] = rows;
  auto out = e.allocator(shape);
  std::vector<uint8_t> fallback;
  absl::Status alloc_status;
  void* output = nullptr;
  if (out.ok() && (*out != nullptr || rows * row_bytes == 0)) {
    output = *out;
  } else {
    alloc_status = out.ok() ? absl::InternalError("allocator returned null")
                            : out.status();
    fallback.resize(rows * row_bytes);  // still take part
    output = fallback.data();
  }
  absl::Status s = Phase(r, CollectivePhase("ALLTOALL"), [&] {
    return backend_->Alltoallv(e.input.data, send, output, recv);
  });
  if (!s.ok()) return s;
  if (!alloc_status.ok()) {
    e.Complete(absl::Status(alloc_status.code(),
                            absl::StrCat("alltoall \"", r.names(0),
                                         "\": output allocator failed: ",
                                         alloc_status.message())));
  } else {
    e.Complete(absl::OkStatus(), std::move(splits));
  }
  return absl::OkStatus();
}

absl::Status Executor::Reducescatter(const wire::Response& r, TensorEntry& e) {
  const DataType dtype = static_cast<DataType>(r.dtype());
  const size_t elem = DataTypeSize(dtype);
  const size_t row = r.elements(0);
  const int64_t rows = r.first_dims(0);
  // Rank k owns rows [offset_k, offset_k + share_k).
  std::vector<size_t> send(size_);
  for (int k = 0; k < size_; ++k) {
    send[k] = (rows / size_ + (k < rows % size_ ? 1 : 0)) * row * elem;
  }
  const size_t mine = send[rank_];
  const size_t mine_count = mine / elem;
  // Pre-scale on a copy: the input belongs to the caller.
  const void* input = e.input.data;
  if (r.prescale() != 1.0) {
    uint8_t* copy = FusionBuffer(rows * row * elem);
    if (rows * row) std::memcpy(copy, input, rows * row * elem);
    backend_->Scale(copy, rows * row, dtype, r.prescale());
    input = copy;
  }
  // Every rank sends rank k its rows of k's share; k reduces the chunks in
  // rank order, so the result is the same bits wherever it is computed.
  if (gather_send_.size() < mine * size_) gather_send_.resize(mine * size_);
  std::vector<size_t> recv(size_, mine);
  absl::Status s = Phase(r, CollectivePhase("REDUCESCATTER"), [&] {
    return backend_->Alltoallv(input, send, gather_send_.data(), recv);
  });
  if (!s.ok()) return s;
  ReduceOp op = static_cast<ReduceOp>(r.op());
  double postscale = r.postscale();
  if (op == ReduceOp::kAverage) {
    op = ReduceOp::kSum;
    postscale /= size_;
  }
  uint8_t* out = static_cast<uint8_t*>(e.output.data);
  if (mine) {
    std::memcpy(out, gather_send_.data(), mine);
    for (int k = 1; k < size_; ++k) {
      backend_->Combine(out, gather_send_.data() + k * mine, mine_count, dtype, op);
    }
    if (postscale != 1.0) backend_->Scale(out, mine_count, dtype, postscale);
  }
  e.Complete(absl::OkStatus());
  return absl::OkStatus();
}

}  // namespace kolo
