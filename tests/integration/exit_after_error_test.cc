// Note [Runtimes at exit] (runtime/api/exit_guard.h), with real processes: two
// workers started directly (rank 0 hosts the store), each returning 3 from
// main after a kolo error with its runtime still running. Heartbeats every
// few milliseconds keep the control plane's threads busy while exit() runs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace {

std::string g_worker;

// A port on loopback that was free a moment ago (bound to port 0, then
// released) for the store rank 0 hosts.
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string Describe(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

// Runs the two ranks once; returns how each ended.
std::vector<int> RunJob(const std::string& holder, int port) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 2; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::vector<std::string> env = {
          absl::StrCat("KOLO_RANK=", rank), "KOLO_SIZE=2", "KOLO_HOST_STORE=1",
          absl::StrCat("KOLO_RENDEZVOUS_PORT=", port),
          "KOLO_SECRET=exit-after-error-test-secret",
          // Heartbeats every ~12 ms: the control plane's threads send and
          // read MAC'd frames while the process exits.
          "KOLO_OP_TIMEOUT=0.1", "KOLO_START_TIMEOUT=20",
          // The control channel over TCP, MAC'd frame by frame.
          "KOLO_SHM=0", "KOLO_LOG_LEVEL=fatal"};
      for (const std::string& e : env) putenv(strdup(e.c_str()));
      execl(g_worker.c_str(), g_worker.c_str(), holder.c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    pids.push_back(pid);
  }
  std::vector<int> statuses;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    statuses.push_back(status);
  }
  return statuses;
}

void ExpectOwnExitCode(const std::string& holder, int runs) {
  for (int run = 0; run < runs; ++run) {
    const std::vector<int> statuses = RunJob(holder, FreePort());
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(WIFEXITED(statuses[rank]) && WEXITSTATUS(statuses[rank]) == 3)
          << holder << " runtime, run " << run << ": rank " << rank << " "
          << Describe(statuses[rank]) << ", expected its own exit code 3";
    }
  }
}

TEST(ExitAfterError, LeakedRuntimeExitsWithItsOwnCode) {
  ExpectOwnExitCode("leaked", 15);
}

TEST(ExitAfterError, StaticRuntimeExitsWithItsOwnCode) {
  ExpectOwnExitCode("static", 10);
}

TEST(ExitAfterError, LocalRuntimeExitsWithItsOwnCode) {
  ExpectOwnExitCode("local", 5);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    fprintf(stderr, "usage: exit_after_error_test EXIT_WORKER\n");
    return 2;
  }
  g_worker = argv[1];
  return RUN_ALL_TESTS();
}
