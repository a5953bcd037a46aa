#include "runtime/backend.h"

namespace kolo {
namespace {

const char* DeviceName(DeviceType device) {
  return device == DeviceType::kCpu ? "cpu" : "cuda";
}

}  // namespace

BackendRegistry& BackendRegistry::Get() {
  static BackendRegistry* registry = new BackendRegistry();
  return *registry;
}

void BackendRegistry::Register(DeviceType device, std::string name,
                               BackendFactory factory,
                               BackendSelection selection) {
  entries_.push_back({device, std::move(name), std::move(factory), selection});
}

bool BackendRegistry::Has(DeviceType device) const {
  for (const Entry& e : entries_) {
    if (e.device == device && e.selection == BackendSelection::kDefault) {
      return true;
    }
  }
  return false;
}

bool BackendRegistry::Has(DeviceType device, const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.device == device && e.name == name) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Backend>> BackendRegistry::Create(
    DeviceType device, const BackendContext& context) const {
  for (const Entry& e : entries_) {
    if (e.device == device && e.selection == BackendSelection::kDefault) {
      return e.factory(context);
    }
  }
  return absl::NotFoundError(
      std::string("no backend is built for device type ") +
      DeviceName(device) + " (was the backend library linked?)");
}

absl::StatusOr<std::unique_ptr<Backend>> BackendRegistry::Create(
    DeviceType device, const std::string& name,
    const BackendContext& context) const {
  for (const Entry& e : entries_) {
    if (e.device == device && e.name == name) return e.factory(context);
  }
  return absl::NotFoundError("no backend \"" + name + "\" is built for device type " +
                             DeviceName(device) +
                             " (was the backend library linked?)");
}

}  // namespace kolo
