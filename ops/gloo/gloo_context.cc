#include "ops/gloo/gloo_context.h"

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
    if (!value.ok()) throw std::runtime_error(std::string(value.status().message()));
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

}  // namespace

absl::StatusOr<std::shared_ptr<::gloo::Context>> ConnectGlooContext(
    int rank, int size, std::shared_ptr<Store> store,
    const std::string& bind_addr, absl::Duration start_timeout,
    absl::Duration op_timeout) {
  try {
    ::gloo::transport::tcp::attr attr;
    attr.hostname = bind_addr;
    auto device = ::gloo::transport::tcp::CreateDevice(attr);
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
