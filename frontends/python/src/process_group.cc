// ProcessGroupKolo: see process_group.h (Note [Collectives named by
// sequence]); its Works are work.cc's.
#include "frontends/python/src/process_group.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "runtime/sync/mutex.h"

namespace kolo {
namespace torch {
namespace {

// Errors of the backend itself (bad arguments, what kolo does not do), as
// torch's own backends raise them: c10::Error, a RuntimeError in Python.
[[noreturn]] void Refuse(const std::string& message) {
  TORCH_CHECK(false, "kolo's torch.distributed backend: ", message);
}

const char* OpName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return "SUM";
    case c10d::ReduceOp::AVG:
      return "AVG";
    case c10d::ReduceOp::PRODUCT:
      return "PRODUCT";
    case c10d::ReduceOp::MIN:
      return "MIN";
    case c10d::ReduceOp::MAX:
      return "MAX";
    case c10d::ReduceOp::BAND:
      return "BAND";
    case c10d::ReduceOp::BOR:
      return "BOR";
    case c10d::ReduceOp::BXOR:
      return "BXOR";
    case c10d::ReduceOp::PREMUL_SUM:
      return "PREMUL_SUM";
    default:
      return "UNUSED";
  }
}

// A torch reduction as kolo's: the op, and the factor every input is
// multiplied by first (PREMUL_SUM: FSDP2's gradient divide factor).
struct Reduction {
  kolo::ReduceOp op;
  double prescale = 1.0;
};

Reduction ToKolo(const c10d::ReduceOp& op, const char* collective) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return {kolo::ReduceOp::kSum};
    case c10d::ReduceOp::AVG:
      return {kolo::ReduceOp::kAverage};
    case c10d::ReduceOp::PRODUCT:
      return {kolo::ReduceOp::kProduct};
    case c10d::ReduceOp::MIN:
      return {kolo::ReduceOp::kMin};
    case c10d::ReduceOp::MAX:
      return {kolo::ReduceOp::kMax};
    case c10d::ReduceOp::PREMUL_SUM: {
      // The sum of factor * input_r: kolo's prescale (floating point only).
      const auto* factor = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(
          op.supplement_.get());
      if (factor == nullptr) {
        Refuse(
            absl::StrCat(collective, " with ReduceOp.PREMUL_SUM: no factor"));
      }
#if TORCH_VERSION_MAJOR >= 2
      const at::Tensor tensor = factor->tensor_factor;
#else
      const at::Tensor tensor = factor->tensor_factors.empty()
                                    ? at::Tensor()
                                    : factor->tensor_factors[0];
#endif
      return {kolo::ReduceOp::kSum, tensor.defined()
                                        ? tensor.to(at::kCPU).item<double>()
                                        : factor->double_factor};
    }
    default:
      Refuse(absl::StrCat(collective, " with ReduceOp.", OpName(op.op_),
                          " is not supported (SUM, AVG, PRODUCT, MIN, MAX and "
                          "PREMUL_SUM are)"));
  }
}

// kolo's options of a reducing collective: its name, the reduction, the
// process set and the timeout.
template <typename Options>
Options Reducing(const std::string& name, const Reduction& op, int set,
                 std::chrono::milliseconds timeout) {
  return Options()
      .name(name)
      .op(op.op)
      .prescale(op.prescale)
      .process_set(set)
      .timeout(timeout);
}

// The one tensor of a per-device list (one device per process here).
at::Tensor& One(std::vector<at::Tensor>& tensors, const char* collective) {
  if (tensors.size() != 1) {
    Refuse(absl::StrCat(collective,
                        " takes one tensor per process (one "
                        "device per process), got ",
                        tensors.size()));
  }
  return tensors[0];
}

std::vector<at::Tensor>& OneList(std::vector<std::vector<at::Tensor>>& lists,
                                 const char* collective) {
  if (lists.size() != 1) {
    Refuse(absl::StrCat(collective,
                        " takes one tensor list per process (one "
                        "device per process), got ",
                        lists.size()));
  }
  return lists[0];
}

void CheckCount(const std::vector<at::Tensor>& list, int size,
                const char* collective, const char* what) {
  if (static_cast<int>(list.size()) != size) {
    Refuse(absl::StrCat(collective, ": ", what, " has ", list.size(),
                        " tensors, the group ", size, " ranks"));
  }
}

