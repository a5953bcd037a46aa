// Backend: the narrow interface between the runtime and a data plane (gloo,
// shm, NCCL). The runtime knows backends only through this header and the
// registry; a backend library registers itself at static-initialisation time
// (its Bazel target is `alwayslink`), so a backend that is not built is
// simply not registered.
//
// Threads: a Backend is created and used by the background thread of one
// process set only; collectives are issued in the same order on every rank.
//
// Signals: the TCP backends (gloo) write to sockets without MSG_NOSIGNAL, so
// a peer that closes its end raises SIGPIPE in the writer. Runtime::Create
// ignores SIGPIPE when it has its default disposition; a program that uses
// a backend directly (tests, benchmarks) must do the same, or it is killed
// (exit 141) instead of getting an error naming the peer.
#ifndef KOLO_RUNTIME_LOOP_BACKEND_H_
#define KOLO_RUNTIME_LOOP_BACKEND_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kolo/store.h"
#include "kolo/tensor.h"
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
  // This rank's device for the backend (CUDA: the GPU of the first tensor
  // this process set ran on that device type).
  Device device = Device::Cpu();
  // Host identity of every rank of the set, by set rank (equal strings: same
  // host). Hierarchical backends split the set by it.
  std::vector<std::string> hosts;
  // KOLO_HIERARCHICAL_ALLREDUCE: device allreduce within the host and the
  // CPU backend between hosts.
  bool hierarchical_allreduce = false;
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

// Split of `count` elements into `parts` consecutive shards: the first
// count % parts shards hold one element more. Used by every backend and the
// executor alike, so that all ranks agree on the offsets.
struct Shard {
  size_t offset = 0;
  size_t count = 0;
};
std::vector<Shard> SplitEvenly(size_t count, int parts);

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
  virtual absl::Status Allgatherv(
      const void* input, void* output,
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
  // its connections); later collectives fail. Thread-safe, and callable
  // from inside a Finish callback on the backend's own completion thread
  // (must not join it). A device backend's destructor calls the `done` of
  // every response still pending, with an error.
  virtual void Close() {}

  // ---- Devices -----------------------------------------------------------
  // Host-memory backends (gloo, shm) keep every default below: the executor
  // then packs with memcpy and runs the CPU kernels. A device backend (NCCL)
  // returns false from host_memory() and implements every method below;
  // the executor then touches tensor memory only through them.
  virtual bool host_memory() const { return true; }
  // Memory the collectives can work on (fusion buffers, scratch).
  virtual absl::StatusOr<void*> Allocate(size_t bytes);
  virtual void Free(void* data);
  // Copies `bytes`, ordered with the collectives issued before and after it
  // (a device backend queues it on its stream). Either side may be host
  // memory on a device backend (joined ranks contribute host zeros).
  virtual void Copy(void* dst, const void* src, size_t bytes);
  // Before the executor reads any of a response's tensors: orders the
  // backend after their producers. `ready[i]` may be null (the backend then
  // orders after the device's default stream). Fails after the op timeout.
  virtual absl::Status WaitReady(
      const std::vector<std::shared_ptr<ReadyEvent>>& ready) {
    return absl::OkStatus();
  }
  // sum/min/max/product of `count` elements in place, with data[i] *=
  // prescale before and *= postscale after (floating point only when not
  // 1.0). The default runs Scale, Allreduce, Scale.
  virtual absl::Status AllreduceScaled(void* data, size_t count, DataType dtype,
                                       ReduceOp op, double prescale,
                                       double postscale);
  // Device backends only (host_memory() false): reduces every rank's
  // `input` (the sum over k of counts[k] elements) and writes this rank's
  // shard, counts[rank] elements from offset sum(counts[0..rank)), to
  // `output`, scaled like AllreduceScaled.
  virtual absl::Status Reducescatterv(const void* input, void* output,
                                      const std::vector<size_t>& counts,
                                      DataType dtype, ReduceOp op,
                                      double prescale, double postscale);
  // Called once per response after its collective and copies were issued:
  // `done` runs once they have completed, on this thread or on the
  // backend's completion thread, with an error if they failed (the
  // backend's watchdog reports a collective that exceeds the op timeout).
  // Host-memory backends are synchronous: the default calls done at once.
  virtual void Finish(std::function<void(absl::Status)> done) {
    done(absl::OkStatus());
  }
};

using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<Backend>>(
    const BackendContext&)>;
// Whether this process can use `device` (e.g. a CUDA ordinal that exists);
// the error says why not. Called on caller threads: must be thread-safe and
// cheap after its first call.
using DeviceProbe = std::function<absl::Status(const Device&)>;

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
  // The version of the library behind a backend, as that library codes it
  // (NCCL_VERSION_CODE for "nccl"); 0 when not registered or not given.
  void SetVersion(DeviceType device, const std::string& name, int version);
  int Version(DeviceType device, const std::string& name) const;
  // A device backend's check that a device is usable here.
  void RegisterProbe(DeviceType device, DeviceProbe probe);
  // OK when no probe is registered for the device's type.
  absl::Status CheckDevice(const Device& device) const;

 private:
  struct Entry {
    DeviceType device;
    std::string name;
    BackendFactory factory;
    BackendSelection selection;
    int version = 0;
  };
  std::vector<Entry> entries_;
  std::vector<std::pair<DeviceType, DeviceProbe>> probes_;
};

// Put one at namespace scope in a backend's .cc file.
struct BackendRegistrar {
  BackendRegistrar(DeviceType device, std::string name, BackendFactory factory,
                   BackendSelection selection = BackendSelection::kDefault) {
    BackendRegistry::Get().Register(device, std::move(name), std::move(factory),
                                    selection);
  }
  BackendRegistrar(DeviceType device, std::string name, BackendFactory factory,
                   DeviceProbe probe, int version = 0)
      : BackendRegistrar(device, name, std::move(factory)) {
    BackendRegistry::Get().RegisterProbe(device, std::move(probe));
    BackendRegistry::Get().SetVersion(device, name, version);
  }
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_LOOP_BACKEND_H_
