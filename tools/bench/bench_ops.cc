#include "tools/bench/bench_ops.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/alltoall.h"
#include "gloo/broadcast.h"
#include "gloo/math.h"
#include "gloo/reduce_scatter.h"

namespace kolo {
namespace bench {
namespace {

void Check(const absl::StatusOr<Work>& work, const std::string& what) {
  if (!work.ok()) Die(absl::StrCat(what, ": ", work.status().message()));
  absl::Status s = work->Wait();
  if (!s.ok()) Die(absl::StrCat(what, ": ", s.message()));
}

int64_t Elements(const std::vector<uint8_t>& bytes, DataType dtype) {
  return static_cast<int64_t>(bytes.size() / DataTypeSize(dtype));
}

// gloo's element-wise functions for one C++ type.
template <typename T>
::gloo::AllreduceOptions::Func GlooFunc(ReduceOp op) {
  using Fn = void (*)(void*, const void*, const void*, size_t);
  switch (op) {
    case ReduceOp::kMin:
      return static_cast<Fn>(&::gloo::min<T>);
    case ReduceOp::kMax:
      return static_cast<Fn>(&::gloo::max<T>);
    case ReduceOp::kProduct:
      return static_cast<Fn>(&::gloo::product<T>);
    default:
      return static_cast<Fn>(&::gloo::sum<T>);
  }
}

template <typename T>
const ::gloo::ReductionFunction<T>* GlooReduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin:
      return ::gloo::ReductionFunction<T>::min;
    case ReduceOp::kMax:
      return ::gloo::ReductionFunction<T>::max;
    case ReduceOp::kProduct:
      return ::gloo::ReductionFunction<T>::product;
    default:
      return ::gloo::ReductionFunction<T>::sum;
  }
}

// Calls f(T{}) with the C++ type of `dtype`; false if gloo lacks it.
template <typename F>
bool WithGlooType(DataType dtype, F&& f) {
  switch (dtype) {
    case DataType::kFloat32:
      f(float{});
      return true;
    case DataType::kFloat64:
      f(double{});
      return true;
    case DataType::kInt32:
      f(int32_t{});
      return true;
    case DataType::kInt64:
      f(int64_t{});
      return true;
    case DataType::kUint8:
      f(uint8_t{});
      return true;
    case DataType::kInt8:
      f(int8_t{});
      return true;
    default:
      return false;
  }
}

}  // namespace

Buffers::Buffers(Collective c, int64_t elements, DataType dtype, int ranks)
    : count(elements) {
  const size_t elem = DataTypeSize(dtype);
  const size_t full = static_cast<size_t>(elements) * elem;
  const size_t share = full / ranks;
  switch (c) {
    case Collective::kAllreduce:
    case Collective::kBroadcast:
      input.assign(full, 0);
      break;
    case Collective::kAllgather:
      input.assign(share, 1);
      output.assign(full, 0);
      break;
    case Collective::kReducescatter:
      input.assign(full, 0);
      output.assign(share, 0);
      break;
    case Collective::kAlltoall:
      input.assign(full, 1);
      output.assign(full, 0);
      break;
  }
}

void KoloRunner::Run(Collective c, Buffers& b) {
  const std::string name =
      absl::StrCat("bench/", CollectiveName(c), "/", b.count);
  const DataType dtype = flags_.dtype;
  switch (c) {
    case Collective::kAllreduce: {
      AllreduceRequest req;
      req.name = name;
      req.op = flags_.op;
      req.input = req.output = TensorView(b.input.data(), dtype, {b.count});
      if (flags_.blocking) {
        absl::Status s = rt_->AllreduceAndWait(req).status;
        if (!s.ok()) Die(absl::StrCat(name, ": ", s.message()));
      } else {
        Check(rt_->Allreduce(req), name);
      }
      break;
    }
    case Collective::kBroadcast: {
      BroadcastRequest req;
      req.name = name;
      req.tensor = TensorView(b.input.data(), dtype, {b.count});
      Check(rt_->Broadcast(req), name);
      break;
    }
    case Collective::kAllgather: {
      AllgatherRequest req;
      req.name = name;
      req.input = TensorView(b.input.data(), dtype, {Elements(b.input, dtype)});
      uint8_t* out = b.output.data();
      req.allocator =
          [out](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
        return out;
      };
      Check(rt_->Allgather(req), name);
      break;
    }
    case Collective::kReducescatter: {
      ReducescatterRequest req;
      req.name = name;
      req.op = flags_.op;
      req.input = TensorView(b.input.data(), dtype, {b.count});
      req.output =
          TensorView(b.output.data(), dtype, {Elements(b.output, dtype)});
      Check(rt_->Reducescatter(req), name);
      break;
    }
    case Collective::kAlltoall: {
      AlltoallRequest req;
      req.name = name;
      req.input = TensorView(b.input.data(), dtype, {b.count});
      uint8_t* out = b.output.data();
      req.allocator =
          [out](const std::vector<int64_t>&) -> absl::StatusOr<void*> {
        return out;
      };
      Check(rt_->Alltoall(req), name);
      break;
    }
  }
}

