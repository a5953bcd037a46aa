// TensorView: a non-owning description of a dense, contiguous tensor.
//
// The caller owns the memory and must keep it alive and untouched until the
// Work of the collective that uses it has completed (successfully or not).
#ifndef KOLO_TENSOR_H_
#define KOLO_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kolo/types.h"

namespace kolo {

struct TensorView {
  void* data = nullptr;  // May be null when NumElements() == 0.
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;  // Row-major, contiguous. {} is a scalar.
  Device device = Device::Cpu();

  TensorView() = default;
  TensorView(void* data, DataType dtype, std::vector<int64_t> shape,
             Device device = Device::Cpu())
      : data(data), dtype(dtype), shape(std::move(shape)), device(device) {}

  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t ByteSize() const {
    return NumElements() * static_cast<int64_t>(DataTypeSize(dtype));
  }
};

// "[17,17,17]".
std::string ShapeToString(const std::vector<int64_t>& shape);

}  // namespace kolo

#endif  // KOLO_TENSOR_H_
