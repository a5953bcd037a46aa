#include "runtime/loop/executor.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstring>
#include <exception>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/loop/phase_clock.h"
#include "runtime/negotiation/collectives.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/status_macros.h"

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
  // Often already in order (tensors allocated one after another).
  if (!std::is_sorted(ranges.begin(), ranges.end())) {
    std::sort(ranges.begin(), ranges.end());
  }
  for (size_t k = 1; k < ranges.size(); ++k) {
    if (std::get<0>(ranges[k]) < std::get<1>(ranges[k - 1])) return true;
  }
  return false;
}

void CompleteAll(std::vector<std::unique_ptr<TensorEntry>>& entries,
                 const absl::Status& status) {
  for (auto& e : entries) e->Complete(status);
}

// A program's output allocator (a frontend's: at::empty) is the one piece
// of a program's code that runs inside the runtime, on whichever thread
// executes the collective (the background thread, or a caller in the
// loop's turn: Note [Caller turns]). What it throws stops here and becomes
// the status of its collective (STYLE rule 3: no exception crosses the
// runtime); the rank still takes part.
absl::StatusOr<void*> Allocate(const OutputAllocator& allocator,
                               const std::vector<int64_t>& shape) {
  try {
    return allocator(shape);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("it threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("it threw an exception");
  }
}

}  // namespace

// Entries whose collective the backend completes later. The callbacks hold
// a reference, so it outlives the executor when the backend's completion
// thread finishes after it.
struct Executor::Pending {
  mutable Mutex mu;
  std::set<TensorEntry*> entries KOLO_GUARDED_BY(mu);
  // Held while a callback reports a failure, so that the executor's
  // destructor waits for it: the report reaches the runtime only while
  // the executor (and so the runtime) exists. Separate from `mu`: the
  // report may call back into FailPending.
  Mutex report_mu;
  bool executor_alive KOLO_GUARDED_BY(report_mu) = true;
};

Executor::Executor(
    Backend* backend, int rank, int size, bool average_over_set_size,
    Timeline* timeline,
    std::function<void(const absl::Status&)> on_async_failure,
    std::function<absl::Status(const absl::Status&)> explain_failure)
    : backend_(backend),
      rank_(rank),
      size_(size),
      average_over_set_size_(average_over_set_size),
      timeline_(timeline),
      on_async_failure_(std::move(on_async_failure)),
      explain_failure_(std::move(explain_failure)),
      pending_(std::make_shared<Pending>()) {}

Executor::~Executor() {
  {
    MutexLock lock(&pending_->report_mu);
    pending_->executor_alive = false;
  }
  if (fusion_.data) backend_->Free(fusion_.data);
  if (gather_send_.data) backend_->Free(gather_send_.data);
}

void Executor::FailPending(const absl::Status& status) {
  MutexLock lock(&pending_->mu);
  // Completing under the lock is safe: it only wakes waiters, and the
  // callback that owns the entry takes this lock before destroying it.
  for (TensorEntry* e : pending_->entries) {
    e->Complete(absl::Status(
        status.code(),
        absl::StrCat(CollectiveName(e->request.type()), " \"",
                     e->request.name(), "\" failed: ", status.message())));
  }
}

size_t Executor::pending() const {
  MutexLock lock(&pending_->mu);
  return pending_->entries.size();
}

