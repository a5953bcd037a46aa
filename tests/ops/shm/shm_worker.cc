// A worker for the shm crash test: every rank runs 16 MB allreduces in a
// loop; the fault rank SIGKILLs itself a few milliseconds into the run, most
// likely while its peers wait for it in shared memory. Survivors print the
// error they got and exit 0 if it names the fault rank, 1 otherwise.
//
//   shm_worker --pid-dir DIR --fault-rank R
//
// Links //ops/shm itself, so it uses shared memory whatever //:kolo holds.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kolo/runtime.h"

int main(int argc, char** argv) {
  std::string pid_dir;
  int fault_rank = -1;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--pid-dir" && i + 1 < argc)
      pid_dir = argv[++i];
    else if (arg == "--fault-rank" && i + 1 < argc)
      fault_rank = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "shm_worker: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  // Survivors must live long enough to report (the launcher SIGKILLs them
  // after its grace period).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigprocmask(SIG_BLOCK, &set, nullptr);

  auto options = kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) return 1;
  if (!pid_dir.empty()) {
    std::ofstream(pid_dir + "/" + std::to_string(options->rank))
        << getpid() << "\n";
  }
  auto rt = kolo::Runtime::Create(*options);
  if (!rt.ok()) {
    std::fprintf(stderr, "%s\n", std::string(rt.status().message()).c_str());
    return 1;
  }
  const int rank = (*rt)->rank();
  std::vector<float> data(4 << 20, 1.0f);
  std::atomic<int> done{0};
  std::thread killer;
  if (rank == fault_rank) {
    killer = std::thread([&] {
      // Fault injection, not synchronisation: once the loop runs, die at a
      // moment that lands inside a collective more often than not.
      while (done.load() < 3) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      raise(SIGKILL);
    });
  }
  absl::Status s;
  for (int i = 0; i < 100000 && s.ok(); ++i) {
    kolo::AllreduceRequest req;
    req.name = "shm_worker/loop";
    req.input = req.output =
        kolo::TensorView(data.data(), kolo::DataType::kFloat32,
                         {static_cast<int64_t>(data.size())});
    auto work = (*rt)->Allreduce(req);
    s = work.ok() ? work->Wait() : work.status();
    ++done;
  }
  std::printf("rank %d error: %s\n", rank, std::string(s.message()).c_str());
  std::fflush(stdout);
  const std::string named = "rank " + std::to_string(fault_rank);
  const bool ok =
      !s.ok() && std::string(s.message()).find(named) != std::string::npos;
  (*rt)->Abort();
  if (killer.joinable()) killer.detach();
  _exit(ok ? 0 : 1);
}
