#include "runtime/loop/backend.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "runtime/util/status_macros.h"

namespace kolo {
namespace {

const char* DeviceName(DeviceType device) {
  return device == DeviceType::kCpu ? "cpu" : "cuda";
}

}  // namespace

std::vector<Shard> SplitEvenly(size_t count, int parts) {
  std::vector<Shard> shards(parts > 0 ? parts : 0);
  size_t offset = 0;
  for (int k = 0; k < parts; ++k) {
    shards[k].offset = offset;
    shards[k].count = count / parts + (static_cast<size_t>(k) < count % parts);
    offset += shards[k].count;
  }
  return shards;
}

absl::StatusOr<void*> Backend::Allocate(size_t bytes) {
  // 64-byte aligned for the vectorised kernels; never null.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot allocate ", bytes, " bytes of host memory"));
  }
  return p;
}

void Backend::Free(void* data) { std::free(data); }

void Backend::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(dst, src, bytes);
}

absl::Status Backend::AllreduceScaled(void* data, size_t count, DataType dtype,
                                      ReduceOp op, double prescale,
                                      double postscale) {
  if (prescale != 1.0) Scale(data, count, dtype, prescale);
  KOLO_RETURN_IF_ERROR(Allreduce(data, count, dtype, op));
  if (postscale != 1.0) Scale(data, count, dtype, postscale);
  return absl::OkStatus();
}

absl::Status Backend::Reducescatterv(const void*, void*,
                                     const std::vector<size_t>&, DataType,
                                     ReduceOp, double, double) {
  return absl::UnimplementedError(
      absl::StrCat(name(), " has no reduce-scatter of its own"));
}

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

void BackendRegistry::SetVersion(DeviceType device, const std::string& name,
                                 int version) {
  for (Entry& e : entries_) {
    if (e.device == device && e.name == name) e.version = version;
  }
}

int BackendRegistry::Version(DeviceType device, const std::string& name) const {
  for (const Entry& e : entries_) {
    if (e.device == device && e.name == name) return e.version;
  }
  return 0;
}

void BackendRegistry::RegisterProbe(DeviceType device, DeviceProbe probe) {
  probes_.emplace_back(device, std::move(probe));
}

absl::Status BackendRegistry::CheckDevice(const Device& device) const {
  for (const auto& [type, probe] : probes_) {
    if (type == device.type) return probe(device);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Backend>> BackendRegistry::Create(
    DeviceType device, const BackendContext& context) const {
  for (const Entry& e : entries_) {
    if (e.device == device && e.selection == BackendSelection::kDefault) {
      return e.factory(context);
    }
  }
  return absl::NotFoundError(
      std::string("no backend is built for device type ") + DeviceName(device) +
      " (was the backend library linked?)");
}

absl::StatusOr<std::unique_ptr<Backend>> BackendRegistry::Create(
    DeviceType device, const std::string& name,
    const BackendContext& context) const {
  for (const Entry& e : entries_) {
    if (e.device == device && e.name == name) return e.factory(context);
  }
  return absl::NotFoundError(
      "no backend \"" + name + "\" is built for device type " +
      DeviceName(device) + " (was the backend library linked?)");
}

}  // namespace kolo
