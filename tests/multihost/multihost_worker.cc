// A worker for the multi-host and launcher tests (run_tests.py): reports
// where it runs and what it was told, joins the job, optionally waits for
// the harness, then allreduces and checks the result exactly.
//
//   multihost_worker [--pid-dir DIR] [--hold DIR] [--bytes N] [--loop]
//                    [--survive-peer-loss] [--print-env NAME]...
//
// Output, one line each, in order:
//   placement rank=R size=S local=L/LS cross=C/CS source=SRC bind=ADDR
//       store=ADDR:PORT host_store=0|1 secret_bytes=N insecure=0|1
//   env NAME=value            (for each --print-env NAME; "unset" if unset)
//   joined rank=R             (the runtime has rendezvoused)
//   allreduce ok rank=R bytes=N
//   looping rank=R            (--loop: after the first loop allreduce)
//   done rank=R
// --pid-dir DIR: writes the pid to DIR/<rank> (atomically) before joining.
// --hold DIR: after joining, blocks reading one byte from the FIFO
//   DIR/go.<rank> (the harness inspects the running job meanwhile).
// --loop: allreduces 64 KiB over and over until an error; with
//   --survive-peer-loss an Unavailable error (a lost rank) exits 0 after
//   printing "peer lost rank=R: <message>".
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kolo/runtime.h"

namespace {

struct Flags {
  std::string pid_dir;
  std::string hold_dir;
  long bytes = 1 << 20;
  bool loop = false;
  bool survive_peer_loss = false;
  std::vector<std::string> print_env;
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--pid-dir" && has_value) {
      flags->pid_dir = argv[++i];
    } else if (arg == "--hold" && has_value) {
      flags->hold_dir = argv[++i];
    } else if (arg == "--bytes" && has_value) {
      char* end = nullptr;
      flags->bytes = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || flags->bytes < 4 || flags->bytes % 4 != 0) {
        return false;
      }
    } else if (arg == "--print-env" && has_value) {
      flags->print_env.push_back(argv[++i]);
    } else if (arg == "--loop") {
      flags->loop = true;
    } else if (arg == "--survive-peer-loss") {
      flags->survive_peer_loss = true;
    } else {
      std::fprintf(stderr, "multihost_worker: bad argument %s\n", arg.c_str());
      return false;
    }
  }
  return true;
}

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "multihost_worker: %s: %s\n", what.c_str(),
               std::string(status.message()).c_str());
  return 1;
}

void WritePid(const std::string& dir, int rank) {
  const std::string path = dir + "/" + std::to_string(rank);
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::fprintf(f, "%d\n", static_cast<int>(getpid()));
  std::fclose(f);
  std::rename(tmp.c_str(), path.c_str());
}

bool Hold(const std::string& dir, int rank) {
  const std::string path = dir + "/go." + std::to_string(rank);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char byte;
  const bool ok = read(fd, &byte, 1) == 1;
  close(fd);
  return ok;
}

// Allreduce-sums `floats` copies of rank+1; every element must be
// size*(size+1)/2 on every rank.
absl::Status SumAndCheck(kolo::Runtime& rt, const std::string& name,
                         size_t floats) {
  std::vector<float> data(floats, static_cast<float>(rt.rank() + 1));
  kolo::AllreduceRequest req;
  req.name = name;
  req.op = kolo::ReduceOp::kSum;
  req.input = req.output = kolo::TensorView(
      data.data(), kolo::DataType::kFloat32, {static_cast<int64_t>(floats)});
  absl::StatusOr<kolo::Work> work = rt.Allreduce(req);
  if (!work.ok()) return work.status();
  if (absl::Status s = work->Wait(); !s.ok()) return s;
  const float want = rt.size() * (rt.size() + 1) / 2.0f;
  for (size_t i = 0; i < floats; ++i) {
    if (data[i] != want) {
      return absl::InternalError(name + ": element " + std::to_string(i) +
                                 " is " + std::to_string(data[i]) +
                                 ", expected " + std::to_string(want));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  absl::StatusOr<kolo::Options> options =
      kolo::Runtime::OptionsFromEnvironment();
  if (!options.ok()) return Fail("options", options.status());
  const kolo::Options& o = *options;
  std::printf(
      "placement rank=%d size=%d local=%d/%d cross=%d/%d source=%s bind=%s "
      "store=%s:%d host_store=%d secret_bytes=%zu insecure=%d\n",
      o.rank, o.size, o.local_rank, o.local_size, o.cross_rank, o.cross_size,
      o.placement_source.empty() ? "none" : o.placement_source.c_str(),
      o.bind_addr.c_str(), o.rendezvous_addr.c_str(), o.rendezvous_port,
      o.host_store ? 1 : 0, o.secret.size(), o.insecure_no_secret ? 1 : 0);
  for (const std::string& name : flags.print_env) {
    const char* value = std::getenv(name.c_str());
    std::printf("env %s=%s\n", name.c_str(), value ? value : "unset");
  }
  std::fflush(stdout);
  if (!flags.pid_dir.empty()) WritePid(flags.pid_dir, o.rank);

  absl::StatusOr<std::unique_ptr<kolo::Runtime>> created =
      kolo::Runtime::Create(o);
  if (!created.ok()) return Fail("join", created.status());
  kolo::Runtime& rt = **created;
  std::printf("joined rank=%d\n", rt.rank());
  std::fflush(stdout);

  if (!flags.hold_dir.empty() && !Hold(flags.hold_dir, rt.rank())) {
    std::fprintf(stderr, "multihost_worker: cannot read %s/go.%d\n",
                 flags.hold_dir.c_str(), rt.rank());
    return 1;
  }
  if (absl::Status s = SumAndCheck(rt, "multihost/payload", flags.bytes / 4);
      !s.ok()) {
    return Fail("allreduce", s);
  }
  std::printf("allreduce ok rank=%d bytes=%ld\n", rt.rank(), flags.bytes);
  std::fflush(stdout);

  for (long step = 0; flags.loop; ++step) {
    absl::Status s =
        SumAndCheck(rt, "multihost/loop" + std::to_string(step % 2), 16384);
    if (!s.ok()) {
      if (flags.survive_peer_loss && absl::IsUnavailable(s)) {
        std::printf("peer lost rank=%d: %s\n", rt.rank(),
                    std::string(s.message()).c_str());
        std::fflush(stdout);
        rt.Abort();
        return 0;
      }
      return Fail("loop allreduce", s);
    }
    if (step == 0) {
      std::printf("looping rank=%d\n", rt.rank());
      std::fflush(stdout);
    }
  }
  if (absl::Status s = rt.Shutdown(); !s.ok()) return Fail("shutdown", s);
  std::printf("done rank=%d\n", rt.rank());
  return 0;
}
