// Element types, reduction operations and devices.
//
// Thread safety: plain value types and pure functions; callable from any
// thread.
//
// Errors: none. A value outside an enum (only a cast can make one) has size
// 0 and the name "unknown"; the runtime rejects it with InvalidArgument.
#ifndef KOLO_TYPES_H_
#define KOLO_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace kolo {

// Values are part of kolo's wire format: do not renumber.
enum class DataType : int {
  kUint8 = 0,
  kInt8 = 1,
  kInt32 = 2,
  kInt64 = 3,
  kFloat16 = 4,
  kBfloat16 = 5,
  kFloat32 = 6,
  kFloat64 = 7,
  kInt16 = 8,
  // One byte, 0 or 1. Moved (broadcast, allgather, alltoall), never reduced.
  kBool = 9,
};
constexpr int kNumDataTypes = 10;

// Size of one element in bytes.
size_t DataTypeSize(DataType dtype);
// "float32", "bfloat16", ...
const char* DataTypeName(DataType dtype);
// True for float16, bfloat16, float32 and float64.
bool IsFloatingPoint(DataType dtype);

// Values are part of the wire format: do not renumber.
enum class ReduceOp : int {
  kSum = 0,
  // Sum divided by the number of contributing ranks. Floating point only.
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
};
const char* ReduceOpName(ReduceOp op);

enum class DeviceType : int {
  kCpu = 0,
  kCuda = 1,
};

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;  // GPU ordinal; 0 for the CPU.

  static Device Cpu() { return Device{}; }
  static Device Cuda(int index) { return Device{DeviceType::kCuda, index}; }
  bool operator==(const Device& o) const {
    return type == o.type && index == o.index;
  }
  bool operator!=(const Device& o) const { return !(*this == o); }
  // "cpu" or "cuda:N".
  std::string ToString() const;
};

}  // namespace kolo

#endif  // KOLO_TYPES_H_
