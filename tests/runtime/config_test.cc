// Configuration parsing from an environment map (no setenv).
#include "runtime/config.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kolo {
namespace {

using ::testing::HasSubstr;

TEST(Config, DefaultsMatchTheDocumentedTable) {
  auto o = ParseOptions({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->size, 1);
  EXPECT_EQ(o->rank, 0);
  EXPECT_EQ(o->fusion_threshold_bytes, 64 << 20);
  EXPECT_EQ(o->cycle_time, absl::Milliseconds(1));
  EXPECT_EQ(o->cache_capacity, 1024);
  EXPECT_EQ(o->op_timeout, absl::Seconds(600));
  EXPECT_EQ(o->start_timeout, absl::Seconds(60));
  EXPECT_EQ(o->stall_check_time, absl::Seconds(60));
  EXPECT_EQ(o->stall_shutdown_time, absl::ZeroDuration());
  EXPECT_EQ(o->log_level, LogLevel::kWarning);
  EXPECT_TRUE(o->shm);
  EXPECT_FALSE(o->hierarchical_allreduce);
  EXPECT_EQ(o->rendezvous_port, 29600);
  EXPECT_EQ(o->bind_addr, "127.0.0.1");
  EXPECT_EQ(o->rendezvous_addr, "127.0.0.1");
  EXPECT_FALSE(o->host_store);
  EXPECT_EQ(o->placement_source, "");
  EXPECT_TRUE(o->secret.empty());
  EXPECT_FALSE(o->insecure_no_secret);
}

TEST(Config, ParsesEveryVariable) {
  auto o = ParseOptions({{"KOLO_RANK", "2"},
                         {"KOLO_SIZE", "4"},
                         {"KOLO_LOCAL_RANK", "0"},
                         {"KOLO_LOCAL_SIZE", "2"},
                         {"KOLO_CROSS_RANK", "1"},
                         {"KOLO_CROSS_SIZE", "2"},
                         {"KOLO_RENDEZVOUS_ADDR", "10.1.2.3"},
                         {"KOLO_RENDEZVOUS_PORT", "1234"},
                         {"KOLO_SECRET", "s3cret-s3cret-s3cret"},
                         {"KOLO_FUSION_THRESHOLD", "1048576"},
                         {"KOLO_CYCLE_TIME", "2.5"},
                         {"KOLO_CACHE_CAPACITY", "0"},
                         {"KOLO_OP_TIMEOUT", "10"},
                         {"KOLO_START_TIMEOUT", "5"},
                         {"KOLO_STALL_CHECK_TIME", "2"},
                         {"KOLO_STALL_SHUTDOWN_TIME", "5"},
                         {"KOLO_TIMELINE", "/tmp/t.json"},
                         {"KOLO_LOG_LEVEL", "debug"},
                         {"KOLO_SHM", "off"},
                         {"KOLO_HIERARCHICAL_ALLREDUCE", "1"},
                         {"KOLO_IFACE", "lo"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->size, 4);
  EXPECT_EQ(o->local_size, 2);
  EXPECT_EQ(o->cross_rank, 1);
  EXPECT_EQ(o->rendezvous_addr, "10.1.2.3");
  EXPECT_EQ(o->rendezvous_port, 1234);
  EXPECT_EQ(o->secret, "s3cret-s3cret-s3cret");
  EXPECT_EQ(o->placement_source, "kolo");
  EXPECT_FALSE(o->host_store);
  EXPECT_EQ(o->fusion_threshold_bytes, 1 << 20);
  EXPECT_EQ(o->cycle_time, absl::Microseconds(2500));
  EXPECT_EQ(o->cache_capacity, 0);
  EXPECT_EQ(o->op_timeout, absl::Seconds(10));
  EXPECT_EQ(o->start_timeout, absl::Seconds(5));
  EXPECT_EQ(o->stall_shutdown_time, absl::Seconds(5));
  EXPECT_EQ(o->timeline_path, "/tmp/t.json");
  EXPECT_EQ(o->log_level, LogLevel::kDebug);
  EXPECT_FALSE(o->shm);
  EXPECT_TRUE(o->hierarchical_allreduce);
  EXPECT_EQ(o->bind_addr, "127.0.0.1");
}

TEST(Config, BadValuesNameTheVariableAndTheValue) {
  struct Case {
    const char* var;
    const char* value;
  } cases[] = {
      {"KOLO_OP_TIMEOUT", "abc"},     {"KOLO_OP_TIMEOUT", "-1"},
      {"KOLO_OP_TIMEOUT", "0"},       {"KOLO_SIZE", "0"},
      {"KOLO_RANK", "-1"},            {"KOLO_FUSION_THRESHOLD", "1.5"},
      {"KOLO_CYCLE_TIME", "fast"},    {"KOLO_CACHE_CAPACITY", "-1"},
      {"KOLO_SHM", "maybe"},          {"KOLO_LOG_LEVEL", "loud"},
      {"KOLO_RENDEZVOUS_PORT", "70000"}, {"KOLO_START_TIMEOUT", "nan"},
      {"KOLO_STALL_CHECK_TIME", "-3"}, {"KOLO_HIERARCHICAL_ALLREDUCE", "2"},
  };
  for (const Case& c : cases) {
    auto o = ParseOptions({{c.var, c.value}});
    ASSERT_FALSE(o.ok()) << c.var << "=" << c.value;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(o.status().message()), HasSubstr(c.var));
    EXPECT_THAT(std::string(o.status().message()), HasSubstr(c.value));
  }
}

TEST(Config, RankOutsideWorldAndUnknownInterface) {
  auto o = ParseOptions({{"KOLO_RANK", "4"}, {"KOLO_SIZE", "4"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("KOLO_RANK=4"));
  o = ParseOptions({{"KOLO_IFACE", "nosuchif0"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("KOLO_IFACE"));
}

TEST(Config, SecretFileMustBePrivate) {
  std::string path = ::testing::TempDir() + "/secret";
  {
    std::ofstream out(path);
    out << "abcdef-abcdef-abcdef\n";
  }
  chmod(path.c_str(), 0644);
  auto o = ParseOptions({{"KOLO_SECRET_FILE", path}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("0600"));
  EXPECT_THAT(std::string(o.status().message()), ::testing::Not(HasSubstr("abcdef")));
  chmod(path.c_str(), 0600);
  o = ParseOptions({{"KOLO_SECRET_FILE", path}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->secret, "abcdef-abcdef-abcdef");
  o = ParseOptions({{"KOLO_SECRET_FILE", path + ".missing"}});
  EXPECT_FALSE(o.ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace kolo
