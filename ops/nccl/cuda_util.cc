#include "ops/nccl/cuda_util.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "ops/cpu/reduce.h"

namespace kolo {
namespace nccl {

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorString(error), " (CUDA error ",
                   static_cast<int>(error), ")");
  switch (error) {
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
    case cudaErrorDevicesUnavailable:
      return absl::FailedPreconditionError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevice:
      return absl::InvalidArgumentError(message);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result));
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && last[0] != '\0')
    absl::StrAppend(&message, " (", last, ")");
  switch (result) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(message);
    case ncclInProgress:
      return absl::DeadlineExceededError(message);
    default:
      return absl::InternalError(message);
  }
}

ncclDataType_t ToNcclDataType(DataType dtype) {
  switch (dtype) {
    case DataType::kUint8:
      return ncclUint8;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBfloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    // Bytes moved, never reduced (the runtime rejects reducing bool).
    case DataType::kBool:
      return ncclUint8;
    // NCCL has no 16-bit integer: the runtime rejects int16 CUDA tensors at
    // submit (CheckTensor in runtime/api/runtime.cc).
    case DataType::kInt16:
      return ncclUint8;
  }
  return ncclUint8;  // unreachable: the runtime checks dtypes at submit
}

ncclRedOp_t ToNcclRedOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAverage:
      return ncclAvg;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
  }
  return ncclSum;  // unreachable: the runtime checks ops at submit
}

Scalar ScalarOf(DataType dtype, double factor) {
  Scalar s;
  switch (dtype) {
    case DataType::kFloat16: {
      const uint16_t h = cpu::FloatToHalf(static_cast<float>(factor));
      std::memcpy(s.bytes, &h, sizeof(h));
      break;
    }
    case DataType::kBfloat16: {
      const uint16_t b = cpu::FloatToBfloat16(static_cast<float>(factor));
      std::memcpy(s.bytes, &b, sizeof(b));
      break;
    }
    case DataType::kFloat32: {
      const float f = static_cast<float>(factor);
      std::memcpy(s.bytes, &f, sizeof(f));
      break;
    }
    case DataType::kFloat64:
      std::memcpy(s.bytes, &factor, sizeof(factor));
      break;
    default:
      break;  // integers: the runtime rejects scale factors other than 1
  }
  return s;
}

ScaledReduction PlanScaledReduction(ReduceOp op, double prescale,
                                    double postscale, int size) {
  ScaledReduction plan;
  plan.op = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  switch (plan.op) {
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      if (prescale < 0) {
        plan.op = plan.op == ReduceOp::kMin ? ReduceOp::kMax : ReduceOp::kMin;
      }
      plan.postscale = prescale * postscale;
      break;
    case ReduceOp::kProduct:
      plan.postscale = std::pow(prescale, size) * postscale;
      break;
    default:
      plan.premul = prescale * postscale;
      break;
  }
  return plan;
}

absl::StatusOr<int> CudaDeviceCount() {
  // Asked once: the answer cannot change in a running process (devices are
  // fixed when the CUDA runtime initialises), and the probe runs on every
  // submit of a CUDA tensor.
  static const absl::StatusOr<int>* const count = [] {
    int n = 0;
    const cudaError_t error = cudaGetDeviceCount(&n);
    if (error != cudaSuccess) {
      return new absl::StatusOr<int>(absl::FailedPreconditionError(absl::StrCat(
          "no CUDA device is visible to this process (cudaGetDeviceCount: ",
          cudaGetErrorString(error), ")")));
    }
    if (n == 0) {
      return new absl::StatusOr<int>(absl::FailedPreconditionError(
          "no CUDA device is visible to this process (cudaGetDeviceCount: 0 "
          "devices; check CUDA_VISIBLE_DEVICES)"));
    }
    return new absl::StatusOr<int>(n);
  }();
  return *count;
}

absl::Status ProbeCudaDevice(const Device& device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device.index < 0 || device.index >= *count) {
    return absl::InvalidArgumentError(
        absl::StrCat(device.ToString(), " does not exist (", *count,
                     *count == 1 ? " device" : " devices", ")"));
  }
  return absl::OkStatus();
}

}  // namespace nccl
}  // namespace kolo
