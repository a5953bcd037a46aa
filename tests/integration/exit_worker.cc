// A worker that returns from main after a kolo error, without shutting its
// runtime down (Note [Runtimes at exit] in runtime/api/exit_guard.h): the
// process must end with its own exit code, 3, never a crash from a kolo
// thread still running while exit() tears the process down.
//
//   exit_worker leaked|static|local
// leaked: the runtime is held as the frontends hold their default instance
// (never destroyed); static: by a global destroyed at exit; local: by main.
// Every rank submits "exit/mismatch" with a shape of its own, so every rank
// gets an InvalidArgument error naming the shapes.
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/runtime.h"

// Held as the frontends hold their default instance: never destroyed, but
// reachable from a global (leak checkers see them held).
kolo::Runtime* g_leaked_runtime = nullptr;
std::vector<float>* g_busy_buffer = nullptr;
// The busy thread calls into the Runtime object only under this lock, and
// not once main is returning: a static or local holder destroys that object
// as main returns, and calling an object's methods while another thread
// destroys it is a use after free whatever the object. Its collectives stay
// in flight, and the thread in Work::Wait, while the process exits.
std::mutex* g_submit_mu = new std::mutex;
bool g_main_returning = false;

namespace {

std::unique_ptr<kolo::Runtime> g_static_runtime;

}  // namespace

int main(int argc, char** argv) {
  const std::string holder = argc > 1 ? argv[1] : "leaked";
  auto options = kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "options: %s\n",
                 std::string(options.status().message()).c_str());
    return 1;
  }
  auto created = kolo::Runtime::Create(*options);
  if (!created.ok()) {
    std::fprintf(stderr, "init: %s\n",
                 std::string(created.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<kolo::Runtime> local;
  kolo::Runtime* runtime = created->get();
  if (holder == "leaked") {
    g_leaked_runtime = created->release();
  } else if (holder == "static") {
    g_static_runtime = std::move(*created);
  } else {
    local = std::move(*created);
  }
  // Keeps the control channel busy (request and response lists, every one
  // MAC'd) while main returns.
  // Never freed: after a failure the backend may still read a buffer of
  // the collective in flight (RuntimeImpl::Fatal).
  g_busy_buffer = new std::vector<float>(16, 1.0f);
  std::thread([runtime] {
    std::vector<float>& busy = *g_busy_buffer;
    for (;;) {
      kolo::AllreduceRequest r;
      r.name = "exit/busy";
      r.input = r.output =
          kolo::TensorView(busy.data(), kolo::DataType::kFloat32, {16});
      absl::StatusOr<kolo::Work> w;
      {
        std::lock_guard<std::mutex> lock(*g_submit_mu);
        if (g_main_returning) return;
        w = runtime->Allreduce(r);
      }
      if (!w.ok() || !w->Wait().ok()) return;
    }
  }).detach();
  std::vector<float> data(options->rank + 1, 1.0f);
  kolo::AllreduceRequest request;
  request.name = "exit/mismatch";
  request.input = request.output =
      kolo::TensorView(data.data(), kolo::DataType::kFloat32,
                       {static_cast<int64_t>(data.size())});
  auto work = runtime->Allreduce(request);
  const absl::Status status = work.ok() ? work->Wait() : work.status();
  std::printf("rank %d: %s\n", options->rank, status.ToString().c_str());
  std::fflush(stdout);
  {
    std::lock_guard<std::mutex> lock(*g_submit_mu);
    g_main_returning = true;
  }
  return status.ok() ? 1 : 3;
}
