// Backend: the narrow interface between the runtime and a data plane (gloo,
// shm, NCCL). The runtime knows backends only through this header and the
// registry; a backend library registers itself at static-initialisation time
// (its Bazel target is `alwayslink`), so a backend that is not built is
// simply not registered.
//
// Threads: a Backend is created and used by the background thread of one
// process set only; collectives are issued in the same order on every rank.
#ifndef KOLO_RUNTIME_BACKEND_H_
#define KOLO_RUNTIME_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/store.h"
#include "kolo/types.h"

namespace kolo {

struct BackendContext {
  int rank = 0;
  int size = 1;
  // Rendezvous for the backend's own connections (already prefixed).
  std::shared_ptr<Store> store;
  // Address that the backend's listeners bind to.
  std::string bind_addr = "127.0.0.1";
  // Bound on connection setup.
  absl::Duration start_timeout = absl::Seconds(60);
  // Bound on each collective.
  absl::Duration op_timeout = absl::Seconds(600);
  // Every rank of the set runs on this host (same machine, same /dev/shm),
  // as far as the runtime can tell from the placement each rank published.
  // Backends that need shared memory (shm) refuse to start without it.
  bool all_ranks_on_host = false;
  // How long a backend that waits in shared memory may poll before it
  // sleeps (KOLO_SPIN_TIME; Note [Spin then block] in runtime/sync/wakeup.h).
  absl::Duration spin_time = absl::Microseconds(50);
};

// One tensor of a fused allreduce (Backend::AllreducePieces): `count`
// elements read from `input` and written to `output`, which may be the same
// memory but must not overlap any other piece's.
struct FusedPiece {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // Allreduce of several tensors as one, as if their inputs were packed
  // back to back into one buffer, reduced with Allreduce and unpacked into
  // the outputs (bitwise the same results), but without that buffer: a
  // backend that can reads and writes the tensors in place. `count` is the
  // sum of the pieces' counts. Only when SupportsAllreducePieces(count,
  // dtype); a backend that offers it must let ranks mix the two calls for
  // one collective (one rank may have to pack, e.g. because its tensors
  // share memory), so it must communicate exactly as Allreduce does.
  virtual bool SupportsAllreducePieces(size_t count, DataType dtype) const {
    (void)count, (void)dtype;
    return false;
  }
  virtual absl::Status AllreducePieces(const std::vector<FusedPiece>& pieces,
                                       size_t count, DataType dtype,
                                       ReduceOp op) {
    (void)pieces, (void)count, (void)dtype, (void)op;
    return absl::UnimplementedError("no in-place fused allreduce");
  }

  // In place over `count` elements. `op` is never kAverage (the runtime
  // sums and scales). Every rank receives bitwise-identical results.
  virtual absl::Status Allreduce(void* data, size_t count, DataType dtype,
                                 ReduceOp op) = 0;
  // `bytes` from `root` into `data` on every rank.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  // Concatenates each rank's `input` (bytes_per_rank[rank] bytes) into
  // `output` in rank order.
  virtual absl::Status Allgatherv(const void* input, void* output,
                                  const std::vector<size_t>& bytes_per_rank) = 0;
  // Rank r sends send_bytes[k] bytes (consecutive in `input`, in rank
  // order) to rank k and receives recv_bytes[r] bytes from rank r into
  // `output`, in rank order.
  virtual absl::Status Alltoallv(const void* input,
                                 const std::vector<size_t>& send_bytes,
                                 void* output,
                                 const std::vector<size_t>& recv_bytes) = 0;
  // out[i] = op(out[i], in[i]) on the backend's device.
  virtual void Combine(void* out, const void* in, size_t count, DataType dtype,
                       ReduceOp op) = 0;
  // data[i] *= factor on the backend's device (floating point dtypes).
  virtual void Scale(void* data, size_t count, DataType dtype,
                     double factor) = 0;
  // Unblocks collectives in other threads as far as the backend can (closes
  // its connections); later collectives fail. Thread-safe.
  virtual void Close() {}
};

using BackendFactory =
    std::function<absl::StatusOr<std::unique_ptr<Backend>>(const BackendContext&)>;

// How Create(device, context) treats a registered backend.
enum class BackendSelection {
  // A candidate for Create(device, context): the first one registered wins.
  kDefault,
  // Only created by name (e.g. "shm": the runtime picks it when the set's
  // placement allows, and falls back to the default otherwise).
  kByNameOnly,
};

// Written only during static initialisation (by backends' registrars), read
// afterwards: not mutable state at run time.
class BackendRegistry {
 public:
  static BackendRegistry& Get();
  void Register(DeviceType device, std::string name, BackendFactory factory,
                BackendSelection selection = BackendSelection::kDefault);
  // The default backend registered for `device`; NotFound names the device.
  absl::StatusOr<std::unique_ptr<Backend>> Create(
      DeviceType device, const BackendContext& context) const;
  // The backend registered for `device` under `name`; NotFound names both.
  // Errors of the factory itself are returned as they are.
  absl::StatusOr<std::unique_ptr<Backend>> Create(
      DeviceType device, const std::string& name,
      const BackendContext& context) const;
  // Whether a default backend is registered for `device`.
  bool Has(DeviceType device) const;
  // Whether a backend named `name` is registered for `device`.
  bool Has(DeviceType device, const std::string& name) const;

 private:
  struct Entry {
    DeviceType device;
    std::string name;
    BackendFactory factory;
    BackendSelection selection;
  };
  std::vector<Entry> entries_;
};

// Put one at namespace scope in a backend's .cc file.
struct BackendRegistrar {
  BackendRegistrar(DeviceType device, std::string name, BackendFactory factory,
                   BackendSelection selection = BackendSelection::kDefault) {
    BackendRegistry::Get().Register(device, std::move(name), std::move(factory),
                                    selection);
  }
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_BACKEND_H_
