// Typed element access for tests: write/read any kolo::DataType as double.
#ifndef KOLO_TESTS_TESTING_VALUES_H_
#define KOLO_TESTS_TESTING_VALUES_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "kolo/types.h"
#include "ops/cpu/reduce.h"

namespace kolo {
namespace testing {

inline void SetValue(DataType dtype, void* base, size_t i, double v) {
  switch (dtype) {
    case DataType::kUint8:
      static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v);
      break;
    case DataType::kInt8:
      static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v);
      break;
    case DataType::kInt16:
      static_cast<int16_t*>(base)[i] = static_cast<int16_t>(v);
      break;
    case DataType::kBool:
      static_cast<uint8_t*>(base)[i] = v != 0;
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(base)[i] = cpu::FloatToHalf(static_cast<float>(v));
      break;
    case DataType::kBfloat16:
      static_cast<uint16_t*>(base)[i] =
          cpu::FloatToBfloat16(static_cast<float>(v));
      break;
    case DataType::kFloat32:
      static_cast<float*>(base)[i] = static_cast<float>(v);
      break;
    case DataType::kFloat64:
      static_cast<double*>(base)[i] = v;
      break;
  }
}

inline double GetValue(DataType dtype, const void* base, size_t i) {
  switch (dtype) {
    case DataType::kUint8:
      return static_cast<const uint8_t*>(base)[i];
    case DataType::kInt8:
      return static_cast<const int8_t*>(base)[i];
    case DataType::kInt16:
      return static_cast<const int16_t*>(base)[i];
    case DataType::kBool:
      return static_cast<const uint8_t*>(base)[i];
    case DataType::kInt32:
      return static_cast<const int32_t*>(base)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DataType::kFloat16:
      return cpu::HalfToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::kBfloat16:
      return cpu::Bfloat16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DataType::kFloat32:
      return static_cast<const float*>(base)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(base)[i];
  }
  return 0;
}

// Every dtype that reductions take (all but bool).
inline std::vector<DataType> AllDataTypes() {
  return {DataType::kUint8,    DataType::kInt8,    DataType::kInt16,
          DataType::kInt32,    DataType::kInt64,   DataType::kFloat16,
          DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64};
}

// A buffer of `count` elements of `dtype`.
struct Buffer {
  Buffer(DataType dtype, size_t count)
      : dtype(dtype), bytes(count * DataTypeSize(dtype) + 1) {}
  void* data() { return bytes.data(); }
  double at(size_t i) const { return GetValue(dtype, bytes.data(), i); }
  void set(size_t i, double v) { SetValue(dtype, bytes.data(), i, v); }
  DataType dtype;
  std::vector<uint8_t> bytes;
};

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_TESTING_VALUES_H_