void Executor::Finish(std::vector<std::unique_ptr<TensorEntry>>& entries,
                      std::vector<Outcome> outcomes, std::vector<void*> temps) {
  ScopedPhase phase(phase_times_, &complete_ns_);
  if (backend_->host_memory() && temps.empty()) {
    // Synchronous backend: the common case, without any allocation.
    for (size_t i = 0; i < entries.size(); ++i) {
      entries[i]->Complete(outcomes[i].status, std::move(outcomes[i].splits));
    }
    return;
  }
  struct Batch {
    std::vector<std::unique_ptr<TensorEntry>> entries;
    std::vector<Outcome> outcomes;
    std::vector<void*> temps;
  };
  auto batch = std::make_shared<Batch>();
  batch->entries = std::move(entries);
  batch->outcomes = std::move(outcomes);
  batch->temps = std::move(temps);
  {
    MutexLock lock(&pending_->mu);
    for (auto& e : batch->entries) pending_->entries.insert(e.get());
  }
  Backend* backend = backend_;
  backend_->Finish([batch, backend, pending = pending_,
                    on_failure = on_async_failure_](absl::Status status) {
    // The job fails before the Works do: a caller woken by the failure
    // finds the runtime failed, and its next collective is refused with
    // the cause instead of running.
    if (!status.ok() && on_failure) {
      MutexLock lock(&pending->report_mu);
      if (pending->executor_alive) on_failure(status);
    }
    {
      MutexLock lock(&pending->mu);
      for (size_t i = 0; i < batch->entries.size(); ++i) {
        TensorEntry& e = *batch->entries[i];
        pending->entries.erase(&e);
        if (status.ok()) {
          e.Complete(batch->outcomes[i].status,
                     std::move(batch->outcomes[i].splits));
        } else {
          e.Complete(absl::Status(
              status.code(),
              absl::StrCat(CollectiveName(e.request.type()), " \"",
                           e.request.name(), "\" failed: ", status.message())));
        }
      }
    }
    for (void* t : batch->temps) backend->Free(t);
  });
}

absl::Status Executor::MoveScratchToBackend(
    std::vector<std::unique_ptr<TensorEntry>>& entries,
    std::vector<void*>* temps) {
  if (backend_->host_memory()) return absl::OkStatus();
  for (auto& e : entries) {
    if (!e->scratch) continue;
    const size_t bytes = e->scratch->size();
    auto mem = backend_->Allocate(bytes);
    if (!mem.ok()) return mem.status();
    temps->push_back(*mem);
    backend_->Copy(*mem, e->scratch->data(), bytes);
    e->input.data = e->output.data = *mem;
    e->input.ready = nullptr;  // host zeros: nothing to wait for
    // Outputs sized later (allgather, alltoall) go to backend memory too.
    e->allocator = nullptr;
  }
  return absl::OkStatus();
}

void* Executor::FallbackOutput(size_t bytes, std::vector<void*>* temps) {
  auto mem = backend_->Allocate(bytes);
  if (!mem.ok()) return nullptr;
  temps->push_back(*mem);
  return *mem;
}

