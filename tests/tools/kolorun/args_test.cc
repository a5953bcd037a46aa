#include "tools/kolorun/args.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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
  EXPECT_TRUE(options->bind_to_core);
  EXPECT_EQ(options->command, (Args{"python3", "train.py"}));
}

TEST(ParseArgsTest, BindTo) {
  auto options = ParseArgs({"-np", "2", "--bind-to", "none", "x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->bind_to_core);
  options = ParseArgs({"-np", "2", "--bind-to=none", "--bind-to=core", "x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->bind_to_core);
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

TEST(ParseArgsTest, MultiHostOptions) {
  auto options = ParseArgs({"-np",
                            "4",
                            "-H",
                            "hostA:2,hostB:2",
                            "-p",
                            "2222",
                            "-i",
                            "/keys/id",
                            "--ssh-config",
                            "/etc/kolo/ssh_config",
                            "--network-interface",
                            "eth1",
                            "-x",
                            "FOO=bar baz",
                            "-x",
                            "PATH",
                            "-x",
                            "EMPTY=",
                            "--output-filename",
                            "/tmp/logs",
                            "--prefix-timestamp",
                            "--log-level",
                            "DEBUG",
                            "--",
                            "python3",
                            "train.py"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->hosts,
            (std::vector<HostSlots>{{"hostA", 2}, {"hostB", 2}}));
  EXPECT_EQ(options->ssh_port, 2222);
  EXPECT_EQ(options->ssh_identity_file, "/keys/id");
  EXPECT_EQ(options->ssh_config, "/etc/kolo/ssh_config");
  EXPECT_EQ(options->network_interface, "eth1");
  ASSERT_EQ(options->forwarded.size(), 3u);
  EXPECT_EQ(options->forwarded[0].name, "FOO");
  EXPECT_TRUE(options->forwarded[0].has_value);
  EXPECT_EQ(options->forwarded[0].value, "bar baz");
  EXPECT_EQ(options->forwarded[1].name, "PATH");
  EXPECT_FALSE(options->forwarded[1].has_value);
  EXPECT_EQ(options->forwarded[2].name, "EMPTY");
  EXPECT_TRUE(options->forwarded[2].has_value);
  EXPECT_EQ(options->forwarded[2].value, "");
  EXPECT_EQ(options->output_dir, "/tmp/logs");
  EXPECT_TRUE(options->prefix_timestamp);
  EXPECT_EQ(options->log_level, "debug");
  EXPECT_EQ(options->command, (Args{"python3", "train.py"}));

  options = ParseArgs({"-np=2", "--hosts=a:1,b", "--ssh-port=22",
                       "--ssh-identity-file=/k", "--hostfile=/dev/null",
                       "--prefix-output-with-timestamp", "x"});
  ASSERT_FALSE(options.ok());  // -H and --hostfile together.
  options = ParseArgs({"-np=2", "--hosts=a:1,b", "--ssh-port=22",
                       "--ssh-identity-file=/k",
                       "--prefix-output-with-timestamp", "x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->hosts, (std::vector<HostSlots>{{"a", 1}, {"b", 1}}));
  EXPECT_EQ(options->ssh_port, 22);
  EXPECT_TRUE(options->prefix_timestamp);
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

TEST(ParseArgsTest, OutputChoices) {
  auto options = ParseArgs({"-np", "8", "true"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->tag_output);
  EXPECT_TRUE(options->output_ranks.empty());
  EXPECT_TRUE(options->ShowsRank(7));

  options = ParseArgs(
      {"-np", "8", "--no-tag-output", "--output-ranks", "5, 0,2-3,3", "true"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_FALSE(options->tag_output);
  EXPECT_EQ(options->output_ranks, (std::vector<int>{0, 2, 3, 5}));
  for (int rank = 0; rank < 8; ++rank) {
    EXPECT_EQ(options->ShowsRank(rank),
              rank == 0 || rank == 2 || rank == 3 || rank == 5)
        << rank;
  }
  options = ParseArgs({"--output-ranks=0", "-np", "2", "true"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->output_ranks, (std::vector<int>{0}));

  for (const char* bad : {"", "x", "-1", "1-", "3-1", "1,,2", "0-99999999"}) {
    options = ParseArgs({"-np", "4", "--output-ranks", bad, "true"});
    ASSERT_FALSE(options.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(options.status().message(),
                                  "--output-ranks expects ranks such as"))
        << options.status();
  }
  options = ParseArgs({"-np", "2", "--output-ranks", "0,2", "true"});
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().message(),
            "--output-ranks names rank 2, but -np 2 has ranks 0 to 1");
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
      {{"-np", "2", "-H", "a,,b", "true"}, "-H: empty entry"},
      {{"-np", "2", "-H", "a:0", "true"}, "-H: host \"a\": the number"},
      {{"-np", "2", "-H", "-oProxyCommand=evil", "true"}, "invalid host name"},
      {{"-np", "2", "-H", "a:1,a:1", "true"}, "listed twice"},
      {{"-np", "2", "-H"}, "-H needs a value"},
      {{"-np", "2", "-H", "a", "--hostfile", "f", "true"}, "use one of them"},
      {{"-np", "2", "--hostfile=", "true"}, "--hostfile needs a value"},
      {{"-np", "2", "-p", "0", "true"}, "-p expects a positive integer up to"},
      {{"-np", "2", "--ssh-port", "65536", "true"}, "up to 65535"},
      {{"-np", "2", "-i", "", "true"}, "-i needs a value"},
      {{"-np", "2", "-x", "1ABC=2", "true"}, "-x expects NAME"},
      {{"-np", "2", "-x", "=2", "true"}, "-x expects NAME"},
      {{"-np", "2", "-x", "A-B", "true"}, "-x expects NAME"},
      {{"-np", "2", "-x", "KOLO_RANK=1", "true"}, "kolorun sets KOLO_RANK"},
      {{"-np", "2", "-x", "KOLO_SECRET=s", "true"}, "kolorun sets KOLO_SECRET"},
      {{"-np", "2", "-x", "KOLO_TEST_SURELY_UNSET_VAR", "true"},
       "is not set in kolorun's environment"},
      {{"-np", "2", "--log-level", "loud", "true"}, "--log-level expects"},
      {{"-np", "2", "--network-interface=", "true"}, "needs a value"},
      {{"-np", "2", "--prefix-timestamp=yes", "true"}, "unknown option"},
      {{"-np", "2", "--bind-to", "socket", "true"},
       "--bind-to: \"socket\" is not one of core, none"},
      {{"-np", "2", "--bind-to"}, "--bind-to needs a value"},
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
  for (const char* option : {"-np N",
                             "--num-proc N",
                             "-H, --hosts LIST",
                             "--hostfile FILE",
                             "-p, --ssh-port PORT",
                             "-i, --ssh-identity-file FILE",
                             "--ssh-config FILE",
                             "--network-interface NAME",
                             "-x NAME[=VALUE]",
                             "--output-filename DIR",
                             "--prefix-timestamp",
                             "--log-level LEVEL",
                             "--start-timeout SECONDS",
                             "--grace-period SECONDS",
                             "--verbose",
                             "--bind-to core|none",
                             "-h, --help",
                             "default 60",
                             "default 5",
                             "BatchMode=yes",
                             "kolo_rank_guard",
                             "PATH",
                             "LD_LIBRARY_PATH",
                             "OMP_NUM_THREADS"}) {
    EXPECT_NE(usage.find(option), std::string::npos) << option;
  }
}

TEST(LoadFilesTest, ReadsTheHostfileAndChecksTheSshFiles) {
  const std::string dir = ::testing::TempDir();
  const std::string hostfile = dir + "/hostfile";
  std::ofstream(hostfile) << "# two hosts\nnode1 slots=2\nnode2 slots=3\n";
  LaunchOptions options;
  options.hostfile = hostfile;
  options.ssh_config = hostfile;  // Any readable file.
  ASSERT_TRUE(LoadFiles(&options).ok());
  EXPECT_EQ(options.hosts,
            (std::vector<HostSlots>{{"node1", 2}, {"node2", 3}}));

  std::ofstream(hostfile) << "node1 slots=2\nnode2 cores=3\n";
  absl::Status s = LoadFiles(&options);
  EXPECT_NE(s.message().find(hostfile + ":2: unknown field \"cores=3\""),
            std::string::npos)
      << s;
  for (std::string LaunchOptions::*field :
       {&LaunchOptions::hostfile, &LaunchOptions::ssh_config,
        &LaunchOptions::ssh_identity_file}) {
    LaunchOptions missing;
    missing.*field = dir + "/no-such-file";
    s = LoadFiles(&missing);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("no-such-file: No such file"), std::string::npos)
        << s;
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