namespace {

// Allreduce i of a fusion step, named by `tag`.
AllreduceRequest StepRequest(std::vector<uint8_t>& tensor, const Flags& flags,
                             const std::string& tag, size_t i) {
  AllreduceRequest req;
  req.name = absl::StrCat("bench/", tag, "/", i);
  req.op = flags.op;
  req.input = req.output =
      TensorView(tensor.data(), flags.dtype, {Elements(tensor, flags.dtype)});
  return req;
}

void WaitAll(const std::vector<Work>& works) {
  for (const Work& w : works) {
    absl::Status s = w.Wait();
    if (!s.ok()) Die(std::string(s.message()));
  }
}

}  // namespace

void KoloRunner::RunMany(std::vector<std::vector<uint8_t>>& tensors,
                         const std::string& tag) {
  if (tensors.size() == 1 && flags_.blocking) {
    // One blocking call (the fusion mode's per-tensor row).
    absl::Status s =
        rt_->AllreduceAndWait(StepRequest(tensors[0], flags_, tag, 0)).status;
    if (!s.ok()) Die(std::string(s.message()));
    return;
  }
  const absl::Time start = absl::Now();
  std::vector<Work> works;
  works.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto work = rt_->Allreduce(StepRequest(tensors[i], flags_, tag, i));
    if (!work.ok()) Die(std::string(work.status().message()));
    works.push_back(std::move(*work));
  }
  submit_us_.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  WaitAll(works);
}

void KoloRunner::RunBatch(std::vector<std::vector<uint8_t>>& tensors,
                          const std::string& tag) {
  // Built per step like RunMany's, so that the two rows differ by the
  // submission call alone.
  const absl::Time start = absl::Now();
  std::vector<AllreduceRequest> requests;
  requests.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    requests.push_back(StepRequest(tensors[i], flags_, tag, i));
  }
  auto works = rt_->AllreduceBatch(requests);
  if (!works.ok()) Die(std::string(works.status().message()));
  submit_us_.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  WaitAll(*works);
}

// gloo's reduce-scatter is an old-style algorithm that sets up its buffers
// once per size; keep the last one.
struct GlooRunner::ReduceScatterCache {
  const void* data = nullptr;
  int64_t count = 0;
  std::unique_ptr<::gloo::Algorithm> algorithm;
};

GlooRunner::GlooRunner(std::shared_ptr<::gloo::Context> context,
                       const Flags& flags)
    : ctx_(std::move(context)),
      flags_(flags),
      reduce_scatter_(std::make_unique<ReduceScatterCache>()) {}

GlooRunner::~GlooRunner() = default;

bool GlooRunner::Supports(Collective c) const {
  if (c == Collective::kBroadcast || c == Collective::kAllgather ||
      c == Collective::kAlltoall) {
    return true;
  }
  return WithGlooType(flags_.dtype, [](auto) {});
}

void GlooRunner::Run(Collective c, Buffers& b) {
  const int n = ctx_->size;
  switch (c) {
    case Collective::kAllreduce:
      WithGlooType(flags_.dtype, [&](auto t) {
        using T = decltype(t);
        ::gloo::AllreduceOptions opts(ctx_);
        opts.setOutput(reinterpret_cast<T*>(b.input.data()), b.count);
        opts.setReduceFunction(GlooFunc<T>(flags_.op));
        ::gloo::allreduce(opts);
      });
      break;
    case Collective::kBroadcast: {
      ::gloo::BroadcastOptions opts(ctx_);
      opts.setRoot(0);
      if (ctx_->rank == 0) opts.setInput(b.input.data(), b.input.size());
      opts.setOutput(b.input.data(), b.input.size());
      ::gloo::broadcast(opts);
      break;
    }
    case Collective::kAllgather: {
      ::gloo::AllgatherOptions opts(ctx_);
      opts.setInput(b.input.data(), b.input.size());
      opts.setOutput(b.output.data(), b.output.size());
      ::gloo::allgather(opts);
      break;
    }
    case Collective::kAlltoall: {
      ::gloo::AlltoallOptions opts(ctx_);
      opts.setInput(b.input.data(), b.input.size());
      opts.setOutput(b.output.data(), b.output.size());
      ::gloo::alltoall(opts);
      break;
    }
    case Collective::kReducescatter:
      WithGlooType(flags_.dtype, [&](auto t) {
        using T = decltype(t);
        ReduceScatterCache& cache = *reduce_scatter_;
        if (cache.data != b.input.data() || cache.count != b.count) {
          std::vector<int> recv(n, static_cast<int>(b.count / n));
          cache.algorithm =
              std::make_unique<::gloo::ReduceScatterHalvingDoubling<T>>(
                  ctx_, std::vector<T*>{reinterpret_cast<T*>(b.input.data())},
                  static_cast<int>(b.count), recv, GlooReduction<T>(flags_.op));
          cache.data = b.input.data();
          cache.count = b.count;
        }
        cache.algorithm->run();
      });
      break;
  }
}

void GlooRunner::RunMany(std::vector<std::vector<uint8_t>>& tensors) {
  for (auto& t : tensors) {
    WithGlooType(flags_.dtype, [&](auto v) {
      using T = decltype(v);
      ::gloo::AllreduceOptions opts(ctx_);
      opts.setOutput(reinterpret_cast<T*>(t.data()), t.size() / sizeof(T));
      opts.setReduceFunction(GlooFunc<T>(flags_.op));
      ::gloo::allreduce(opts);
    });
  }
}

}  // namespace bench
}  // namespace kolo
