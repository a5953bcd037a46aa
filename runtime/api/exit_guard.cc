#include "runtime/api/exit_guard.h"

#include <cstdlib>
#include <mutex>
#include <vector>

#include "runtime/loop/runtime_impl.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace {

// Process-wide by nature (exit is); leaked so that it outlives every static
// destructor.
struct Registry {
  Mutex mu;
  std::vector<std::weak_ptr<RuntimeImpl>> live KOLO_GUARDED_BY(mu);
  std::once_flag installed;
};

Registry& TheRegistry() {
  static Registry* registry = new Registry;
  return *registry;
}

void StopLiveRuntimes() {
  std::vector<std::shared_ptr<RuntimeImpl>> live;
  {
    Registry& r = TheRegistry();
    MutexLock lock(&r.mu);
    for (const std::weak_ptr<RuntimeImpl>& weak : r.live) {
      if (std::shared_ptr<RuntimeImpl> runtime = weak.lock()) {
        live.push_back(std::move(runtime));
      }
    }
    r.live.clear();
  }
  if (live.empty()) return;
  for (const std::shared_ptr<RuntimeImpl>& runtime : live) {
    runtime->StopForExit();
  }
  // Not destroyed: the process is ending, and a destructor would only touch
  // more of what exit() is tearing down. Kept reachable from a global, so
  // leak checkers see it held, not lost.
  static std::vector<std::shared_ptr<RuntimeImpl>>* stopped_at_exit = nullptr;
  stopped_at_exit =
      new std::vector<std::shared_ptr<RuntimeImpl>>(std::move(live));
}

}  // namespace

void StopAtExit(const std::shared_ptr<RuntimeImpl>& runtime) {
  Registry& r = TheRegistry();
  std::call_once(r.installed, [] { std::atexit(StopLiveRuntimes); });
  MutexLock lock(&r.mu);
  // Drops the entries of runtimes already gone while at it.
  std::vector<std::weak_ptr<RuntimeImpl>> kept;
  for (std::weak_ptr<RuntimeImpl>& weak : r.live) {
    if (!weak.expired()) kept.push_back(std::move(weak));
  }
  kept.push_back(runtime);
  r.live = std::move(kept);
}

void ForgetAtExit(const RuntimeImpl* runtime) {
  Registry& r = TheRegistry();
  MutexLock lock(&r.mu);
  std::vector<std::weak_ptr<RuntimeImpl>> kept;
  for (std::weak_ptr<RuntimeImpl>& weak : r.live) {
    std::shared_ptr<RuntimeImpl> held = weak.lock();
    if (held && held.get() != runtime) kept.push_back(std::move(weak));
  }
  r.live = std::move(kept);
}

}  // namespace kolo
