// A worker for the launcher integration test of the Horovod-parity
// collectives in real processes: alltoall, reducescatter, a grouped
// allreduce, a process set, a barrier, and Join with uneven steps (the last
// rank stops after 5 steps, the others after 8). Prints
// "PARITY OK rank R join last J" on success, the first problem otherwise.
#include <cstdio>
#include <string>
#include <vector>

#include "kolo/runtime.h"

namespace {

int Fail(const std::string& what) {
  std::printf("PARITY FAILED: %s\n", what.c_str());
  return 1;
}

bool Run(kolo::Runtime& rt, absl::StatusOr<kolo::Work> work,
         std::string* error) {
  absl::Status s = work.ok() ? work->Wait(absl::Seconds(60)) : work.status();
  if (!s.ok()) *error = std::string(s.message());
  return s.ok();
}

}  // namespace

int main() {
  auto options = kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) return Fail(std::string(options.status().message()));
  auto created = kolo::Runtime::Create(*options);
  if (!created.ok()) return Fail(std::string(created.status().message()));
  kolo::Runtime& rt = **created;
  const int rank = rt.rank(), n = rt.size();
  std::string error;

  // Alltoall: one row to every rank, holding sender and receiver.
  std::vector<float> in(n), out;
  for (int k = 0; k < n; ++k) in[k] = 10 * rank + k;
  kolo::AlltoallRequest a2a;
  a2a.name = "a2a";
  a2a.input = kolo::TensorView(in.data(), kolo::DataType::kFloat32, {n});
  a2a.allocator =
      [&out](const std::vector<int64_t>& shape) -> absl::StatusOr<void*> {
    out.resize(shape[0]);
    return static_cast<void*>(out.data());
  };
  if (!Run(rt, rt.Alltoall(a2a), &error)) return Fail(error);
  for (int k = 0; k < n; ++k) {
    if (out[k] != 10 * k + rank) return Fail("alltoall result");
  }

  // Reducescatter of n + 1 rows: rank 0 gets two.
  std::vector<double> rs_in(n + 1, rank + 1.0);
  std::vector<int64_t> shape = kolo::ReducescatterShape({n + 1}, n, rank);
  std::vector<double> rs_out(shape[0]);
  kolo::ReducescatterRequest rs;
  rs.name = "rs";
  rs.input = kolo::TensorView(rs_in.data(), kolo::DataType::kFloat64, {n + 1});
  rs.output = kolo::TensorView(rs_out.data(), kolo::DataType::kFloat64, shape);
  if (!Run(rt, rt.Reducescatter(rs), &error)) return Fail(error);
  for (double v : rs_out) {
    if (v != n * (n + 1) / 2.0) return Fail("reducescatter result");
  }

  // A grouped allreduce inside a process set of the even ranks.
  std::vector<int> evens;
  for (int r = 0; r < n; r += 2) evens.push_back(r);
  auto set = rt.AddProcessSet(evens);
  if (!set.ok()) return Fail(std::string(set.status().message()));
  if (rank % 2 == 0) {
    std::vector<int32_t> x(3, 1), y(2, rank);
    std::vector<kolo::AllreduceRequest> group(2);
    group[0].name = "g/x";
    group[0].process_set = *set;
    group[0].input = group[0].output =
        kolo::TensorView(x.data(), kolo::DataType::kInt32, {3});
    group[1].name = "g/y";
    group[1].process_set = *set;
    group[1].input = group[1].output =
        kolo::TensorView(y.data(), kolo::DataType::kInt32, {2});
    if (!Run(rt, rt.GroupedAllreduce(group), &error)) return Fail(error);
    int even_sum = 0;
    for (int r : evens) even_sum += r;
    if (x[0] != static_cast<int>(evens.size()) || y[1] != even_sum) {
      return Fail("grouped allreduce in a process set");
    }
  }
  if (!Run(rt, rt.Barrier(), &error)) return Fail(error);

  // Uneven data: the last rank has 5 batches, the others 8.
  const int steps = rank == n - 1 ? 5 : 8;
  for (int step = 0; step < steps; ++step) {
    float v = rank + 1.0f;
    kolo::AllreduceRequest req;
    req.name = "step" + std::to_string(step);
    req.op = kolo::ReduceOp::kAverage;
    req.input = req.output =
        kolo::TensorView(&v, kolo::DataType::kFloat32, {1});
    if (!Run(rt, rt.Allreduce(req), &error)) return Fail(error);
    const bool joined = step >= 5 && n > 1;
    const float want = joined ? ((n - 1) * n / 2.0f) / (n - 1) : (n + 1) / 2.0f;
    if (v != want) return Fail("average while a rank has joined");
  }
  auto last = rt.Join();
  if (!last.ok()) return Fail(std::string(last.status().message()));
  absl::Status s = rt.Shutdown();
  if (!s.ok()) return Fail(std::string(s.message()));
  std::printf("PARITY OK rank %d join last %d\n", rank, *last);
  return 0;
}
