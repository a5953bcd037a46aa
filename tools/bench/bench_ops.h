// The measured collectives: through kolo (the public Runtime API, the way a
// training program calls it) and through plain gloo (no kolo) on the same
// buffers, in the same processes.
#ifndef KOLO_TOOLS_BENCH_BENCH_OPS_H_
#define KOLO_TOOLS_BENCH_BENCH_OPS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gloo/context.h"
#include "kolo/runtime.h"
#include "tools/bench/bench_common.h"

namespace kolo {
namespace bench {

// Input and output of one collective of `count` elements (CountFor), sized
// for the collective: allreduce and broadcast work in place on `input`.
struct Buffers {
  Buffers(Collective c, int64_t count, DataType dtype, int ranks);
  std::vector<uint8_t> input, output;
  int64_t count;  // elements of the full buffer
};

// Runs collectives through a Runtime; every error is fatal (Die).
class KoloRunner {
 public:
  KoloRunner(Runtime* runtime, const Flags& flags)
      : rt_(runtime), flags_(flags) {}
  void Run(Collective c, Buffers& b);
  // `tensors.size()` allreduces submitted at once, then all waited for.
  void RunMany(std::vector<std::vector<uint8_t>>& tensors,
               const std::string& tag);
  // The same through one Runtime::AllreduceBatch call.
  void RunBatch(std::vector<std::vector<uint8_t>>& tensors,
                const std::string& tag);
  // Microseconds each RunMany/RunBatch call spent submitting (building the
  // requests included), in call order; cleared by the caller.
  std::vector<double>& submit_us() { return submit_us_; }

 private:
  Runtime* rt_;
  const Flags& flags_;
  std::vector<double> submit_us_;
};

// Plain gloo on its own context (no kolo): gloo's own algorithms and
// reduction loops, as a program using gloo directly would run them.
class GlooRunner {
 public:
  GlooRunner(std::shared_ptr<::gloo::Context> context, const Flags& flags);
  ~GlooRunner();
  // False if gloo has no equivalent for this dtype/op (reported as n/a).
  bool Supports(Collective c) const;
  void Run(Collective c, Buffers& b);
  void RunMany(std::vector<std::vector<uint8_t>>& tensors);

 private:
  struct ReduceScatterCache;
  std::shared_ptr<::gloo::Context> ctx_;
  const Flags& flags_;
  std::unique_ptr<ReduceScatterCache> reduce_scatter_;
};

}  // namespace bench
}  // namespace kolo

#endif  // KOLO_TOOLS_BENCH_BENCH_OPS_H_