template <typename F>
auto Executor::Phase(const wire::Response& r, const char* phase, F&& body,
                     const std::string& args) {
  const bool on = timeline_ && timeline_->enabled();
  if (on) {
    for (const std::string& name : r.names())
      timeline_->Begin(name, phase, args);
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

uint8_t* Executor::Grow(Buffer& buffer, size_t bytes) {
  if (buffer.data && buffer.bytes >= bytes) return buffer.data;
  if (buffer.data) backend_->Free(buffer.data);
  buffer_bytes_ -= static_cast<int64_t>(buffer.bytes);
  buffer = Buffer();
  auto mem = backend_->Allocate(bytes);
  if (!mem.ok()) return nullptr;
  buffer.data = static_cast<uint8_t*>(*mem);
  buffer.bytes = bytes;
  buffer_bytes_ += static_cast<int64_t>(bytes);
  return buffer.data;
}

absl::Status Executor::Execute(
    const wire::Response& r,
    std::vector<std::unique_ptr<TensorEntry>>& entries) {
  if (r.type() == wire::RESPONSE_ERROR) {
    // An error always fails its Works: a code the sender left unset (0 would
    // read as OK) becomes Unknown.
    const auto code = r.error_code() == 0
                          ? absl::StatusCode::kUnknown
                          : static_cast<absl::StatusCode>(r.error_code());
    CompleteAll(entries, absl::Status(code, r.error()));
    return absl::OkStatus();
  }
  if (timeline_ && timeline_->enabled()) {
    ++batch_;
    for (const std::string& name : r.names()) timeline_->End(name, "QUEUE");
  }
  // Closes the operation's activity (ALLREDUCE, ...) that the coordinator
  // opened, on every way out.
  struct EndOperation {
    const wire::Response& r;
    Timeline* timeline;
    ~EndOperation() {
      const char* op = OperationPhase(r.type());
      if (!timeline || !timeline->enabled() || !op) return;
      for (const std::string& name : r.names()) timeline->End(name, op);
    }
  } end_operation{r, timeline_};
  absl::Status s;
  // Note [One place per collective]: the row names it; moving the bytes is
  // one method per response type below.
  const CollectiveRules* rules = RulesFor(r.type());
  const char* what = rules ? rules->name : "collective";
  switch (r.type()) {
    case wire::RESPONSE_BARRIER:
      CompleteAll(entries, absl::OkStatus());
      return absl::OkStatus();
    case wire::RESPONSE_JOIN:
      for (auto& e : entries) {
        e->work->SetValue(r.last_joined_rank());
        e->Complete(absl::OkStatus());
      }
      return absl::OkStatus();
    case wire::RESPONSE_ALLTOALL:
    case wire::RESPONSE_REDUCESCATTER:
    case wire::RESPONSE_ALLREDUCE:
    case wire::RESPONSE_BROADCAST:
    case wire::RESPONSE_ALLGATHER:
      break;
    default:
      s = absl::InternalError("unknown response type");
  }
  std::vector<void*> temps;
  if (s.ok()) s = MoveScratchToBackend(entries, &temps);
  if (s.ok() && !backend_->host_memory()) {
    std::vector<std::shared_ptr<ReadyEvent>> ready;
    ready.reserve(entries.size());
    for (auto& e : entries) ready.push_back(e->input.ready);
    s = Phase(r, "WAIT_FOR_DATA", [&] { return backend_->WaitReady(ready); });
  }
  std::vector<Outcome> outcomes(entries.size());
  if (s.ok()) {
    switch (r.type()) {
      case wire::RESPONSE_ALLTOALL:
        s = Alltoall(r, *entries[0], &outcomes[0], &temps);
        break;
      case wire::RESPONSE_REDUCESCATTER:
        s = Reducescatter(r, *entries[0]);
        break;
      case wire::RESPONSE_ALLREDUCE:
        s = Allreduce(r, entries);
        break;
      case wire::RESPONSE_BROADCAST:
        s = Broadcast(r, entries);
        break;
      case wire::RESPONSE_ALLGATHER:
        s = Allgather(r, entries, &outcomes, &temps);
        break;
      default:
        break;
    }
  }
  if (!s.ok()) {
    s = absl::Status(s.code(), absl::StrCat(what, " of ", Names(r), " on rank ",
                                            rank_, ": ", s.message()));
    // Note [Buffers of a failed collective] in runtime_impl.cc: the Works
    // complete only now that the backend has let go of their buffers, with
    // the runtime's cause (a lost rank) where it has one.
    const absl::Status cause = explain_failure_ ? explain_failure_(s) : s;
    if (cause == s) {
      CompleteAll(entries, s);
    } else {
      for (auto& e : entries) {
        e->Complete(absl::Status(
            cause.code(),
            absl::StrCat(CollectiveName(e->request.type()), " \"",
                         e->request.name(), "\" failed: ", cause.message())));
      }
    }
    // What was queued before the failure may still read the temporaries.
    Finish(entries, std::move(outcomes), std::move(temps));
    return s;
  }
  Finish(entries, std::move(outcomes), std::move(temps));
  return absl::OkStatus();
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

  uint8_t* buffer;
  size_t total = 0;
  for (int64_t e : r.elements()) total += e;
  if (entries.size() > 1 && r.prescale() == 1.0 &&
      backend_->SupportsAllreducePieces(total, dtype)) {
    // Note [Fusion without a buffer]: the backend reads and writes the
    // tensors in place, saving two copies of every byte.
    std::vector<FusedPiece> pieces(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      pieces[i] = {entries[i]->input.data, entries[i]->output.data,
                   static_cast<size_t>(r.elements(i))};
    }
    if (!Overlapping(pieces, elem)) {
      KOLO_RETURN_IF_ERROR(Phase(
          r, CollectivePhase("ALLREDUCE"),
          [&] { return backend_->AllreducePieces(pieces, total, dtype, op); },
          absl::StrCat("\"size\": ", total * elem, ", \"batch\": ", batch_,
                       ", \"tensors\": ", entries.size())));
      if (postscale != 1.0) {
        for (const FusedPiece& p : pieces) {
          backend_->Scale(p.output, p.count, dtype, postscale);
        }
      }
      return absl::OkStatus();
    }
  }
  if (entries.size() == 1) {
    // In place on the caller's output.
    TensorEntry& e = *entries[0];
    buffer = static_cast<uint8_t*>(e.output.data);
    if (total && e.output.data != e.input.data) {
      backend_->Copy(buffer, e.input.data, total * elem);
    }
  } else {
    buffer = Grow(fusion_, total * elem);
    if (buffer == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate a fusion buffer of ", total * elem, " bytes"));
    }
    Phase(r, "MEMCPY_IN_FUSION_BUFFER", [&] {
      size_t offset = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t bytes = r.elements(i) * elem;
        if (bytes)
          backend_->Copy(buffer + offset, entries[i]->input.data, bytes);
        offset += bytes;
      }
      return 0;
    });
  }
  KOLO_RETURN_IF_ERROR(Phase(
      r, CollectivePhase("ALLREDUCE"),
      [&] {
        return backend_->AllreduceScaled(buffer, total, dtype, op, r.prescale(),
                                         postscale);
      },
      absl::StrCat("\"size\": ", total * elem, ", \"batch\": ", batch_,
                   ", \"tensors\": ", entries.size())));
  if (entries.size() > 1) {
    Phase(r, "MEMCPY_OUT_FUSION_BUFFER", [&] {
      size_t offset = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        const size_t bytes = r.elements(i) * elem;
        if (bytes)
          backend_->Copy(entries[i]->output.data, buffer + offset, bytes);
        offset += bytes;
      }
      return 0;
    });
  }
  return absl::OkStatus();
}

