// Small pieces of the NCCL backend that need no GPU: CUDA/NCCL return codes
// as absl::Status, the kolo -> NCCL type and op mapping, the 16-bit scalar
// encoding for ncclRedOpCreatePreMulSum, and the CUDA device probe.
//
// Thread safety: pure functions, except CudaDeviceCount(), which asks the
// driver once per process (the first call, from any thread) and then
// returns the cached answer.
#ifndef KOLO_OPS_NCCL_CUDA_UTIL_H_
#define KOLO_OPS_NCCL_CUDA_UTIL_H_

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kolo/types.h"

namespace kolo {
namespace nccl {

// "cudaMemcpyAsync: invalid argument" as Internal (or Unavailable for
// errors that mean the device is gone), with `what` in front.
absl::Status CudaStatus(cudaError_t error, const char* what);
// "ncclAllReduce: remote process exited or there was a network error" as
// Unavailable (remote/system errors), InvalidArgument (argument/usage
// errors) or Internal, with `what` in front and NCCL's last error message
// when it has one.
absl::Status NcclStatus(ncclResult_t result, const char* what);

// kolo dtype -> NCCL dtype (every kolo dtype has one).
ncclDataType_t ToNcclDataType(DataType dtype);
// sum/min/max/product -> NCCL's built-in op. kAverage -> ncclAvg (the
// executor never passes it: it sums and scales).
ncclRedOp_t ToNcclRedOp(ReduceOp op);

// `factor` as a scalar of `dtype` for ncclRedOpCreatePreMulSum: 8 bytes,
// of which the first DataTypeSize(dtype) hold the value (half/bfloat16
// rounded to nearest even). Floating point dtypes only.
struct Scalar {
  alignas(8) unsigned char bytes[8] = {};
};
Scalar ScalarOf(DataType dtype, double factor);

// How a scaled reduction runs on NCCL, which has no scaling of its own
// except the pre-multiplied sum. result = postscale * op(prescale * x_r):
//   sum:      one PreMulSum by prescale*postscale (premul), no postscale;
//   min/max:  op(prescale * x) = prescale * op(x) for prescale >= 0 and
//             the other of min/max for prescale < 0 (rounding is monotonic,
//             so this is exact); postscale' = prescale * postscale;
//   product:  postscale' = prescale^size * postscale.
// The caller then multiplies the result by `postscale` when it is not 1.
// Integer dtypes always have factors 1 (the runtime checks).
struct ScaledReduction {
  ReduceOp op = ReduceOp::kSum;
  double premul = 1.0;
  double postscale = 1.0;
};
ScaledReduction PlanScaledReduction(ReduceOp op, double prescale,
                                    double postscale, int size);

// cudaGetDeviceCount, asked once per process: the count, or
// FailedPrecondition "no CUDA device is visible to this process
// (cudaGetDeviceCount: <CUDA's reason>)".
absl::StatusOr<int> CudaDeviceCount();
// The DeviceProbe of the nccl backend: OK for an existing cuda:N;
// FailedPrecondition when there is no GPU; InvalidArgument "cuda:3 does not
// exist (2 devices)" for an ordinal out of range. Thread-safe.
absl::Status ProbeCudaDevice(const Device& device);

}  // namespace nccl
}  // namespace kolo

#endif  // KOLO_OPS_NCCL_CUDA_UTIL_H_
