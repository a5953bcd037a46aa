// The fixture of the reliability suites (RELIABILITY.md): launches a job of
// reliability_worker ranks through kolorun and checks that nothing of it is
// left behind.
#ifndef KOLO_TESTS_RELIABILITY_FIXTURE_H_
#define KOLO_TESTS_RELIABILITY_FIXTURE_H_

#include <signal.h>
#include <stdlib.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/reliability/job.h"

namespace kolo {
namespace testing {

// Set by each suite's main from its arguments.
inline std::string g_kolorun, g_worker;

inline const std::vector<std::string> kDefaults = {"KOLO_OP_TIMEOUT=10",
                                                   "KOLO_START_TIMEOUT=10"};

class Reliability : public ::testing::Test {
 protected:
  void SetUp() override {
    sockets_before_ = ListeningSockets();
    shm_before_ = ShmEntries();
    std::string tmpl =
        std::string(getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp") +
        "/kolo_rel_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
  }

  std::unique_ptr<Job> Launch(int np,
                              const std::vector<std::string>& worker_args,
                              std::vector<std::string> env = {},
                              std::vector<std::string> launcher_flags = {}) {
    std::vector<std::string> command = {g_worker};
    command.insert(command.end(), worker_args.begin(), worker_args.end());
    command.push_back("--pid-dir");
    command.push_back(dir_);
    return LaunchCommand(np, command, std::move(env),
                         std::move(launcher_flags));
  }

  // kolorun -np `np` [flags] command..., with the suite's defaults in `env`.
  std::unique_ptr<Job> LaunchCommand(
      int np, const std::vector<std::string>& command,
      std::vector<std::string> env = {},
      std::vector<std::string> launcher_flags = {}) {
    for (const auto& e : kDefaults) env.push_back(e);
    std::vector<std::string> args = {g_kolorun, "-np", std::to_string(np)};
    args.insert(args.end(), launcher_flags.begin(), launcher_flags.end());
    args.insert(args.end(), command.begin(), command.end());
    np_ = np;
    return Job::Start(args, env);
  }

  // The worker command, run through `sh -c script` (the script ends with
  // `exec "$0" "$@"` to become the worker).
  std::vector<std::string> ThroughShell(
      const std::string& script, const std::vector<std::string>& worker_args) {
    std::vector<std::string> command = {"sh", "-c", script, g_worker};
    command.insert(command.end(), worker_args.begin(), worker_args.end());
    command.push_back("--pid-dir");
    command.push_back(dir_);
    return command;
  }

  // Waits for rank `rank` to have recorded its pid.
  pid_t PidOf(Job& job, int rank) {
    job.WaitFor(absl::StrCat("READY rank ", rank, " "), 30);
    return WorkerPids(dir_, np_)[rank];
  }

  // The common checks of RELIABILITY.md.
  void ExpectNothingLeft(Job& job) {
    for (auto [rank, pid] : WorkerPids(dir_, np_)) {
      EXPECT_TRUE(WaitForExit(pid, 5))
          << "worker rank " << rank << " (pid " << pid << ") is still alive";
    }
    EXPECT_NE(kill(job.pid(), 0), 0) << "kolorun is still alive";
    // The job's own: held by a process of kolorun's or a worker's group.
    std::set<pid_t> groups = {job.pid()};
    for (auto [rank, pid] : WorkerPids(dir_, np_)) groups.insert(pid);
    for (const std::string& s : ListeningSocketsOf(groups)) {
      ADD_FAILURE() << "listening socket left: " << s;
    }
    for (const std::string& e : ShmEntries()) {
      EXPECT_TRUE(shm_before_.count(e)) << "/dev/shm entry left: " << e;
    }
  }

  // "t=<ns>" of the line matched by `pattern`, or 0.
  int64_t LineTime(Job& job, const std::string& pattern, double timeout_s,
                   std::string* line = nullptr) {
    std::smatch m;
    if (!job.WaitFor(pattern + "(?:[^\\n]* )?t=(\\d+)", timeout_s, &m))
      return 0;
    if (line) *line = m.str(0);
    return std::stoll(m[m.size() - 1].str());
  }

  std::string dir_;
  int np_ = 0;
  std::set<std::string> sockets_before_, shm_before_;
};

}  // namespace testing
}  // namespace kolo

#endif  // KOLO_TESTS_RELIABILITY_FIXTURE_H_