absl::Status Executor::Broadcast(
    const wire::Response& r,
    std::vector<std::unique_ptr<TensorEntry>>& entries) {
  const size_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  const int root = r.root();
  if (entries.size() == 1) {
    return Phase(r, CollectivePhase("BROADCAST"), [&] {
      return backend_->Broadcast(entries[0]->input.data, r.elements(0) * elem,
                                 root);
    });
  }
  size_t total = 0;
  for (int64_t e : r.elements()) total += e * elem;
  uint8_t* buffer = Grow(fusion_, total);
  if (buffer == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate a fusion buffer of ", total, " bytes"));
  }
  if (rank_ == root) {
    size_t offset = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const size_t bytes = r.elements(i) * elem;
      if (bytes) backend_->Copy(buffer + offset, entries[i]->input.data, bytes);
      offset += bytes;
    }
  }
  KOLO_RETURN_IF_ERROR(Phase(r, CollectivePhase("BROADCAST"), [&] {
    return backend_->Broadcast(buffer, total, root);
  }));
  if (rank_ != root) {
    size_t offset = 0;
    for (size_t i = 0; i < entries.size(); ++i) {
      const size_t bytes = r.elements(i) * elem;
      if (bytes) backend_->Copy(entries[i]->input.data, buffer + offset, bytes);
      offset += bytes;
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::Allgather(
    const wire::Response& r, std::vector<std::unique_ptr<TensorEntry>>& entries,
    std::vector<Outcome>* outcomes, std::vector<void*>* temps) {
  const size_t elem = DataTypeSize(static_cast<DataType>(r.dtype()));
  const size_t n = entries.size();
  // first_dims[i * size + k]: rows of tensor i on rank k.
  auto rows = [&](size_t i, int k) {
    return static_cast<size_t>(r.first_dims(i * size_ + k));
  };
  std::vector<size_t> row_bytes(n);
  std::vector<void*> outputs(n);
  for (size_t i = 0; i < n; ++i) {
    row_bytes[i] = r.elements(i) * elem;
    std::vector<int64_t> shape = entries[i]->input.shape;
    size_t total_rows = 0;
    for (int k = 0; k < size_; ++k) total_rows += rows(i, k);
    shape[0] = static_cast<int64_t>(total_rows);
    const size_t bytes = total_rows * row_bytes[i];
    absl::StatusOr<void*> out =
        entries[i]->allocator
            ? Allocate(entries[i]->allocator, shape)
            : absl::StatusOr<void*>(FallbackOutput(bytes, temps));
    if (out.ok() && (*out != nullptr || bytes == 0)) {
      outputs[i] = *out;
    } else {
      absl::Status failed = out.ok()
                                ? absl::InternalError("allocator returned null")
                                : out.status();
      (*outcomes)[i].status = absl::Status(
          failed.code(),
          absl::StrCat("allgather \"", r.names(i),
                       "\": output allocator failed: ", failed.message()));
      // Still take part, so that the other ranks do not hang.
      outputs[i] = FallbackOutput(bytes, temps);
      if (outputs[i] == nullptr && bytes) {
        return absl::ResourceExhaustedError(
            absl::StrCat("cannot allocate ", bytes, " bytes for the output"));
      }
    }
    std::vector<int64_t> splits(size_);
    for (int k = 0; k < size_; ++k) splits[k] = rows(i, k);
    (*outcomes)[i].splits = std::move(splits);
  }

  std::vector<size_t> block_bytes(size_, 0);
  for (int k = 0; k < size_; ++k) {
    for (size_t i = 0; i < n; ++i) block_bytes[k] += rows(i, k) * row_bytes[i];
  }
  if (n == 1) {
    return Phase(r, CollectivePhase("ALLGATHER"), [&] {
      return backend_->Allgatherv(entries[0]->input.data, outputs[0],
                                  block_bytes);
    });
  }
  uint8_t* send = Grow(gather_send_, block_bytes[rank_]);
  size_t total = 0;
  for (size_t b : block_bytes) total += b;
  uint8_t* buffer = Grow(fusion_, total);
  if ((send == nullptr && block_bytes[rank_]) || (buffer == nullptr && total)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate fusion buffers of ", block_bytes[rank_],
                     " and ", total, " bytes"));
  }
  size_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const size_t bytes = rows(i, rank_) * row_bytes[i];
    if (bytes) backend_->Copy(send + offset, entries[i]->input.data, bytes);
    offset += bytes;
  }
  KOLO_RETURN_IF_ERROR(Phase(r, CollectivePhase("ALLGATHER"), [&] {
    return backend_->Allgatherv(send, buffer, block_bytes);
  }));
  // Block k holds rank k's rows of tensor 0, then of tensor 1, ...
  std::vector<size_t> out_offset(n, 0);
  size_t in_offset = 0;
  for (int k = 0; k < size_; ++k) {
    for (size_t i = 0; i < n; ++i) {
      const size_t bytes = rows(i, k) * row_bytes[i];
      if (bytes) {
        backend_->Copy(static_cast<uint8_t*>(outputs[i]) + out_offset[i],
                       buffer + in_offset, bytes);
      }
      out_offset[i] += bytes;
      in_offset += bytes;
    }
  }
  return absl::OkStatus();
}

