// The worker of the reliability suite (RELIABILITY.md): one mode per fault.
// Every line it prints that the harness reads carries the monotonic clock,
// "t=<ns>", so that the harness can measure detection times against the
// moment it injected a fault.
//
//   reliability_worker MODE [--pid-dir DIR] [--mb N] [--exit-rank R]
//
// Modes:
//   loop       allreduce N MB of float32 forever, printing progress; any
//              error is printed and ends the process with 1
//   mismatch   each kind of mismatch between ranks, then a matching op
//   stall      rank 0, 2, 3 submit A and B, rank 1 only B
//   duplicate  a second in-flight use of a name, then the first completes
//   join       the last rank joins after 5 steps, the others do 8
//   early-exit rank --exit-rank exits 3 before joining the job
//   slow       every rank does 2 allreduces; rank 1 sleeps 8 s before each
//   hostile    rank 0 prints its ports and waits for a line on the FIFO
//              --fifo while the harness attacks them; then every rank
//              checks one allreduce
//   idle       joins, prints READY and waits for the job to fail
//   shutdown   one allreduce, then every rank but --exit-rank calls
//              Shutdown(--shutdown-timeout seconds) and prints its result;
//              rank --exit-rank never shuts down
//   report     rank --exit-rank exits --exit-code after one allreduce; the
//              others print the error of their next allreduce and exit 1
// --exit-code N: the code of early-exit's rank (default 3).
//   until      rank 0 prints the store's port ("STORE port=P"); every rank
//              allreduces with exact results until the harness creates
//              --stop-file (rank 0 looks, and its decision travels in the
//              allreduce itself, so all stop together), or for 120 s
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "kolo/runtime.h"
#include "kolo/store.h"
#include "runtime/rendezvous/tcp_store.h"