// Copies `from` into `to` where both hold the same number of elements.
void CopyInto(at::Tensor& to, const at::Tensor& from, const char* collective) {
  if (to.numel() != from.numel()) {
    Refuse(absl::StrCat(collective, ": the output tensor has ", to.numel(),
                        " elements where ", from.numel(), " arrived"));
  }
  to.copy_(from.reshape(to.sizes()));
}

// `t` as one row: kolo gathers and splits along the first dimension, torch
// along whole tensors of any shape (scalars included).
at::Tensor AsRow(const at::Tensor& t) { return t.reshape({1, t.numel()}); }

}  // namespace

// ---- ProcessGroupKolo ---------------------------------------------------

ProcessGroupKolo::ProcessGroupKolo(std::shared_ptr<Context> context,
                                   int process_set, int rank, int size,
                                   std::string group,
                                   std::chrono::milliseconds timeout)
    : KoloBackendBase(rank, size),
      context_(std::move(context)),
      set_(process_set),
      group_(std::move(group)),
      timeout_(timeout),
      completer_(std::make_shared<Completer>()) {
  if (!context_) Refuse("no kolo context");
}

ProcessGroupKolo::~ProcessGroupKolo() = default;

std::string ProcessGroupKolo::NextName() {
  return absl::StrCat("c10d/", group_, "/", next_.fetch_add(1));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::Enqueue(
    c10d::OpType type, const std::string& name, std::vector<Handle> handles,
    std::function<std::vector<at::Tensor>()> finish) {
  return c10::make_intrusive<KoloWork>(
      getRank(), type, name, std::move(handles), std::move(finish), completer_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::broadcast(
    std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions& opts) {
  at::Tensor t = One(tensors, "broadcast");
  // torch names the root by its rank in the group, kolo by its rank in the
  // job.
  int root = static_cast<int>(opts.rootRank);
  if (set_ != kGlobalProcessSet) {
    const std::vector<int> ranks = context_->process_set_ranks(set_);
    if (root < 0 || root >= static_cast<int>(ranks.size())) {
      Refuse(absl::StrCat("broadcast: root ", root,
                          " is not a rank of this "
                          "group of ",
                          ranks.size()));
    }
    root = ranks[root];
  }
  const std::string name = NextName();
  Handle h = context_->broadcast_async_(
      t, BroadcastOptions().name(name).root(root).process_set(set_).timeout(
             Timeout(opts.timeout)));
  return Enqueue(c10d::OpType::BROADCAST, name, {h}, [h, t] {
    h.wait();
    return std::vector<at::Tensor>{t};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::allreduce(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  at::Tensor t = One(tensors, "allreduce");
  if (t.is_sparse()) return SparseAllreduce(t, opts);
  const Reduction op = ToKolo(opts.reduceOp, "allreduce");
  const std::string name = NextName();
  Handle h = context_->allreduce_async_(
      t, Reducing<AllreduceOptions>(name, op, set_, Timeout(opts.timeout)));
  return Enqueue(c10d::OpType::ALLREDUCE, name, {h}, [h, t] {
    h.wait();
    return std::vector<at::Tensor>{t};
  });
}

// A sparse COO tensor's SUM, as ProcessGroupGloo's: every rank gathers
// every rank's indices and values (two allgathers, any number of non-zeros
// per rank), and adds them up by coalescing. Every rank coalesces the same
// rows in the same order: bitwise-identical results. The sum is written
// into the caller's tensor.
c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::SparseAllreduce(
    at::Tensor t, const c10d::AllreduceOptions& opts) {
  if (opts.reduceOp != c10d::ReduceOp::SUM) {
    Refuse(absl::StrCat("allreduce of a sparse tensor with ReduceOp.",
                        OpName(opts.reduceOp.op_),
                        " is not supported (SUM is)"));
  }
  const at::Tensor in = t.coalesce();
  const std::string name = NextName();
  const std::chrono::milliseconds timeout = Timeout(opts.timeout);
  // One row per non-zero: its indices, and its value (a slice of the
  // dense dimensions).
  Handle indices = context_->allgather_async(
      in.indices().t().contiguous(), AllgatherOptions()
                                         .name(absl::StrCat(name, ".indices"))
                                         .process_set(set_)
                                         .timeout(timeout));
  Handle values = context_->allgather_async(
      in.values().contiguous(), AllgatherOptions()
                                    .name(absl::StrCat(name, ".values"))
                                    .process_set(set_)
                                    .timeout(timeout));
  return Enqueue(c10d::OpType::ALLREDUCE, name, {indices, values},
                 [indices, values, t]() mutable {
                   at::Tensor all_indices = indices.wait().t();
                   at::Tensor all_values = values.wait();
                   t.copy_(at::sparse_coo_tensor(all_indices, all_values,
                                                 t.sizes(), t.options())
                               .coalesce());
                   return std::vector<at::Tensor>{t};
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::allreduce_coalesced(
    std::vector<at::Tensor>& tensors,
    const c10d::AllreduceCoalescedOptions& opts) {
  if (tensors.empty()) Refuse("allreduce_coalesced needs at least one tensor");
  const Reduction op = ToKolo(opts.reduceOp, "allreduce_coalesced");
  const std::string name = NextName();
  // One negotiation and one fused collective for the whole list.
  Handle h = context_->grouped_allreduce_async_(
      tensors,
      Reducing<GroupedAllreduceOptions>(name, op, set_, Timeout(opts.timeout)));
  std::vector<at::Tensor> outputs = tensors;
  return Enqueue(c10d::OpType::ALLREDUCE_COALESCED, name, {h}, [h, outputs] {
    h.wait_all();
    return outputs;
  });
}

// kolo has no reduce: every rank gets the result of an allreduce, written
// into the tensor on the root only (torch leaves the others' unchanged).
c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::reduce(
    std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  at::Tensor t = One(tensors, "reduce");
  const Reduction op = ToKolo(opts.reduceOp, "reduce");
  if (opts.rootRank < 0 || opts.rootRank >= getSize()) {
    Refuse(absl::StrCat("reduce: root ", opts.rootRank,
                        " is not a rank of the group (size ", getSize(), ")"));
  }
  const bool root = opts.rootRank == getRank();
  const std::string name = NextName();
  AllreduceOptions options =
      Reducing<AllreduceOptions>(name, op, set_, Timeout(opts.timeout));
  Handle h = root ? context_->allreduce_async_(t, options)
                  : context_->allreduce_async(t, options);
  return Enqueue(c10d::OpType::REDUCE, name, {h}, [h, t] {
    h.wait();
    return std::vector<at::Tensor>{t};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::allgather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  at::Tensor in = One(inputs, "allgather");
  std::vector<at::Tensor> out = OneList(outputs, "allgather");
  CheckCount(out, getSize(), "allgather", "the output list");
  const std::string name = NextName();
  Handle h = context_->allgather_async(
      AsRow(in), AllgatherOptions().name(name).process_set(set_).timeout(
                     Timeout(opts.timeout)));
  return Enqueue(c10d::OpType::ALLGATHER, name, {h}, [h, out]() mutable {
    at::Tensor rows = h.wait();
    for (size_t r = 0; r < out.size(); ++r) {
      CopyInto(out[r], rows[r], "allgather");
    }
    return out;
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  if (output.numel() != input.numel() * getSize()) {
    Refuse(absl::StrCat("_allgather_base: the output holds ", output.numel(),
                        " elements, not ", getSize(), " x ", input.numel()));
  }
  const std::string name = NextName();
  Handle h = context_->allgather_async(
      AsRow(input), AllgatherOptions().name(name).process_set(set_).timeout(
                        Timeout(opts.timeout)));
  at::Tensor out = output;
  return Enqueue(c10d::OpType::_ALLGATHER_BASE, name, {h}, [h, out]() mutable {
    CopyInto(out, h.wait(), "_allgather_base");
    return std::vector<at::Tensor>{out};
  });
}

// torch's layout (its docstring, ProcessGroupGloo): outputs[r][i] receives
// rank r's inputs[i].
c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  const char* what = "allgather_coalesced";
  if (static_cast<int>(outputs.size()) != getSize()) {
    Refuse(absl::StrCat(what, ": ", outputs.size(),
                        " output lists, the group has ", getSize(),
                        " ranks (one list per rank)"));
  }
  for (const auto& list : outputs) {
    CheckCount(list, static_cast<int>(inputs.size()), what,
               "an output list (one tensor per input)");
  }
  const std::string name = NextName();
  std::vector<Handle> handles;
  for (size_t i = 0; i < inputs.size(); ++i) {
    handles.push_back(context_->allgather_async(
        AsRow(inputs[i]), AllgatherOptions()
                              .name(absl::StrCat(name, ".", i))
                              .process_set(set_)
                              .timeout(Timeout(opts.timeout))));
  }
  std::vector<std::vector<at::Tensor>> out = outputs;
  return Enqueue(c10d::OpType::ALLGATHER_COALESCED, name, handles,
                 [handles, out, what]() mutable {
                   std::vector<at::Tensor> all;
                   for (size_t i = 0; i < handles.size(); ++i) {
                     at::Tensor rows = handles[i].wait();
                     for (size_t r = 0; r < out.size(); ++r) {
                       CopyInto(out[r][i], rows[r], what);
                     }
                   }
                   for (const auto& list : out) {
                     all.insert(all.end(), list.begin(), list.end());
                   }
                   return all;
                 });
}

// An allgather whose result only the root keeps.
c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::gather(
    std::vector<std::vector<at::Tensor>>& outputs,
    std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  at::Tensor in = One(inputs, "gather");
  if (opts.rootRank < 0 || opts.rootRank >= getSize()) {
    Refuse(absl::StrCat("gather: root ", opts.rootRank,
                        " is not a rank of the group (size ", getSize(), ")"));
  }
  const bool root = opts.rootRank == getRank();
  std::vector<at::Tensor> out;
  if (root) {
    out = OneList(outputs, "gather");
    CheckCount(out, getSize(), "gather", "the root's output list");
  } else if (!outputs.empty() && !outputs[0].empty()) {
    Refuse("gather: only the root passes output tensors");
  }
  const std::string name = NextName();
  Handle h = context_->allgather_async(
      AsRow(in), AllgatherOptions().name(name).process_set(set_).timeout(
                     Timeout(opts.timeout)));
  return Enqueue(c10d::OpType::GATHER, name, {h}, [h, out]() mutable {
    at::Tensor rows = h.wait();
    for (size_t r = 0; r < out.size(); ++r) CopyInto(out[r], rows[r], "gather");
    return out;
  });
}

// An alltoall in which only the root sends: one row to each rank.
c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  at::Tensor out = One(outputs, "scatter");
  if (opts.rootRank < 0 || opts.rootRank >= getSize()) {
    Refuse(absl::StrCat("scatter: root ", opts.rootRank,
                        " is not a rank of the group (size ", getSize(), ")"));
  }
  const bool root = opts.rootRank == getRank();
  at::Tensor send;
  std::vector<int64_t> splits(getSize(), 0);
  if (root) {
    std::vector<at::Tensor> list = OneList(inputs, "scatter");
    CheckCount(list, getSize(), "scatter", "the root's input list");
    std::vector<at::Tensor> rows;
    for (const at::Tensor& t : list) {
      if (t.numel() != out.numel()) {
        Refuse(absl::StrCat("scatter: the root's inputs must each hold ",
                            out.numel(), " elements (the output's), one holds ",
                            t.numel()));
      }
      rows.push_back(AsRow(t.to(out.scalar_type())));
    }
    send = at::cat(rows);
    std::fill(splits.begin(), splits.end(), 1);
  } else {
    if (!inputs.empty() && !inputs[0].empty()) {
      Refuse("scatter: only the root passes input tensors");
    }
    send = at::empty({0, out.numel()}, out.options());
  }
  const std::string name = NextName();
  Handle h = context_->alltoall_async(
      send,
      AlltoallOptions().name(name).splits(splits).process_set(set_).timeout(
          Timeout(opts.timeout)));
  return Enqueue(c10d::OpType::SCATTER, name, {h}, [h, out]() mutable {
    CopyInto(out, h.wait(), "scatter");
    return std::vector<at::Tensor>{out};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::reduce_scatter(
    std::vector<at::Tensor>& outputs,
    std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = One(outputs, "reduce_scatter");
  std::vector<at::Tensor> list = OneList(inputs, "reduce_scatter");
  CheckCount(list, getSize(), "reduce_scatter", "the input list");
  const Reduction op = ToKolo(opts.reduceOp, "reduce_scatter");
  std::vector<at::Tensor> rows;
  for (const at::Tensor& t : list) {
    if (t.numel() != out.numel()) {
      Refuse(absl::StrCat("reduce_scatter: every input must hold ", out.numel(),
                          " elements (the output's), one holds ", t.numel()));
    }
    rows.push_back(AsRow(t));
  }
  const std::string name = NextName();
  // One row per rank: rank r's share is row r of the reduction.
  Handle h = context_->reducescatter_async(
      at::cat(rows),
      Reducing<ReducescatterOptions>(name, op, set_, Timeout(opts.timeout)));
  return Enqueue(c10d::OpType::REDUCE_SCATTER, name, {h}, [h, out]() mutable {
    CopyInto(out, h.wait(), "reduce_scatter");
    return std::vector<at::Tensor>{out};
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& opts) {
  if (input.numel() != output.numel() * getSize()) {
    Refuse(absl::StrCat("_reduce_scatter_base: the input holds ", input.numel(),
                        " elements, not ", getSize(), " x ", output.numel()));
  }
  const Reduction op = ToKolo(opts.reduceOp, "_reduce_scatter_base");
  const std::string name = NextName();
  Handle h = context_->reducescatter_async(
      input.reshape({getSize(), output.numel()}),
      Reducing<ReducescatterOptions>(name, op, set_, Timeout(opts.timeout)));
  at::Tensor out = output;
  return Enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, name, {h},
                 [h, out]() mutable {
                   CopyInto(out, h.wait(), "_reduce_scatter_base");
                   return std::vector<at::Tensor>{out};
                 });
}

#if TORCH_VERSION_MAJOR >= 2
c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::EnqueueCoalesced(
    const std::string& name, std::vector<Handle> handles,
    std::vector<at::Tensor> outputs, const char* what) {
  return Enqueue(c10d::OpType::COALESCED, name, handles,
                 [handles, outputs, what]() mutable {
                   for (size_t i = 0; i < handles.size(); ++i) {
                     CopyInto(outputs[i], handles[i].wait(), what);
                   }
                   return outputs;
                 });
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupKolo::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  const char* what = "allgather_into_tensor_coalesced";
  CheckCount(outputs, static_cast<int>(inputs.size()), what, "the outputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (outputs[i].numel() != inputs[i].numel() * getSize()) {
      Refuse(absl::StrCat(what, ": output ", i, " holds ", outputs[i].numel(),
                          " elements, not ", getSize(), " x ",
                          inputs[i].numel()));
    }
  }
  const std::string name = NextName();
  std::vector<Handle> handles;
  for (size_t i = 0; i < inputs.size(); ++i) {
    handles.push_back(context_->allgather_async(
        AsRow(inputs[i]), AllgatherOptions()
                              .name(absl::StrCat(name, ".", i))
                              .process_set(set_)
                              .timeout(Timeout(opts.timeout))));
  }
  return EnqueueCoalesced(name, std::move(handles), outputs, what);
}

c10::intrusive_ptr<c10d::Work>
ProcessGroupKolo::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  const char* what = "reduce_scatter_tensor_coalesced";
  CheckCount(outputs, static_cast<int>(inputs.size()), what, "the outputs");
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].numel() != outputs[i].numel() * getSize()) {
      Refuse(absl::StrCat(what, ": input ", i, " holds ", inputs[i].numel(),
                          " elements, not ", getSize(), " x ",
                          outputs[i].numel()));
    }
  }
  const Reduction op = ToKolo(opts.reduceOp, what);
  const std::string name = NextName();
  std::vector<Handle> handles;
  for (size_t i = 0; i < inputs.size(); ++i) {
    handles.push_back(context_->reducescatter_async(
        inputs[i].reshape({getSize(), outputs[i].numel()}),
        Reducing<ReducescatterOptions>(absl::StrCat(name, ".", i), op, set_,
                                       Timeout(opts.timeout))));
  }
  return EnqueueCoalesced(name, std::move(handles), outputs, what);
}
#endif

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
  const int size = getSize();
  if (input.dim() == 0 || output.dim() == 0) {
    Refuse(
        "alltoall_base: the input and output need a first dimension to "
        "split");
  }
  std::vector<int64_t> splits = input_splits;
  if (splits.empty()) {
    if (input.size(0) % size != 0) {
      Refuse(absl::StrCat("alltoall_base: the input's first dimension (",
                          input.size(0), ") does not divide evenly among ",
                          size, " ranks; pass input_split_sizes"));
    }
    splits.assign(size, input.size(0) / size);
  }
  std::vector<int64_t> want = output_splits;
  if (want.empty()) {
    if (output.size(0) % size != 0) {
      Refuse(absl::StrCat("alltoall_base: the output's first dimension (",
                          output.size(0), ") does not divide evenly among ",
                          size, " ranks; pass output_split_sizes"));
    }
    want.assign(size, output.size(0) / size);
  }
  const std::string name = NextName();
  Handle h = context_->alltoall_async(
      input,
      AlltoallOptions().name(name).splits(splits).process_set(set_).timeout(
          Timeout(opts.timeout)));
  at::Tensor out = output;
  return Enqueue(
      c10d::OpType::ALLTOALL_BASE, name, {h}, [h, out, want, name]() mutable {
        at::Tensor got = h.wait();
        if (h.received_splits() != want) {
          Refuse(absl::StrCat(
              "alltoall_base \"", name, "\": this rank expected [",
              absl::StrJoin(want, ", "),
              "] rows from the ranks (output_split_sizes), [",
              absl::StrJoin(h.received_splits(), ", "), "] arrived"));
        }
        CopyInto(out, got, "alltoall_base");
        return std::vector<at::Tensor>{out};
      });
}

// The list form: inputs[k] goes to rank k, outputs[k] comes from it. Sent
// flattened, so that the tensors may have any shapes.
c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::alltoall(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllToAllOptions& opts) {
  CheckCount(inputs, getSize(), "alltoall", "the input list");
  CheckCount(outputs, getSize(), "alltoall", "the output list");
  std::vector<at::Tensor> flat;
  std::vector<int64_t> splits;
  std::vector<int64_t> want;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (inputs[k].scalar_type() != inputs[0].scalar_type()) {
      Refuse("alltoall: the input tensors must share one dtype");
    }
    flat.push_back(inputs[k].reshape({inputs[k].numel()}));
    splits.push_back(inputs[k].numel());
    want.push_back(outputs[k].numel());
  }
  const std::string name = NextName();
  Handle h = context_->alltoall_async(
      at::cat(flat),
      AlltoallOptions().name(name).splits(splits).process_set(set_).timeout(
          Timeout(opts.timeout)));
  std::vector<at::Tensor> out = outputs;
  return Enqueue(
      c10d::OpType::ALLTOALL, name, {h}, [h, out, want, name]() mutable {
        at::Tensor got = h.wait();
        if (h.received_splits() != want) {
          Refuse(absl::StrCat("alltoall \"", name,
                              "\": this rank's output tensors hold [",
                              absl::StrJoin(want, ", "), "] elements, [",
                              absl::StrJoin(h.received_splits(), ", "),
                              "] arrived from the ranks"));
        }
        int64_t at = 0;
        for (size_t k = 0; k < out.size(); ++k) {
          CopyInto(out[k], got.narrow(0, at, want[k]), "alltoall");
          at += want[k];
        }
        return out;
      });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::barrier(
    const c10d::BarrierOptions& opts) {
  const std::string name = NextName();
  // A barrier is a named collective like the others: a zero-element
  // allreduce, so that a rank that reached a different collective at this
  // position is named.
  at::Tensor token = at::zeros({0}, at::kByte);
  Handle h =
      context_->allreduce_async_(token, AllreduceOptions()
                                            .name(name)
                                            .op(kolo::ReduceOp::kSum)
                                            .process_set(set_)
                                            .timeout(Timeout(opts.timeout)));
  return Enqueue(c10d::OpType::BARRIER, name, {h}, [h] {
    h.wait();
    return std::vector<at::Tensor>{};
  });
}

void ProcessGroupKolo::monitoredBarrier(const c10d::BarrierOptions& opts,
                                        bool wait_all_ranks) {
  const std::chrono::milliseconds timeout = Timeout(opts.timeout);
  if (timeout.count() == 0 && getRank() == 0) {
    // kolo would read 0 as its default timeout; gloo's rank 0 gives up.
    Refuse("Rank 0 timed out in monitoredBarrier after 0 ms");
  }
  c10d::BarrierOptions options = opts;
  options.timeout = timeout;
  c10::intrusive_ptr<c10d::Work> work = barrier(options);
  try {
    work->wait();
    return;
  } catch (const std::exception& e) {
    const std::string text = e.what();
    if (getRank() != 0) {
      Refuse(absl::StrCat(
          "Rank ", getRank(),
          " successfully reached monitoredBarrier, but received errors "
          "while waiting for send/recv from rank 0: ",
          text));
    }
    std::vector<int> missing = MissingGroupRanks(text);
    if (missing.empty()) throw;
    if (!wait_all_ranks) missing.resize(1);
    Refuse(absl::StrCat(missing.size() == 1 ? "Rank " : "Ranks ",
                        absl::StrJoin(missing, ", "),
                        " failed to pass monitoredBarrier in ", timeout.count(),
                        " ms: ", text));
  }
}

// The group ranks that kolo's timeout error names as not having submitted
// ("waiting for rank 2 to submit it", "waiting for ranks 1, 2 ..."; job
// ranks, ascending), ascending; none if the error is another.
std::vector<int> ProcessGroupKolo::MissingGroupRanks(
    const std::string& error) const {
  const std::string marker = "waiting for rank";
  size_t at = error.find(marker);
  if (at == std::string::npos) return {};
  at += marker.size();
  if (at < error.size() && error[at] == 's') ++at;
  const size_t end = error.find(" to submit it", at);
  if (end == std::string::npos) return {};
  const std::vector<int> group_ranks = set_ == kGlobalProcessSet
                                           ? std::vector<int>()
                                           : context_->process_set_ranks(set_);
  std::vector<int> missing;
  for (absl::string_view part :
       absl::StrSplit(error.substr(at, end - at), ',')) {
    int job_rank = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &job_rank)) {
      continue;
    }
    if (group_ranks.empty()) {
      missing.push_back(job_rank);
      continue;
    }
    auto it = std::find(group_ranks.begin(), group_ranks.end(), job_rank);
    if (it != group_ranks.end()) missing.push_back(it - group_ranks.begin());
  }
  return missing;
}

void ProcessGroupKolo::ConnectPointToPoint(
    const c10::intrusive_ptr<c10d::Store>& store) {
  const kolo::Options& options = context_->runtime().options();
  point_to_point_ = PointToPoint::Connect(
      group_, getRank(), getSize(), store, options.shm, options.bind_addr,
      absl::ToChronoMilliseconds(options.start_timeout));
}

// The group's timeout for point-to-point: its own, else KOLO_OP_TIMEOUT.
std::chrono::milliseconds ProcessGroupKolo::PointToPointTimeout() const {
  return timeout_.count() > 0 ? timeout_
                              : absl::ToChronoMilliseconds(
                                    context_->runtime().options().op_timeout);
}

std::string ProcessGroupKolo::PointToPointTransport() const {
  return point_to_point_ ? point_to_point_->transport() : std::string();
}

PointToPoint& ProcessGroupKolo::Peers(const char* what) {
  if (!point_to_point_) {
    Refuse(absl::StrCat(what,
                        ": the group has no point-to-point connections "
                        "(it was not made by kolo.torch's backend creator)"));
  }
  return *point_to_point_;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::send(
    std::vector<at::Tensor>& tensors, int dst_rank, int tag) {
  return Peers("send").Send(One(tensors, "send"), dst_rank, tag,
                            PointToPointTimeout());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::recv(
    std::vector<at::Tensor>& tensors, int src_rank, int tag) {
  if (src_rank < 0) {
    Refuse(absl::StrCat("recv: source rank ", src_rank, " is not a rank"));
  }
  return Peers("recv").Recv(One(tensors, "recv"), src_rank, tag,
                            PointToPointTimeout());
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::recvAnysource(
    std::vector<at::Tensor>& tensors, int tag) {
  return Peers("recv").Recv(One(tensors, "recv"), -1, tag,
                            PointToPointTimeout());
}

}  // namespace torch
}  // namespace kolo
