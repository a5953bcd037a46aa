// RuntimeImpl: owns everything one Runtime runs: the store, the control
// plane, the backend, the tensor queue and the background thread.
//
// Threads: the public methods run on caller threads; BackgroundLoop() on the
// background thread (the only one that negotiates and issues collectives);
// Fatal() may run on a control-plane reader thread.
#ifndef KOLO_RUNTIME_RUNTIME_IMPL_H_
#define KOLO_RUNTIME_RUNTIME_IMPL_H_

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kolo/options.h"
#include "kolo/runtime.h"
#include "kolo/store.h"
#include "runtime/backend.h"
#include "runtime/control/control_plane.h"
#include "runtime/controller.h"
#include "runtime/executor.h"
#include "runtime/logging.h"
#include "runtime/tensor_queue.h"

namespace kolo {

namespace rendezvous {
class TcpStoreServer;
}

class RuntimeImpl : public std::enable_shared_from_this<RuntimeImpl> {
 public:
  explicit RuntimeImpl(const Options& options);
  ~RuntimeImpl();

  // Rendezvous, control plane, backend, background thread.
  absl::Status Start();

  const Options& options() const { return options_; }
  absl::StatusOr<Work> Submit(TensorEntry entry);
  absl::Status Shutdown(absl::Duration timeout);
  void Abort();

 private:
  // Note [Background loop] in runtime_impl.cc.
  void BackgroundLoop();
  void CoordinatorStep(absl::Time now, absl::Time* next_wakeup, bool* done);
  void ExecuteList(const wire::ResponseList& list);
  void Notify();
  // Fails all pending and future work with `status`. Any thread.
  void Fatal(const absl::Status& status);
  absl::Status fatal_status();
  // After a failed collective: give the control plane a moment to say which
  // rank was lost, since that message is the useful one.
  absl::Status ExplainCollectiveFailure(const absl::Status& backend_error);
  // Stops the background thread: joins it if it ends by `deadline`, else
  // leaves it to end on its own (it holds a reference to this object).
  bool StopLoop(absl::Time deadline);

  const Options options_;
  Logger logger_;
  std::shared_ptr<Store> store_;  // prefixed "kolo"
  std::unique_ptr<rendezvous::TcpStoreServer> store_server_;
  std::unique_ptr<ControlPlane> control_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Executor> executor_;
  Coordinator coordinator_;  // used on rank 0 only
  TensorQueue queue_;

  std::mutex wake_mu_;
  std::condition_variable wake_cv_;
  bool wake_pending_ = false;  // guarded by wake_mu_

  std::mutex state_mu_;
  std::condition_variable state_cv_;
  absl::Status fatal_;         // guarded by state_mu_
  bool loop_done_ = false;     // guarded by state_mu_
  std::atomic<bool> accepting_{false};
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> stopped_{false};
  bool shutdown_sent_ = false;  // background thread only
  std::thread thread_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_RUNTIME_IMPL_H_
