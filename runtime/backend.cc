#include "runtime/backend.h"

namespace kolo {

BackendRegistry& BackendRegistry::Get() {
  static BackendRegistry* registry = new BackendRegistry();
  return *registry;
}

void BackendRegistry::Register(DeviceType device, std::string name,
                               BackendFactory factory) {
  entries_.push_back({device, std::move(name), std::move(factory)});
}

bool BackendRegistry::Has(DeviceType device) const {
  for (const Entry& e : entries_) {
    if (e.device == device) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Backend>> BackendRegistry::Create(
    DeviceType device, const BackendContext& context) const {
  for (const Entry& e : entries_) {
    if (e.device == device) return e.factory(context);
  }
  return absl::NotFoundError(
      std::string("no backend is built for device type ") +
      (device == DeviceType::kCpu ? "cpu" : "cuda") +
      " (was the backend library linked?)");
}

}  // namespace kolo
