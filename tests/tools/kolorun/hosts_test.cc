// Host lists, hostfiles, placement and local-host detection.
#include "tools/kolorun/hosts.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/api/config.h"
#include "runtime/net/hosts.h"

namespace kolo {
namespace kolorun {
namespace {

using Hosts = std::vector<HostSlots>;

TEST(ParseHostListTest, HostsAndSlots) {
  auto hosts = ParseHostList("host1:2,host2:4,10.0.0.3,node-7.example_x:1");
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  EXPECT_EQ(*hosts, (Hosts{{"host1", 2},
                           {"host2", 4},
                           {"10.0.0.3", 1},
                           {"node-7.example_x", 1}}));
}

TEST(ParseHostListTest, RejectsMalformedLists) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "empty host list"},
      {"a,,b", "empty entry"},
      {"a,", "empty entry"},
      {":2", "empty host name"},
      {"a:", "got \"\""},
      {"a:0", "positive integer, got \"0\""},
      {"a:-1", "positive integer"},
      {"a:x", "got \"x\""},
      {"a:2:3", "expected host or host:N"},
      {"::1", "IPv6"},
      {"-oProxyCommand=x:1", "invalid host name \"-oProxyCommand=x\""},
      {"user@host:2", "invalid host name"},
      {"a b:2", "invalid host name"},
      {"a:2,a:1", "host \"a\" is listed twice"},
  };
  for (const auto& [list, message] : cases) {
    auto hosts = ParseHostList(list);
    ASSERT_FALSE(hosts.ok()) << list;
    EXPECT_EQ(hosts.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(hosts.status().message().find(message), std::string::npos)
        << list << ": " << hosts.status().message();
  }
}

TEST(ParseHostfileTest, LinesCommentsAndBlankLines) {
  auto hosts = ParseHostfile(
      "# the cluster\n"
      "hostA slots=2\n"
      "\n"
      "   hostB    slots=4   # big one\n"
      "hostC\t\n"
      "hostD slots=1\r\n",
      "hosts.txt");
  ASSERT_TRUE(hosts.ok()) << hosts.status();
  EXPECT_EQ(*hosts,
            (Hosts{{"hostA", 2}, {"hostB", 4}, {"hostC", 1}, {"hostD", 1}}));
}

TEST(ParseHostfileTest, ErrorsNameTheFileAndLine) {
  const std::pair<const char*, const char*> cases[] = {
      {"a slots=2\nb slots=0\n", "hf:2: host \"b\": the number of slots"},
      {"a slots=2\nb max_slots=3\n", "hf:2: unknown field \"max_slots=3\""},
      {"\n\na:2\n", "hf:3: invalid host name \"a:2\""},
      {"a\na\n", "hf:2: host \"a\" is listed twice"},
      {"# only comments\n\n", "hf: no hosts"},
      {"a slots=two\n", "hf:1:"},
  };
  for (const auto& [content, message] : cases) {
    auto hosts = ParseHostfile(content, "hf");
    ASSERT_FALSE(hosts.ok()) << content;
    EXPECT_NE(hosts.status().message().find(message), std::string::npos)
        << content << ": " << hosts.status().message();
  }
}

bool OnlyLocalhost(const std::string& host) { return host == "localhost"; }

TEST(PlaceRanksTest, RanksFillHostsInOrder) {
  auto ranks =
      PlaceRanks(5, {{"localhost", 2}, {"b", 2}, {"c", 4}}, OnlyLocalhost);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  ASSERT_EQ(ranks->size(), 5u);
  struct Want {
    const char* host;
    bool remote;
    int local_rank, local_size, cross_rank;
  } want[] = {{"localhost", false, 0, 2, 0},
              {"localhost", false, 1, 2, 0},
              {"b", true, 0, 2, 1},
              {"b", true, 1, 2, 1},
              {"c", true, 0, 1, 2}};
  for (int r = 0; r < 5; ++r) {
    const RankPlacement& p = (*ranks)[r];
    EXPECT_EQ(p.rank, r);
    EXPECT_EQ(p.host, want[r].host) << r;
    EXPECT_EQ(p.remote, want[r].remote) << r;
    EXPECT_EQ(p.local_rank, want[r].local_rank) << r;
    EXPECT_EQ(p.local_size, want[r].local_size) << r;
    EXPECT_EQ(p.cross_rank, want[r].cross_rank) << r;
    EXPECT_EQ(p.cross_size, 3) << r;
  }
}

TEST(PlaceRanksTest, UnusedHostsAreNotPartOfTheJob) {
  auto ranks = PlaceRanks(2, {{"a", 2}, {"b", 2}}, OnlyLocalhost);
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  for (const RankPlacement& p : *ranks) {
    EXPECT_EQ(p.host, "a");
    EXPECT_EQ(p.cross_size, 1);
    EXPECT_EQ(p.local_size, 2);
  }
}

TEST(PlaceRanksTest, NoHostsMeansThisMachine) {
  auto ranks = PlaceRanks(3, {}, [](const std::string&) { return false; });
  ASSERT_TRUE(ranks.ok()) << ranks.status();
  for (const RankPlacement& p : *ranks) {
    EXPECT_EQ(p.host, "localhost");
    EXPECT_FALSE(p.remote);
    EXPECT_EQ(p.local_rank, p.rank);
    EXPECT_EQ(p.local_size, 3);
    EXPECT_EQ(p.cross_size, 1);
  }
}

TEST(PlaceRanksTest, TooFewSlotsAndTheSameMachineTwice) {
  auto ranks = PlaceRanks(5, {{"a", 2}, {"b", 2}}, OnlyLocalhost);
  ASSERT_FALSE(ranks.ok());
  EXPECT_EQ(ranks.status().message(),
            "-np 5 is more than the 4 slots of the hosts (a:2,b:2)");
  ranks = PlaceRanks(3, {{"localhost", 1}, {"127.0.0.1", 2}},
                     [](const std::string&) { return true; });
  ASSERT_FALSE(ranks.ok());
  EXPECT_NE(ranks.status().message().find("are both this machine"),
            std::string::npos)
      << ranks.status();
}

TEST(IsLocalHostTest, LoopbackNamesAndAddresses) {
  EXPECT_TRUE(IsLocalHost("localhost"));
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("127.0.0.2"));
  // A numeric address (no name lookup) this machine does not have.
  for (const char* addr : {"203.0.113.1", "198.51.100.1", "192.0.2.1"}) {
    EXPECT_EQ(IsLocalHost(addr), IsLocalAddress(addr)) << addr;
  }
  EXPECT_FALSE(IsLocalHost("203.0.113.1") && IsLocalHost("198.51.100.1"))
      << "neither TEST-NET address should be this machine's";
}

}  // namespace
}  // namespace kolorun
}  // namespace kolo
