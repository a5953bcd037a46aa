#include "ops/gloo/gloo_context.h"

#include <sched.h>

#include <exception>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace kolo {
namespace gloo_backend {
namespace {

// gloo's rendezvous Store on top of ours. gloo reports errors by throwing.
class StoreAdapter : public ::gloo::rendezvous::Store {
 public:
  StoreAdapter(std::shared_ptr<kolo::Store> store, absl::Duration timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s = store_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }
  std::vector<char> get(const std::string& key) override {
    auto value = store_->Get(key, timeout_);
    if (!value.ok())
      throw std::runtime_error(std::string(value.status().message()));
    return std::vector<char>(value->begin(), value->end());
  }
  void wait(const std::vector<std::string>& keys) override {
    wait(keys, absl::ToChronoMilliseconds(timeout_));
  }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    absl::Status s = store_->Wait(keys, absl::FromChrono(timeout));
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  }

 private:
  std::shared_ptr<kolo::Store> store_;
  absl::Duration timeout_;
};

// Note [gloo's loop thread does not preempt]
// gloo's TCP device runs one event-loop thread that reads and writes every
// pair's socket. When data arrives it takes the pair's lock with a
// try-lock, and if another thread holds it (the thread running the
// collective, inside gloo's send or recv) it returns and calls epoll_wait
// again, which reports the same data at once: it spins until the holder
// lets go. On a rank bound to one core (kolorun's default) the holder
// cannot run while the loop thread spins: the wake-up of the loop thread
// preempted it, and the spin lasts the loop thread's whole time slice
// (about 3 ms on Linux's EEVDF scheduler). Every collective over gloo then
// took ~4 ms whatever its size (2 ranks, 4 KB: 3.7 ms against 0.2 ms with
// this note; docs/benchmarks.md, "Two hosts"). So the loop thread
// is created under SCHED_BATCH: the same share of the CPU as any thread of
// the rank, but its wake-ups do not preempt the running thread; the thread
// holding the lock runs on until it waits for its data, and then the loop
// thread runs. A thread inherits its creator's policy, so this thread
// takes SCHED_BATCH for the device's creation and then goes back (both
// are unprivileged changes between two normal policies, the nice value
// unchanged). A caller under another policy (real time, SCHED_IDLE) is
// left as it is.
class BatchPolicyScope {
 public:
  BatchPolicyScope() {
    sched_param param{};
    active_ = sched_getscheduler(0) == SCHED_OTHER &&
              sched_setscheduler(0, SCHED_BATCH, &param) == 0;
  }
  ~BatchPolicyScope() {
    if (!active_) return;
    sched_param param{};
    sched_setscheduler(0, SCHED_OTHER, &param);
  }
  BatchPolicyScope(const BatchPolicyScope&) = delete;
  BatchPolicyScope& operator=(const BatchPolicyScope&) = delete;

 private:
  bool active_ = false;
};

std::shared_ptr<::gloo::transport::Device> CreateLoopDevice(
    const ::gloo::transport::tcp::attr& attr) {
  BatchPolicyScope batch;  // Note [gloo's loop thread does not preempt]
  return ::gloo::transport::tcp::CreateDevice(attr);
}

}  // namespace

absl::StatusOr<std::shared_ptr<::gloo::Context>> ConnectGlooContext(
    int rank, int size, std::shared_ptr<Store> store,
    const std::string& bind_addr, absl::Duration start_timeout,
    absl::Duration op_timeout) {
  try {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = bind_addr;
    auto device = CreateLoopDevice(attr);
    auto context = std::make_shared<::gloo::rendezvous::Context>(rank, size);
    context->setTimeout(absl::ToChronoMilliseconds(start_timeout));
    StoreAdapter adapter(std::move(store), start_timeout);
    context->connectFullMesh(adapter, device);
    context->setTimeout(absl::ToChronoMilliseconds(op_timeout));
    return std::shared_ptr<::gloo::Context>(std::move(context));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("gloo could not connect rank ",
                                               rank, " to its ", size - 1,
                                               " peers: ", e.what()));
  }
}

}  // namespace gloo_backend
}  // namespace kolo
