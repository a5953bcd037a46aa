// RELIABILITY.md 16: a program that returns from main while kolo's threads
// still run exits with its own code, never a crash in a kolo thread. Runs
// exit_helper (two leaked control planes sending as fast as they can) many
// times; every run must exit 0.
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/run_command.h"

namespace {

std::string g_helper;

TEST(ExitTest, ReturningFromMainWithKoloThreadsRunningExitsCleanly) {
  constexpr int kRuns = 40;
  int clean = 0;
  for (int i = 0; i < kRuns; ++i) {
    kolo::testing::CommandResult result =
        kolo::testing::RunCommand({g_helper}, /*deadline_s=*/60);
    if (result.exit_code == 0) {
      ++clean;
    } else {
      ADD_FAILURE() << "run " << i << " exited " << result.exit_code << ":\n"
                    << result.output;
    }
  }
  std::printf("%d of %d runs exited cleanly\n", clean, kRuns);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s EXIT_HELPER\n", argv[0]);
    return 2;
  }
  g_helper = argv[1];
  return RUN_ALL_TESTS();
}
