// TensorView: a non-owning description of a dense, contiguous tensor.
//
// The caller owns the memory and must keep it alive and untouched until the
// Work of the collective that uses it has completed (successfully or not).
//
// Thread safety: TensorView is a plain value type (copying it copies the
// description, not the data). ReadyEvent::Ready() is called from the
// runtime's threads and must be thread-safe.
//
// Errors: a view is not checked when made. A collective rejects a bad one
// (no data but elements, a negative dimension, an unknown dtype, a device
// this build has no backend for) at submission, and views that disagree
// across ranks at negotiation, with InvalidArgument naming the tensor (and
// the ranks and their values).
#ifndef KOLO_TENSOR_H_
#define KOLO_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kolo/types.h"

namespace kolo {

// ReadyEvent: tells the runtime when a device tensor has been written. A
// CUDA tensor is usually still being produced by kernels queued on a stream
// when its collective is submitted; the frontend records an event on that
// stream and passes it here. The runtime polls Ready() on its own threads
// (the caller never blocks) before any byte of the tensor is read.
// Thread-safe: Ready() may be called from any thread.
class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  virtual bool Ready() = 0;
};

struct TensorView {
  void* data = nullptr;  // May be null when NumElements() == 0.
  DataType dtype = DataType::kFloat32;
  std::vector<int64_t> shape;  // Row-major, contiguous. {} is a scalar.
  Device device = Device::Cpu();
  // CUDA tensors: when the contents are written (see ReadyEvent). Null: the
  // collective is ordered after the device's legacy default stream, which
  // suits programs that use no other stream. Ignored on the CPU.
  std::shared_ptr<ReadyEvent> ready;

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
