#include "ops/nccl/communicator.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "ops/nccl/cuda_util.h"
#include "runtime/sync/mutex.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace nccl {
namespace {

std::string Seconds(absl::Duration d) {
  return absl::StrCat(absl::ToDoubleSeconds(d), " s");
}

// The unique id travels as hex: store values are strings.
absl::StatusOr<ncclUniqueId> ExchangeId(Store* store, const std::string& key,
                                        int rank, int size,
                                        absl::Duration timeout,
                                        const std::string& label) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    KOLO_RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    if (size > 1) {
      KOLO_RETURN_IF_ERROR(store->Set(
          key, absl::BytesToHexString(absl::string_view(
                   reinterpret_cast<const char*>(&id), sizeof(id)))));
    }
    return id;
  }
  auto hex = store->Get(key, timeout);
  if (!hex.ok()) {
    return absl::Status(hex.status().code(),
                        absl::StrCat(label, ": rank ", rank,
                                     " got no NCCL unique id from rank 0: ",
                                     hex.status().message()));
  }
  const std::string bytes = absl::HexStringToBytes(*hex);
  if (bytes.size() != sizeof(id)) {
    return absl::InternalError(
        absl::StrCat(label, ": the NCCL unique id under \"", key, "\" has ",
                     bytes.size(), " bytes, not ", sizeof(id)));
  }
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

}  // namespace

void Backoff::Pause() {
  const absl::Duration sleep = next();
  ++polls_;
  if (sleep == absl::ZeroDuration()) {
    std::this_thread::yield();
  } else {
    absl::SleepFor(sleep);
  }
}

absl::Duration Backoff::next() const {
  if (polls_ < 64) return absl::ZeroDuration();
  return std::min(absl::Microseconds(10) * (polls_ - 63),
                  absl::Milliseconds(1));
}

absl::StatusOr<std::unique_ptr<Communicator>> Communicator::Create(
    Store* store, const std::string& key, int rank, int size,
    absl::Duration timeout, const std::string& label) {
  const absl::Time deadline = absl::Now() + timeout;
  if (size > 1 && store == nullptr) {
    return absl::InternalError(absl::StrCat(label, ": no store to rendezvous"));
  }
  auto id = ExchangeId(store, key, rank, size, timeout, label);
  if (!id.ok()) return id.status();

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // host calls never block: see the header
  ncclComm_t comm = nullptr;
  ncclResult_t result = ncclCommInitRankConfig(&comm, size, *id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    if (comm != nullptr) ncclCommAbort(comm);
    absl::Status s = NcclStatus(result, "ncclCommInitRankConfig");
    return absl::Status(s.code(), absl::StrCat(label, ": rank ", rank,
                                               " cannot join: ", s.message()));
  }
  // Non-blocking init: poll until ready, failed, or out of time.
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclInProgress;
    if (comm != nullptr) {
      ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess) state = r;
    }
    if (state == ncclSuccess) break;
    if (state != ncclInProgress) {
      absl::Status s = NcclStatus(state, "ncclCommInitRankConfig");
      if (comm != nullptr) ncclCommAbort(comm);
      return absl::Status(
          s.code(),
          absl::StrCat(label, ": rank ", rank, " cannot join: ", s.message()));
    }
    if (absl::Now() > deadline) {
      if (comm != nullptr) ncclCommAbort(comm);
      return absl::DeadlineExceededError(absl::StrCat(
          label, " was not ready on rank ", rank, " within ", Seconds(timeout),
          " (KOLO_START_TIMEOUT); communicator aborted. Did every rank reach "
          "its first CUDA collective?"));
    }
    backoff.Pause();
  }
  return std::unique_ptr<Communicator>(
      new Communicator(comm, rank, size, label));
}

Communicator::~Communicator() {
  // Never ncclCommDestroy: it may wait for peers (a bootstrap barrier in
  // recent NCCL), and a peer may be gone. By the time a backend is
  // destroyed every collective has completed or failed, so aborting loses
  // nothing.
  Abort(absl::AbortedError(absl::StrCat(label_, " was destroyed")));
}

absl::Status Communicator::AbortedStatus() const {
  return absl::Status(
      aborted_.code(),
      absl::StrCat(label_, " was aborted: ", aborted_.message()));
}

absl::Status Communicator::Run(
    const char* what, absl::Time deadline,
    const std::function<ncclResult_t(ncclComm_t)>& issue) {
  MutexLock lock(&mu_);
  if (comm_ == nullptr) return AbortedStatus();
  ncclResult_t result = issue(comm_);
  if (result == ncclSuccess) return absl::OkStatus();
  if (result != ncclInProgress) return NcclStatus(result, what);
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) return NcclStatus(r, "ncclCommGetAsyncError");
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclStatus(state, what);
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          what, " on the ", label_,
          " was not enqueued before the op timeout (KOLO_OP_TIMEOUT)"));
    }
    lock.Unlock();
    backoff.Pause();
    lock.Lock();
    if (comm_ == nullptr) return AbortedStatus();
  }
}

absl::Status Communicator::RunReduction(
    const char* what, absl::Time deadline, DataType dtype, ReduceOp op,
    double premul,
    const std::function<ncclResult_t(ncclComm_t, ncclRedOp_t)>& issue) {
  if (premul == 1.0) {
    const ncclRedOp_t nccl_op = ToNcclRedOp(op);
    return Run(what, deadline,
               [&](ncclComm_t comm) { return issue(comm, nccl_op); });
  }
  if (op != ReduceOp::kSum || !IsFloatingPoint(dtype)) {
    return absl::InternalError(
        absl::StrCat(what, ": a pre-multiplied ", ReduceOpName(op), " of ",
                     DataTypeName(dtype), " is not defined"));
  }
  ncclRedOp_t scaled;
  Scalar scalar = ScalarOf(dtype, premul);
  absl::Status s =
      Run("ncclRedOpCreatePreMulSum", deadline, [&](ncclComm_t comm) {
        return ncclRedOpCreatePreMulSum(&scaled, scalar.bytes,
                                        ToNcclDataType(dtype),
                                        ncclScalarHostImmediate, comm);
      });
  if (!s.ok()) return s;
  s = Run(what, deadline, [&](ncclComm_t comm) { return issue(comm, scaled); });
  // Once the call that used it has been enqueued, the op may go.
  absl::Status destroyed =
      Run("ncclRedOpDestroy", deadline,
          [&](ncclComm_t comm) { return ncclRedOpDestroy(scaled, comm); });
  return s.ok() ? destroyed : s;
}

absl::Status Communicator::AsyncError() {
  MutexLock lock(&mu_);
  if (comm_ == nullptr) return AbortedStatus();
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) return NcclStatus(r, "ncclCommGetAsyncError");
  if (state == ncclSuccess || state == ncclInProgress) return absl::OkStatus();
  absl::Status s = NcclStatus(state, "NCCL");
  return absl::Status(
      s.code(), absl::StrCat(label_, " reported an error: ", s.message()));
}

void Communicator::Abort(const absl::Status& reason) {
  MutexLock lock(&mu_);
  if (comm_ == nullptr) return;
  ncclCommAbort(comm_);  // also frees it; its result says nothing useful
  comm_ = nullptr;
  aborted_ = reason.ok() ? absl::AbortedError("aborted") : reason;
}

bool Communicator::aborted() {
  MutexLock lock(&mu_);
  return comm_ == nullptr;
}

}  // namespace nccl
}  // namespace kolo