namespace {

int64_t Now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void Say(const std::string& line) {
  std::printf("%s t=%lld\n", line.c_str(), static_cast<long long>(Now()));
  std::fflush(stdout);
}

int Error(int rank, const absl::Status& s) {
  Say("ERROR rank " + std::to_string(rank) +
      " code=" + std::string(absl::StatusCodeToString(s.code())) +
      " msg=" + std::string(s.message()));
  return 1;
}

absl::Status Allreduce(kolo::Runtime& rt, const std::string& name,
                       std::vector<float>& data,
                       kolo::ReduceOp op = kolo::ReduceOp::kSum) {
  kolo::AllreduceRequest req;
  req.name = name;
  req.op = op;
  req.input = req.output =
      kolo::TensorView(data.data(), kolo::DataType::kFloat32,
                       {static_cast<int64_t>(data.size())});
  auto w = rt.Allreduce(req);
  return w.ok() ? w->Wait() : w.status();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: %s MODE [--pid-dir DIR] [--mb N] [--exit-rank R]\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  std::string pid_dir, fifo, stop_file;
  int mb = 64, exit_rank = -1, exit_code = 3;
  double shutdown_timeout = 5;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string arg = argv[i];
    if (arg == "--pid-dir")
      pid_dir = argv[i + 1];
    else if (arg == "--mb")
      mb = std::atoi(argv[i + 1]);
    else if (arg == "--exit-rank")
      exit_rank = std::atoi(argv[i + 1]);
    else if (arg == "--fifo")
      fifo = argv[i + 1];
    else if (arg == "--exit-code")
      exit_code = std::atoi(argv[i + 1]);
    else if (arg == "--shutdown-timeout")
      shutdown_timeout = std::atof(argv[i + 1]);
    else if (arg == "--stop-file")
      stop_file = argv[i + 1];
    else if (arg == "--ignore-sigterm") {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGTERM);
      sigprocmask(SIG_BLOCK, &set, nullptr);
    }
  }
  auto options = kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) {
    Say("INIT-ERROR " + std::string(options.status().message()));
    return 1;
  }
  const int rank = options->rank;
  if (!pid_dir.empty()) {
    std::ofstream(pid_dir + "/" + std::to_string(rank)) << getpid() << "\n";
  }
  if (mode == "early-exit" && rank == exit_rank) return exit_code;
  auto created = kolo::Runtime::Create(*options);
  if (!created.ok()) {
    Say("INIT-ERROR rank " + std::to_string(rank) + " " +
        std::string(created.status().message()));
    return 1;
  }
  kolo::Runtime& rt = **created;
  const int n = rt.size();
  Say("READY rank " + std::to_string(rank));

  if (mode == "loop") {
    std::vector<float> data(static_cast<size_t>(mb) * (1 << 20) / 4, 1.0f);
    for (int64_t it = 0;; ++it) {
      std::fill(data.begin(), data.end(), 1.0f);
      absl::Status s = Allreduce(rt, "loop", data);
      if (!s.ok()) return Error(rank, s);
      if (data[0] != n || data.back() != n) {
        Say("WRONG rank " + std::to_string(rank));
        return 1;
      }
      Say("LOOP rank " + std::to_string(rank) + " iter " + std::to_string(it));
    }
  }
  if (mode == "until") {
    if (rank == 0) {
      Say("STORE port=" + std::to_string(options->rendezvous_port));
    }
    const int64_t start = Now();
    constexpr size_t kValues = 1 << 14;
    std::vector<float> v(kValues + 1);  // the values, then rank 0's "stop"
    int64_t iterations = 0;
    for (bool stop = false; !stop; ++iterations) {
      std::fill(v.begin(), v.end() - 1, rank + 1.0f);
      v.back() = rank == 0 && (access(stop_file.c_str(), F_OK) == 0 ||
                               Now() - start > 120'000'000'000LL)
                     ? 1.0f
                     : 0.0f;
      absl::Status s = Allreduce(rt, "until", v);
      if (!s.ok()) return Error(rank, s);
      for (size_t i = 0; i < kValues; ++i) {
        if (v[i] != n * (n + 1) / 2.0f) {
          Say("WRONG rank " + std::to_string(rank) + " iteration " +
              std::to_string(iterations));
          return 1;
        }
      }
      stop = v.back() > 0;
    }
    Say("EXACT rank " + std::to_string(rank) + " iterations " +
        std::to_string(iterations));
    return rt.Shutdown().ok() ? 0 : 1;
  }
  if (mode == "idle") {
    // Names no other rank submits: waits until the job ends or times out.
    std::vector<float> v(4);
    return Error(rank, Allreduce(rt, "idle/" + std::to_string(rank), v));
  }
  if (mode == "mismatch") {
    std::vector<float> d(18 * 18 * 18, 1.0f);
    auto report = [&](const char* what, absl::Status s) {
      Say(std::string("MISMATCH ") + what + " rank " + std::to_string(rank) +
          " code=" + std::string(absl::StatusCodeToString(s.code())) +
          " msg=" + std::string(s.message()));
    };
    // Shape: rank 1 differs.
    {
      kolo::AllreduceRequest req;
      req.name = "shape";
      const int64_t dim = rank == 1 ? 18 : 17;
      req.input = req.output =
          kolo::TensorView(d.data(), kolo::DataType::kFloat32, {dim, dim, dim});
      auto w = rt.Allreduce(req);
      report("shape", w.ok() ? w->Wait() : w.status());
    }
    // Dtype, op, scale: rank 1 differs.
    {
      kolo::AllreduceRequest req;
      req.name = "dtype";
      req.input = req.output = kolo::TensorView(
          d.data(),
          rank == 1 ? kolo::DataType::kInt32 : kolo::DataType::kFloat32, {4});
      auto w = rt.Allreduce(req);
      report("dtype", w.ok() ? w->Wait() : w.status());
      req.name = "op";
      req.input = req.output =
          kolo::TensorView(d.data(), kolo::DataType::kFloat32, {4});
      req.op = rank == 1 ? kolo::ReduceOp::kMax : kolo::ReduceOp::kSum;
      w = rt.Allreduce(req);
      report("op", w.ok() ? w->Wait() : w.status());
      req.name = "scale";
      req.op = kolo::ReduceOp::kSum;
      req.postscale = rank == 1 ? 0.5 : 1.0;
      w = rt.Allreduce(req);
      report("scale", w.ok() ? w->Wait() : w.status());
    }
    // Broadcast root: rank 1 names itself.
    {
      kolo::BroadcastRequest b;
      b.name = "root";
      b.root = rank == 1 ? 1 : 0;
      b.tensor = kolo::TensorView(d.data(), kolo::DataType::kFloat32, {4});
      auto w = rt.Broadcast(b);
      report("root", w.ok() ? w->Wait() : w.status());
      b.name = "root-range";
      b.root = n;  // not a member: refused in negotiation, on every rank
      w = rt.Broadcast(b);
      report("root-range", w.ok() ? w->Wait() : w.status());
    }
    std::vector<float> ok(8, 1.0f);
    absl::Status s = Allreduce(rt, "after", ok);
    if (!s.ok() || ok[0] != n) return Error(rank, s);
    Say("MATCHING OK rank " + std::to_string(rank));
    return rt.Shutdown().ok() ? 0 : 1;
  }
  if (mode == "stall") {
    std::vector<float> a(4, 1.0f), b(4, 1.0f);
    kolo::AllreduceRequest ra, rb;
    ra.name = "A";
    ra.input = ra.output =
        kolo::TensorView(a.data(), kolo::DataType::kFloat32, {4});
    rb.name = "B";
    rb.input = rb.output =
        kolo::TensorView(b.data(), kolo::DataType::kFloat32, {4});
    absl::StatusOr<kolo::Work> wa = absl::UnknownError("not submitted");
    if (rank != 1) wa = rt.Allreduce(ra);
    auto wb = rt.Allreduce(rb);
    Say("SUBMITTED rank " + std::to_string(rank));
    absl::Status sb = wb.ok() ? wb->Wait() : wb.status();
    absl::Status s =
        rank != 1 ? (wa.ok() ? wa->Wait() : wa.status()) : rt.Barrier()->Wait();
    if (!sb.ok()) return Error(rank, sb);
    return Error(rank, s);
  }
  if (mode == "duplicate") {
    // The last rank holds back its "dup" until the others have tried the
    // duplicate (the "gate" allreduce), so "dup" is surely in flight then.
    std::vector<float> first(4, rank + 1.0f), second(4, 100.0f), gate(1, 0.0f);
    kolo::AllreduceRequest req;
    req.name = "dup";
    req.input = req.output =
        kolo::TensorView(first.data(), kolo::DataType::kFloat32, {4});
    absl::StatusOr<kolo::Work> w1 = absl::UnknownError("not submitted");
    if (rank != n - 1) {
      w1 = rt.Allreduce(req);
      req.input = req.output =
          kolo::TensorView(second.data(), kolo::DataType::kFloat32, {4});
      const int64_t t0 = Now();
      auto w2 = rt.Allreduce(req);
      const int64_t took = Now() - t0;
      Say("DUPLICATE rank " + std::to_string(rank) +
          " ok=" + std::to_string(w2.ok()) + " ns=" + std::to_string(took) +
          " msg=" + std::string(w2.status().message()));
    }
    absl::Status s = Allreduce(rt, "gate", gate);
    if (!s.ok()) return Error(rank, s);
    if (rank == n - 1) w1 = rt.Allreduce(req);
    s = w1.ok() ? w1->Wait() : w1.status();
    if (!s.ok()) return Error(rank, s);
    if (first[0] != n * (n + 1) / 2.0f || second[0] != 100.0f) return 1;
    Say("FIRST OK rank " + std::to_string(rank));
    return rt.Shutdown().ok() ? 0 : 1;
  }
  if (mode == "join") {
    const int steps = rank == n - 1 ? 5 : 8;
    for (int step = 0; step < steps; ++step) {
      std::vector<float> v(2, rank + 1.0f);
      absl::Status s = Allreduce(rt, "step" + std::to_string(step), v,
                                 kolo::ReduceOp::kAverage);
      if (!s.ok()) return Error(rank, s);
      const bool joined = step >= 5;
      const float want = joined ? (n - 1) / 2.0f * n / (n - 1) : (n + 1) / 2.0f;
      if (v[0] != want) {
        Say("WRONG rank " + std::to_string(rank) + " step " +
            std::to_string(step));
        return 1;
      }
    }
    auto last = rt.Join();
    if (!last.ok()) return Error(rank, last.status());
    Say("JOINED rank " + std::to_string(rank) + " last " +
        std::to_string(*last));
    return rt.Shutdown().ok() ? 0 : 1;
  }
  if (mode == "slow") {
    for (int op = 0; op < 2; ++op) {
      if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(8));
      std::vector<float> v(1024, 1.0f);
      absl::Status s = Allreduce(rt, "slow" + std::to_string(op), v);
      if (!s.ok()) return Error(rank, s);
      if (v[0] != n) return 1;
    }
    Say("SLOW OK rank " + std::to_string(rank));
    return rt.Shutdown().ok() ? 0 : 1;
  }
  if (mode == "shutdown" || mode == "report") {
    std::vector<float> v(1024, 1.0f);
    absl::Status s = Allreduce(rt, "before", v);
    if (!s.ok()) return Error(rank, s);
    if (rank == exit_rank) {
      if (mode == "report") return exit_code;
      Say("IDLE rank " + std::to_string(rank));
      for (;;) pause();
    }
    if (mode == "report") {
      s = Allreduce(rt, "after", v);
      return s.ok() ? 0 : Error(rank, s);
    }
    s = rt.Shutdown(absl::Seconds(shutdown_timeout));
    if (!s.ok()) return Error(rank, s);
    Say("SHUTDOWN OK rank " + std::to_string(rank));
    return 0;
  }
  if (mode == "hostile") {
    if (rank == 0) {
      // The harness attacks kolo's two ports: the store and the control
      // channel (whose address is in the store).
      auto store = kolo::rendezvous::ConnectTcpStore(
          options->rendezvous_addr, options->rendezvous_port, options->secret,
          absl::Seconds(10));
      if (!store.ok()) return Error(rank, store.status());
      auto control = (*store)->Get("kolo/control/address", absl::Seconds(10));
      if (!control.ok()) return Error(rank, control.status());
      Say("PORTS store=" + std::to_string(options->rendezvous_port) +
          " control=" + control->substr(control->rfind(':') + 1));
      std::string go;
      std::ifstream in(fifo);  // blocks until the harness is done attacking
      std::getline(in, go);
    }
    std::vector<float> v(1 << 16, rank + 1.0f);
    absl::Status s = Allreduce(rt, "after-attack", v);
    if (!s.ok()) return Error(rank, s);
    for (float x : v) {
      if (x != n * (n + 1) / 2.0f) return 1;
    }
    Say("EXACT rank " + std::to_string(rank));
    return rt.Shutdown().ok() ? 0 : 1;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