absl::Status Executor::Alltoall(const wire::Response& r, TensorEntry& e,
                                Outcome* outcome, std::vector<void*>* temps) {
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
  const size_t bytes = rows * row_bytes;
  absl::StatusOr<void*> out =
      e.allocator ? Allocate(e.allocator, shape)
                  : absl::StatusOr<void*>(FallbackOutput(bytes, temps));
  void* output = nullptr;
  if (out.ok() && (*out != nullptr || bytes == 0)) {
    output = *out;
  } else {
    absl::Status failed = out.ok()
                              ? absl::InternalError("allocator returned null")
                              : out.status();
    outcome->status = absl::Status(
        failed.code(),
        absl::StrCat("alltoall \"", r.names(0),
                     "\": output allocator failed: ", failed.message()));
    output = FallbackOutput(bytes, temps);  // still take part
    if (output == nullptr && bytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", bytes, " bytes for the output"));
    }
  }
  outcome->splits = std::move(splits);
  return Phase(r, CollectivePhase("ALLTOALL"), [&] {
    return backend_->Alltoallv(e.input.data, send, output, recv);
  });
}

absl::Status Executor::Reducescatter(const wire::Response& r, TensorEntry& e) {
  const DataType dtype = static_cast<DataType>(r.dtype());
  const size_t elem = DataTypeSize(dtype);
  const size_t row = r.elements(0);
  const int64_t rows = r.first_dims(0);
  ReduceOp op = static_cast<ReduceOp>(r.op());
  double postscale = r.postscale();
  if (op == ReduceOp::kAverage) {
    op = ReduceOp::kSum;
    postscale /= size_;
  }
  // Rank k owns rows [offset_k, offset_k + share_k).
  std::vector<size_t> counts(size_);
  for (int k = 0; k < size_; ++k) {
    counts[k] = (rows / size_ + (k < rows % size_ ? 1 : 0)) * row;
  }
  if (!backend_->host_memory()) {
    return Phase(r, CollectivePhase("REDUCESCATTER"), [&] {
      return backend_->Reducescatterv(e.input.data, e.output.data, counts,
                                      dtype, op, r.prescale(), postscale);
    });
  }
  std::vector<size_t> send(size_);
  for (int k = 0; k < size_; ++k) send[k] = counts[k] * elem;
  const size_t mine = send[rank_];
  const size_t mine_count = counts[rank_];
  // Pre-scale on a copy: the input belongs to the caller.
  const void* input = e.input.data;
  if (r.prescale() != 1.0) {
    uint8_t* copy = Grow(fusion_, rows * row * elem);
    if (copy == nullptr && rows * row) {
      return absl::ResourceExhaustedError("cannot allocate a fusion buffer");
    }
    if (rows * row) std::memcpy(copy, input, rows * row * elem);
    backend_->Scale(copy, rows * row, dtype, r.prescale());
    input = copy;
  }
  // Every rank sends rank k its rows of k's share; k reduces the chunks in
  // rank order, so the result is the same bits wherever it is computed.
  uint8_t* chunks = Grow(gather_send_, mine * size_);
  if (chunks == nullptr && mine) {
    return absl::ResourceExhaustedError("cannot allocate a receive buffer");
  }
  std::vector<size_t> recv(size_, mine);
  KOLO_RETURN_IF_ERROR(Phase(r, CollectivePhase("REDUCESCATTER"), [&] {
    return backend_->Alltoallv(input, send, chunks, recv);
  }));
  uint8_t* out = static_cast<uint8_t*>(e.output.data);
  if (mine) {
    std::memcpy(out, chunks, mine);
    for (int k = 1; k < size_; ++k) {
      backend_->Combine(out, chunks + k * mine, mine_count, dtype, op);
    }
    if (postscale != 1.0) backend_->Scale(out, mine_count, dtype, postscale);
  }
  return absl::OkStatus();
}

}  // namespace kolo
