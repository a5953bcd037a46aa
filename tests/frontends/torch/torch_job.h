// N ranks of kolo::torch as threads of one process: one Context per rank
// over the Runtimes of tests/testing/local_job.h (in-memory store, loopback).
#ifndef KOLO_TESTS_FRONTENDS_TORCH_TORCH_JOB_H_
#define KOLO_TESTS_FRONTENDS_TORCH_TORCH_JOB_H_

#include <ATen/Parallel.h>

#include <exception>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kolo/torch/context.h"
#include "tests/testing/local_job.h"

namespace kolo {
namespace torch {
namespace testing {

using Contexts = std::vector<std::shared_ptr<Context>>;

// Starts a job of `size` ranks; `tweak` may adjust each rank's Options.
inline Contexts StartContexts(
    int size, std::function<void(kolo::Options&)> tweak = nullptr) {
  // Ranks are threads here: one intra-op thread each keeps 2 cores sane.
  at::set_num_threads(1);
  auto runtimes = kolo::testing::StartJob(size, std::move(tweak));
  Contexts contexts;
  for (auto& runtime : runtimes) {
    if (!runtime) return {};
    contexts.push_back(std::make_shared<Context>(
        std::shared_ptr<kolo::Runtime>(std::move(runtime))));
  }
  return contexts;
}

// Runs body(rank) on one thread per rank; an exception escaping a rank is a
// test failure (naming the rank), not a crash.
inline void OnEachRank(int size, const std::function<void(int)>& body) {
  kolo::testing::OnEachRank(size, [&](int rank) {
    try {
      body(rank);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << " threw: " << e.what();
    }
  });
}

// Shuts every context down concurrently (shutdown is collective).
inline void ShutdownContexts(Contexts& contexts) {
  OnEachRank(static_cast<int>(contexts.size()),
             [&](int rank) { contexts[rank]->shutdown(absl::Seconds(30)); });
}

}  // namespace testing
}  // namespace torch
}  // namespace kolo

#endif  // KOLO_TESTS_FRONTENDS_TORCH_TORCH_JOB_H_
