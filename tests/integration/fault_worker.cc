// A worker for launcher integration tests: joins the job, then one rank
// misbehaves (exits with a code, or SIGKILLs itself) while the others wait in
// an allreduce that rank never submits. Survivors print the error they got
// and exit 0 if it names the faulty rank, 1 otherwise.
//
//   fault_worker --pid-dir DIR --fault-rank R --fault exit3|sigkill|stall
//                [--block-sigterm]
//
// With "stall" the faulty rank stays alive but never submits the allreduce
// (it waits in a barrier instead); every rank then prints the error it gets
// and exits 1, as a real training program would.
//
// --block-sigterm keeps survivors alive through the launcher's SIGTERM so
// that they can report (the launcher SIGKILLs them after its grace period).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "kolo/runtime.h"

int main(int argc, char** argv) {
  std::string pid_dir, fault;
  int fault_rank = -1;
  bool block_sigterm = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--pid-dir" && i + 1 < argc)
      pid_dir = argv[++i];
    else if (arg == "--fault-rank" && i + 1 < argc)
      fault_rank = std::atoi(argv[++i]);
    else if (arg == "--fault" && i + 1 < argc)
      fault = argv[++i];
    else if (arg == "--block-sigterm")
      block_sigterm = true;
    else {
      std::fprintf(stderr, "fault_worker: unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  if (block_sigterm) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigprocmask(SIG_BLOCK, &set, nullptr);
  }
  auto options = kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) {
    std::fprintf(stderr, "%s\n",
                 std::string(options.status().message()).c_str());
    return 1;
  }
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
  float data[16] = {0};
  kolo::AllreduceRequest req;
  req.name = "fault/victim";
  req.input = req.output =
      kolo::TensorView(data, kolo::DataType::kFloat32, {16});
  // Everybody first completes one allreduce, so the fault happens in a
  // running job.
  req.name = "fault/warmup";
  absl::Status s = (*rt)->Allreduce(req)->Wait();
  const std::string named = "rank " + std::to_string(fault_rank);
  if (!s.ok()) {
    // The faulty rank finished its part of the warm-up and failed while this
    // rank was still in it: the error must name it all the same.
    std::printf("rank %d error: %s\n", (*rt)->rank(),
                std::string(s.message()).c_str());
    std::fflush(stdout);
    (*rt)->Abort();
    return std::string(s.message()).find(named) != std::string::npos ? 0 : 1;
  }
  if (rank == fault_rank) {
    std::fflush(stdout);
    if (fault == "exit3") _exit(3);
    if (fault == "sigkill") raise(SIGKILL);
  }
  req.name = "fault/victim";
  if (fault == "stall") {
    auto work = rank == fault_rank ? (*rt)->Barrier() : (*rt)->Allreduce(req);
    s = work.ok() ? work->Wait() : work.status();
    std::printf("rank %d error: %s\n", rank, std::string(s.message()).c_str());
    std::fflush(stdout);
    (*rt)->Abort();
    return 1;
  }
  auto work = (*rt)->Allreduce(req);
  s = work.ok() ? work->Wait() : work.status();
  std::printf("rank %d error: %s\n", rank, std::string(s.message()).c_str());
  std::fflush(stdout);
  const bool ok =
      !s.ok() && std::string(s.message()).find(named) != std::string::npos;
  (*rt)->Abort();
  return ok ? 0 : 1;
}
