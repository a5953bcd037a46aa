// kolorun's elastic mode, the parts without processes: the flags, the
// discovery script's output and its runs, rank assignment and the
// blacklist (Note [Generations of a job] in tools/kolorun/elastic.h).
#include "tools/kolorun/elastic.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "tools/kolorun/args.h"

namespace kolo {
namespace kolorun {
namespace {

TEST(ElasticArgsTest, FlagsAndDefaults) {
  auto options = ParseArgs({"-np", "4", "--min-np", "2", "x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->elastic);
  EXPECT_EQ(options->min_np, 2);
  EXPECT_EQ(options->max_np, 4);  // -np without a discovery script.
  EXPECT_EQ(options->reset_limit, -1);
  EXPECT_EQ(options->elastic_timeout, absl::Seconds(600));
  EXPECT_EQ(options->blacklist_cooldown, absl::Seconds(60));

  options = ParseArgs({"-np", "2", "--host-discovery-script", "/bin/hosts",
                       "--slots-per-host", "8", "--elastic-timeout", "30",
                       "--reset-limit=3", "--blacklist-cooldown", "0",
                       "--discovery-interval", "0.5", "x"});
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_TRUE(options->elastic);
  EXPECT_EQ(options->min_np, 2);
  EXPECT_GT(options->max_np, 1000);  // The slots the script offers.
  EXPECT_EQ(options->slots_per_host, 8);
  EXPECT_EQ(options->elastic_timeout, absl::Seconds(30));
  EXPECT_EQ(options->reset_limit, 3);
  EXPECT_EQ(options->blacklist_cooldown, absl::ZeroDuration());
  EXPECT_EQ(options->discovery_interval, absl::Milliseconds(500));

  options = ParseArgs({"-np", "2", "x"});
  ASSERT_TRUE(options.ok());
  EXPECT_FALSE(options->elastic);
}

TEST(ElasticArgsTest, BadFlagsAreUsageErrors) {
  struct Case {
    std::vector<std::string> args;
    const char* message;
  } cases[] = {
      {{"-np", "2", "--min-np", "3", "x"}, "--min-np <= -np <= --max-np"},
      {{"-np", "4", "--max-np", "3", "x"}, "--min-np <= -np <= --max-np"},
      {{"-np", "2", "--min-np", "0", "x"}, "--min-np expects a positive"},
      {{"-np", "2", "--reset-limit", "-1", "x"}, "--reset-limit expects"},
      {{"-np", "2", "--elastic-timeout", "0", "x"},
       "--elastic-timeout expects"},
      {{"-np", "2", "-H", "a:2", "--host-discovery-script", "s", "x"},
       "drop -H"},
      {{"-np", "2", "--min-np", "1", "--output-ranks", "0", "x"},
       "--output-ranks names ranks"},
      {{"-np", "2", "-x", "KOLO_ELASTIC_ID=3", "x"}, "kolorun sets"},
  };
  for (const Case& c : cases) {
    auto options = ParseArgs(c.args);
    ASSERT_FALSE(options.ok()) << c.args[2];
    EXPECT_TRUE(absl::StrContains(options.status().message(), c.message))
        << options.status();
  }
}

TEST(DiscoveryOutputTest, HostsAndSlots) {
  auto hosts = ParseDiscoveryOutput(
      "hostA:4\n# a comment\n\n  hostB  \nhostA:2\nhostC:0 # none now\n", 3);
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  ASSERT_EQ(hosts->size(), 3u);
  EXPECT_EQ((*hosts)[0], (HostSlots{"hostA", 6}));  // Listed twice: added.
  EXPECT_EQ((*hosts)[1], (HostSlots{"hostB", 3}));  // --slots-per-host.
  EXPECT_EQ((*hosts)[2], (HostSlots{"hostC", 0}));
  for (const char* bad : {"hostA:x\n", "host A:2\n", ":3\n", "a:-1\n"}) {
    auto parsed = ParseDiscoveryOutput(std::string("ok:1\n") + bad, 1);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_TRUE(absl::StrContains(parsed.status().message(), "line 2"))
        << parsed.status();
  }
}

std::string Script(const std::string& body) {
  char path[] = "/tmp/kolo_discovery_XXXXXX";
  const int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "#!/bin/sh\n" << body << "\n";
  chmod(path, 0755);
  return path;
}

TEST(DiscoveryScriptTest, OutputStatusAndTimeout) {
  const std::string ok = Script("echo localhost:2");
  auto output = RunDiscoveryScript(ok, absl::Seconds(10));
  ASSERT_TRUE(output.ok()) << output.status();
  EXPECT_EQ(*output, "localhost:2\n");

  const std::string failing = Script("echo partial; exit 3");
  output = RunDiscoveryScript(failing, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable(output.status())) << output.status();
  EXPECT_TRUE(
      absl::StrContains(output.status().message(), "exited with code 3"))
      << output.status();

  // A script that hangs (and keeps its output open in a child) is killed.
  const std::string hanging = Script("sleep 30 & sleep 30");
  const absl::Time start = absl::Now();
  output = RunDiscoveryScript(hanging, absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsDeadlineExceeded(output.status())) << output.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));

  output = RunDiscoveryScript("/nonexistent/script", absl::Seconds(5));
  EXPECT_FALSE(output.ok());
  for (const std::string& s : {ok, failing, hanging}) unlink(s.c_str());
}

TEST(AssignRanksTest, HostsInOrderSurvivorsKeepTheirOrderNewcomersLast) {
  const std::vector<Candidate> candidates = {{10, "b", -1}, {3, "a", 2},
                                             {1, "b", 1},   {0, "a", 0},
                                             {11, "a", -1}, {12, "c", -1}};
  auto ranks = AssignRanks(candidates, {"a", "b"}, 5);
  ASSERT_EQ(ranks.size(), 6u);
  const std::vector<int64_t> order = {0, 3, 11, 1, 10, 12};
  for (size_t i = 0; i < ranks.size(); ++i) {
    EXPECT_EQ(ranks[i].first, order[i]) << i;
    const elastic::Assignment& a = ranks[i].second;
    EXPECT_EQ(a.rank, static_cast<int>(i));
    EXPECT_EQ(a.size, 6);
    EXPECT_EQ(a.generation, 5);
    EXPECT_TRUE(a.member);
    EXPECT_EQ(a.cross_size, 3);
  }
  EXPECT_EQ(ranks[2].second.local_rank, 2);  // id 11 on a
  EXPECT_EQ(ranks[2].second.local_size, 3);
  EXPECT_EQ(ranks[4].second.local_rank, 1);  // id 10 on b
  EXPECT_EQ(ranks[4].second.cross_rank, 1);
  EXPECT_EQ(ranks[5].second.cross_rank, 2);  // c: not in host_order, last
  EXPECT_EQ(ranks[5].second.local_size, 1);
}

TEST(HostBookTest, BlacklistsOnTheSecondFailureUntilTheCooldownEnds) {
  HostBook book(absl::Seconds(60));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(book.RecordFailure("a", t0));  // A first failure: never.
  EXPECT_FALSE(book.Blacklisted("a", t0));
  EXPECT_TRUE(book.RecordFailure("a", t0 + absl::Seconds(1)));
  EXPECT_TRUE(book.Blacklisted("a", t0 + absl::Seconds(2)));
  EXPECT_FALSE(book.Blacklisted("b", t0 + absl::Seconds(2)));
  EXPECT_EQ(book.BlacklistedUntil("a"), t0 + absl::Seconds(61));
  EXPECT_FALSE(book.Blacklisted("a", t0 + absl::Seconds(61)));
  // After the cooldown a host starts afresh.
  EXPECT_FALSE(book.RecordFailure("a", t0 + absl::Seconds(70)));
  EXPECT_TRUE(book.RecordFailure("a", t0 + absl::Seconds(71)));

  HostBook forever(absl::ZeroDuration());
  forever.RecordFailure("a", t0);
  forever.RecordFailure("a", t0);
  EXPECT_TRUE(forever.Blacklisted("a", t0 + absl::Hours(1000)));
}

}  // namespace
}  // namespace kolorun
}  // namespace kolo
