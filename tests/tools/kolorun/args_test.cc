#include "tools/kolorun/args.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kolo {
namespace kolorun {
namespace {

using Args = std::vector<std::string>;

TEST(ParseArgsTest, MinimalCommandLineTakesDefaults) {
  auto options = ParseArgs({"-np", "4", "python3", "train.py"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_proc, 4);
  EXPECT_EQ(options->start_timeout, absl::Seconds(60));
  EXPECT_EQ(options->grace_period, absl::Seconds(5));
  EXPECT_FALSE(options->verbose);
  EXPECT_FALSE(options->help);
  EXPECT_EQ(options->command, (Args{"python3", "train.py"}));
}

TEST(ParseArgsTest, EveryOptionInBothSpellings) {
  auto options =
      ParseArgs({"--num-proc", "2", "--start-timeout", "1.5", "--grace-period",
                 "0", "--verbose", "--", "sh", "-c", "echo hi"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_proc, 2);
  EXPECT_EQ(options->start_timeout, absl::Milliseconds(1500));
  EXPECT_EQ(options->grace_period, absl::ZeroDuration());
  EXPECT_TRUE(options->verbose);
  EXPECT_EQ(options->command, (Args{"sh", "-c", "echo hi"}));

  options = ParseArgs({"-np=3", "--start-timeout=10", "--grace-period=2", "x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_proc, 3);
  EXPECT_EQ(options->start_timeout, absl::Seconds(10));
  EXPECT_EQ(options->grace_period, absl::Seconds(2));
  EXPECT_EQ(options->command, (Args{"x"}));
}

TEST(ParseArgsTest, OptionsEndAtTheFirstPositionalArgument) {
  auto options = ParseArgs({"-np", "2", "prog", "-np", "5", "--verbose", "--"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_proc, 2);
  EXPECT_FALSE(options->verbose);
  EXPECT_EQ(options->command, (Args{"prog", "-np", "5", "--verbose", "--"}));
}

TEST(ParseArgsTest, DoubleDashEndsOptionsEvenBeforeDashArguments) {
  auto options = ParseArgs({"-np", "1", "--", "--version"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->command, (Args{"--version"}));
}

TEST(ParseArgsTest, LaterValueWins) {
  auto options = ParseArgs({"-np", "2", "--num-proc", "3", "true"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->num_proc, 3);
}

TEST(ParseArgsTest, HelpNeedsNothingElse) {
  for (const Args& args : {Args{"-h"}, Args{"--help"}, Args{"-np", "2", "-h"},
                           Args{"--help", "--bogus"}}) {
    auto options = ParseArgs(args);
    ASSERT_TRUE(options.ok()) << options.status();
    EXPECT_TRUE(options->help);
  }
  // Arguments are read left to right: an error before -h is still an error.
  EXPECT_FALSE(ParseArgs({"--bogus", "-h"}).ok());
  EXPECT_FALSE(ParseArgs({"-np", "x", "-h"}).ok());
}

struct BadCase {
  Args args;
  std::string message;  // Part of the error message.
};

TEST(ParseArgsTest, RejectsBadCommandLines) {
  const BadCase cases[] = {
      {{}, "-np N"},
      {{"true"}, "-np N"},
      {{"-np"}, "-np needs a value"},
      {{"--num-proc"}, "--num-proc needs a value"},
      {{"-np", "0", "true"}, "positive integer"},
      {{"-np", "-2", "true"}, "positive integer"},
      {{"-np", "two", "true"}, "positive integer, got \"two\""},
      {{"-np", "1.5", "true"}, "positive integer"},
      {{"-np", "", "true"}, "positive integer"},
      {{"-np", "99999999999999", "true"}, "positive integer"},
      {{"-np=", "true"}, "positive integer"},
      {{"-np", "2"}, "no command"},
      {{"-np", "2", "--"}, "no command"},
      {{"-np", "2", "--bogus", "true"}, "unknown option \"--bogus\""},
      {{"-n", "2", "true"}, "unknown option \"-n\""},
      {{"-np2", "true"}, "unknown option \"-np2\""},
      {{"-np", "2", "--verbose=1", "true"}, "unknown option"},
      {{"-np", "2", "--start-timeout", "0", "true"}, "positive number"},
      {{"-np", "2", "--start-timeout", "-1", "true"}, "positive number"},
      {{"-np", "2", "--start-timeout", "abc", "true"}, "got \"abc\""},
      {{"-np", "2", "--start-timeout", "inf", "true"}, "seconds"},
      {{"-np", "2", "--start-timeout", "nan", "true"}, "seconds"},
      {{"-np", "2", "--start-timeout"}, "needs a value"},
      {{"-np", "2", "--grace-period", "-0.5", "true"}, "non-negative"},
      {{"-np", "2", "--grace-period", "5s", "true"}, "got \"5s\""},
  };
  for (const BadCase& c : cases) {
    std::string joined;
    for (const std::string& a : c.args) joined += "[" + a + "]";
    auto options = ParseArgs(c.args);
    ASSERT_FALSE(options.ok()) << joined;
    EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(options.status().message().find(c.message), std::string::npos)
        << joined << ": " << options.status().message();
  }
}

TEST(UsageTest, ListsEveryOption) {
  const std::string usage = Usage();
  for (const char* option : {"-np N", "--num-proc N", "--start-timeout SECONDS",
                             "--grace-period SECONDS", "--verbose",
                             "-h, --help", "default 60", "default 5"}) {
    EXPECT_NE(usage.find(option), std::string::npos) << option;
  }
}

TEST(FormatSecondsTest, PrintsAsTyped) {
  EXPECT_EQ(FormatSeconds(absl::Seconds(60)), "60");
  EXPECT_EQ(FormatSeconds(absl::Milliseconds(500)), "0.5");
  EXPECT_EQ(FormatSeconds(absl::Milliseconds(1500)), "1.5");
}

}  // namespace
}  // namespace kolorun
}  // namespace kolo
