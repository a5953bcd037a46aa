// Configuration parsing from an environment map (no setenv).
#include "runtime/api/config.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/net/hosts.h"

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
                         {"KOLO_SPIN_TIME", "12.5"},
                         {"KOLO_OP_TIMEOUT", "10"},
                         {"KOLO_START_TIMEOUT", "5"},
                         {"KOLO_STALL_CHECK_TIME", "2"},
                         {"KOLO_STALL_SHUTDOWN_TIME", "5"},
                         {"KOLO_TIMELINE", "/tmp/t.json"},
                         {"KOLO_LOG_LEVEL", "debug"},
                         {"KOLO_SHM", "off"},
                         {"KOLO_PHASE_TIMES", "1"},
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
  EXPECT_EQ(o->spin_time, absl::Nanoseconds(12500));
  EXPECT_EQ(o->op_timeout, absl::Seconds(10));
  EXPECT_EQ(o->start_timeout, absl::Seconds(5));
  EXPECT_EQ(o->stall_shutdown_time, absl::Seconds(5));
  EXPECT_EQ(o->timeline_path, "/tmp/t.json");
  EXPECT_EQ(o->log_level, LogLevel::kDebug);
  EXPECT_FALSE(o->shm);
  EXPECT_TRUE(o->phase_times);
  EXPECT_TRUE(o->hierarchical_allreduce);
  EXPECT_EQ(o->bind_addr, "127.0.0.1");
}

TEST(Config, BadValuesNameTheVariableAndTheValue) {
  struct Case {
    const char* var;
    const char* value;
  } cases[] = {
      {"KOLO_OP_TIMEOUT", "abc"},
      {"KOLO_OP_TIMEOUT", "-1"},
      {"KOLO_OP_TIMEOUT", "0"},
      {"KOLO_SIZE", "0"},
      {"KOLO_RANK", "-1"},
      {"KOLO_FUSION_THRESHOLD", "1.5"},
      {"KOLO_CYCLE_TIME", "fast"},
      {"KOLO_CACHE_CAPACITY", "-1"},
      {"KOLO_SHM", "maybe"},
      {"KOLO_PHASE_TIMES", "sometimes"},
      {"KOLO_LOG_LEVEL", "loud"},
      {"KOLO_RENDEZVOUS_PORT", "70000"},
      {"KOLO_START_TIMEOUT", "nan"},
      {"KOLO_STALL_CHECK_TIME", "-3"},
      {"KOLO_HIERARCHICAL_ALLREDUCE", "2"},
      {"KOLO_SPIN_TIME", "-1"},
      {"KOLO_SPIN_TIME", "soon"},
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
  EXPECT_THAT(std::string(o.status().message()),
              ::testing::Not(HasSubstr("abcdef")));
  chmod(path.c_str(), 0600);
  o = ParseOptions({{"KOLO_SECRET_FILE", path}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->secret, "abcdef-abcdef-abcdef");
  o = ParseOptions({{"KOLO_SECRET_FILE", path + ".missing"}});
  EXPECT_FALSE(o.ok());
  std::remove(path.c_str());
}

TEST(Config, PortMessageIsTheSameForEveryBadValue) {
  for (const char* value : {"abc", "70000", "0", "-1", "1073741825"}) {
    auto o = ParseOptions({{"KOLO_RENDEZVOUS_PORT", value}});
    ASSERT_FALSE(o.ok()) << value;
    EXPECT_EQ(std::string(o.status().message()),
              absl::StrCat("invalid value for KOLO_RENDEZVOUS_PORT=\"", value,
                           "\": expected a port from 1 to 65535"));
  }
}

TEST(Config, DurationTooLargeSaysSo) {
  auto o = ParseOptions({{"KOLO_OP_TIMEOUT", "1e300"}});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(std::string(o.status().message()),
            "invalid value for KOLO_OP_TIMEOUT=\"1e300\": expected a number of "
            "seconds no larger than 1e9");
  o = ParseOptions({{"KOLO_OP_TIMEOUT", "1e9"}});
  EXPECT_TRUE(o.ok()) << o.status();
}

TEST(Config, StoreListeningUnderKolorunOnly) {
  auto o = ParseOptions({{"KOLO_LAUNCHER", "kolorun"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->store_listening);
  o = ParseOptions({{"KOLO_LAUNCHER", "something-else"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->store_listening);
  o = ParseOptions({});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->store_listening);
}

// Note [Horovod's names]: HOROVOD_* settings kolo shares, KOLO_* winning.
TEST(Config, HorovodNamesAreAliasesAndKoloWins) {
  auto o = ParseOptions({{"HOROVOD_FUSION_THRESHOLD", "1048576"},
                         {"HOROVOD_CYCLE_TIME", "2.5"},
                         {"HOROVOD_CACHE_CAPACITY", "7"},
                         {"HOROVOD_TIMELINE", "/tmp/t.json"},
                         {"HOROVOD_TIMELINE_MARK_CYCLES", "1"},
                         {"HOROVOD_STALL_CHECK_TIME_SECONDS", "9"},
                         {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "30"},
                         {"HOROVOD_LOG_LEVEL", "debug"},
                         {"HOROVOD_HIERARCHICAL_ALLREDUCE", "1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->fusion_threshold_bytes, 1 << 20);
  EXPECT_EQ(o->cycle_time, absl::Microseconds(2500));
  EXPECT_EQ(o->cache_capacity, 7);
  EXPECT_EQ(o->timeline_path, "/tmp/t.json");
  EXPECT_TRUE(o->timeline_mark_cycles);
  EXPECT_EQ(o->stall_check_time, absl::Seconds(9));
  EXPECT_EQ(o->stall_shutdown_time, absl::Seconds(30));
  EXPECT_EQ(o->log_level, LogLevel::kDebug);
  EXPECT_TRUE(o->hierarchical_allreduce);

  o = ParseOptions({{"HOROVOD_FUSION_THRESHOLD", "1048576"},
                    {"KOLO_FUSION_THRESHOLD", "4096"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->fusion_threshold_bytes, 4096);

  o = ParseOptions({{"HOROVOD_STALL_CHECK_DISABLE", "1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->stall_check_time, absl::ZeroDuration());

  // A bad value names the variable that was read.
  o = ParseOptions({{"HOROVOD_CYCLE_TIME", "soon"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("HOROVOD_CYCLE_TIME=\"soon\""));
}

// --- The job secret. ---

// Note [Secret without a file]: kolorun's descriptor, read at offset 0 as
// often as needed, then close-on-exec; errors never echo the secret.
TEST(ConfigSecret, FromAnInheritedDescriptor) {
  const int fd = memfd_create("config-test-secret", 0);
  ASSERT_GE(fd, 0);
  const std::string secret = "fd-secret-0123456789abcdef";
  ASSERT_EQ(write(fd, secret.data(), secret.size()),
            static_cast<ssize_t>(secret.size()));
  for (int again = 0; again < 2; ++again) {
    auto o = ParseOptions({{"KOLO_SECRET_FD", absl::StrCat(fd)},
                           {"KOLO_SECRET", "ignored-when-fd-is-set"}});
    ASSERT_TRUE(o.ok()) << o.status();
    EXPECT_EQ(o->secret, secret);
  }
  EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC);
  close(fd);

  auto o = ParseOptions({{"KOLO_SECRET_FD", absl::StrCat(fd)}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("is not open"));
  o = ParseOptions({{"KOLO_SECRET_FD", "three"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("KOLO_SECRET_FD=\"three\""));

  const int short_fd = memfd_create("config-test-short", 0);
  ASSERT_EQ(write(short_fd, "short-one", 9), 9);
  o = ParseOptions({{"KOLO_SECRET_FD", absl::StrCat(short_fd)}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("holds 9"));
  EXPECT_THAT(std::string(o.status().message()),
              ::testing::Not(HasSubstr("short-one")));
  close(short_fd);
}

constexpr char kSecret[] = "0123456789abcdef";  // Exactly the minimum.

TEST(ConfigSecret, ShorterThan16BytesIsRefusedWithoutEchoingIt) {
  auto o = ParseOptions({{"KOLO_SECRET", "0123456789abcde"}});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("at least 16"));
  EXPECT_THAT(std::string(o.status().message()),
              ::testing::Not(HasSubstr("0123456789abcde")));

  std::string path = ::testing::TempDir() + "/short_secret";
  {
    std::ofstream out(path);
    out << "  short-secret \n";  // 12 bytes once whitespace is stripped.
  }
  chmod(path.c_str(), 0600);
  o = ParseOptions({{"KOLO_SECRET_FILE", path}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("at least 16"));
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("holds 12"));
  EXPECT_THAT(std::string(o.status().message()),
              ::testing::Not(HasSubstr("short-secret")));
  std::remove(path.c_str());

  o = ParseOptions({{"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->secret, kSecret);
}

TEST(ConfigSecret, JobOfSeveralRanksNeedsOne) {
  auto o = ParseOptions({{"KOLO_RANK", "1"}, {"KOLO_SIZE", "2"}});
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string message(o.status().message());
  for (const char* part : {"no job secret", "KOLO_SECRET_FILE", "KOLO_SECRET ",
                           "at least 16", "KOLO_INSECURE_NO_SECRET=1"}) {
    EXPECT_THAT(message, HasSubstr(part));
  }
  // A job of one needs none.
  o = ParseOptions({{"KOLO_RANK", "0"}, {"KOLO_SIZE", "1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->secret.empty());
}

TEST(ConfigSecret, InsecureSettingUsesTheWellKnownSecret) {
  auto o = ParseOptions({{"KOLO_RANK", "1"},
                         {"KOLO_SIZE", "2"},
                         {"KOLO_INSECURE_NO_SECRET", "1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->insecure_no_secret);
  EXPECT_EQ(o->secret, kInsecureWellKnownSecret);
  EXPECT_GE(o->secret.size(), kMinSecretBytes);
  // A real secret wins over the insecure setting.
  o = ParseOptions({{"KOLO_RANK", "1"},
                    {"KOLO_SIZE", "2"},
                    {"KOLO_SECRET", kSecret},
                    {"KOLO_INSECURE_NO_SECRET", "1"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->insecure_no_secret);
  EXPECT_EQ(o->secret, kSecret);
  o = ParseOptions({{"KOLO_INSECURE_NO_SECRET", "sure"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("KOLO_INSECURE_NO_SECRET=\"sure\""));
}

// --- Placement from other launchers. ---

TEST(ConfigPlacement, Mpirun) {
  auto o = ParseOptions({{"OMPI_COMM_WORLD_RANK", "3"},
                         {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                         {"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->placement_source, "mpirun");
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->size, 4);
  EXPECT_EQ(o->local_rank, 3);
  EXPECT_EQ(o->local_size, 4);
  EXPECT_EQ(o->cross_rank, 0);
  EXPECT_EQ(o->cross_size, 1);
  EXPECT_TRUE(o->host_store);
  // Every rank on one host: the store is on loopback, at the default port.
  EXPECT_EQ(o->rendezvous_addr, "127.0.0.1");
  EXPECT_EQ(o->rendezvous_port, 29600);
  EXPECT_EQ(o->bind_addr, "127.0.0.1");
}

TEST(ConfigPlacement, MpirunAcrossHostsNeedsTheRendezvousAddress) {
  EnvironmentMap env = {
      {"OMPI_COMM_WORLD_RANK", "5"},       {"OMPI_COMM_WORLD_SIZE", "8"},
      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
      {"OMPI_MCA_orte_num_nodes", "2"},    {"KOLO_SECRET", kSecret}};
  auto o = ParseOptions(env);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("set KOLO_RENDEZVOUS_ADDR"));
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("mpirun"));
  env["KOLO_RENDEZVOUS_ADDR"] = "127.0.0.1";
  o = ParseOptions(env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->cross_rank, 1);  // Ranks fill hosts in order: 4 per host.
  EXPECT_EQ(o->cross_size, 2);
  // KOLO_* values win over the launcher's.
  env["KOLO_CROSS_RANK"] = "0";
  env["KOLO_LOCAL_RANK"] = "2";
  o = ParseOptions(env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->cross_rank, 0);
  EXPECT_EQ(o->local_rank, 2);
}

TEST(ConfigPlacement, SlurmWithNodeListAndTasksPerNode) {
  auto o = ParseOptions({{"SLURM_PROCID", "3"},
                         {"SLURM_NTASKS", "5"},
                         {"SLURM_LOCALID", "0"},
                         {"SLURM_NODEID", "1"},
                         {"SLURM_NNODES", "2"},
                         {"SLURM_TASKS_PER_NODE", "3,2"},
                         {"SLURM_NODELIST", "node[07-08]"},
                         {"KOLO_IFACE", "lo"},  // No name lookups here.
                         {"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->placement_source, "slurm");
  EXPECT_EQ(o->rank, 3);
  EXPECT_EQ(o->size, 5);
  EXPECT_EQ(o->local_rank, 0);
  EXPECT_EQ(o->local_size, 2);
  EXPECT_EQ(o->cross_rank, 1);
  EXPECT_EQ(o->cross_size, 2);
  EXPECT_TRUE(o->host_store);
  EXPECT_EQ(o->rendezvous_addr, "node07");
  EXPECT_EQ(o->bind_addr, "127.0.0.1");
}

TEST(ConfigPlacement, SlurmStepVariablesWinAndRepeatCountsExpand) {
  auto o = ParseOptions({{"SLURM_PROCID", "4"},
                         {"SLURM_NTASKS", "99"},
                         {"SLURM_STEP_NUM_TASKS", "6"},
                         {"SLURM_LOCALID", "0"},
                         {"SLURM_NODEID", "2"},
                         {"SLURM_STEP_NUM_NODES", "3"},
                         {"SLURM_TASKS_PER_NODE", "9(x3)"},
                         {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
                         {"SLURM_STEP_NODELIST", "a1,b[2-3]"},
                         {"SLURM_NODELIST", "zzz"},
                         {"KOLO_IFACE", "lo"},
                         {"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->size, 6);
  EXPECT_EQ(o->local_size, 1);
  EXPECT_EQ(o->cross_size, 3);
  EXPECT_EQ(o->rendezvous_addr, "a1");
}

TEST(ConfigPlacement, SlurmInconsistenciesNameSlurm) {
  auto o = ParseOptions({{"SLURM_PROCID", "1"},
                         {"SLURM_NTASKS", "4"},
                         {"SLURM_LOCALID", "2"},
                         {"SLURM_NNODES", "2"},
                         {"SLURM_TASKS_PER_NODE", "2(x2)"},
                         {"KOLO_SECRET", kSecret}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("KOLO_LOCAL_RANK=2 is outside KOLO_LOCAL_SIZE=2"));
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("slurm"));

  o = ParseOptions({{"SLURM_PROCID", "1"},
                    {"SLURM_NTASKS", "4"},
                    {"SLURM_NNODES", "2"},
                    {"KOLO_SECRET", kSecret}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("SLURM_TASKS_PER_NODE"));

  o = ParseOptions({{"SLURM_PROCID", "1"},
                    {"SLURM_NTASKS", "4"},
                    {"SLURM_TASKS_PER_NODE", "2(x"},
                    {"KOLO_SECRET", kSecret}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("SLURM_TASKS_PER_NODE=\"2(x\""));

  o = ParseOptions({{"SLURM_PROCID", "1"}, {"KOLO_SECRET", kSecret}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("SLURM_PROCID is set but SLURM_NTASKS is not"));

  o = ParseOptions({{"SLURM_PROCID", "1"},
                    {"SLURM_NTASKS", "4"},
                    {"SLURM_NODELIST", "n[3-1]"},
                    {"KOLO_SECRET", kSecret}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("SLURM_NODELIST=\"n[3-1]\""));
}

TEST(ConfigPlacement, Torchrun) {
  EnvironmentMap env = {{"RANK", "1"},
                        {"WORLD_SIZE", "4"},
                        {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "2"},
                        {"GROUP_RANK", "0"},
                        {"GROUP_WORLD_SIZE", "2"},
                        {"MASTER_ADDR", "127.0.0.1"},
                        {"MASTER_PORT", "29500"},
                        {"KOLO_SECRET", kSecret}};
  auto o = ParseOptions(env);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->placement_source, "torchrun");
  EXPECT_EQ(o->rank, 1);
  EXPECT_EQ(o->size, 4);
  EXPECT_EQ(o->local_rank, 1);
  EXPECT_EQ(o->local_size, 2);
  EXPECT_EQ(o->cross_rank, 0);
  EXPECT_EQ(o->cross_size, 2);
  EXPECT_TRUE(o->host_store);
  EXPECT_EQ(o->rendezvous_addr, "127.0.0.1");
  EXPECT_EQ(o->rendezvous_port, 29600);  // MASTER_PORT is torchrun's.

  env["KOLO_RENDEZVOUS_PORT"] = "29500";
  o = ParseOptions(env);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("MASTER_PORT"));
}

TEST(ConfigPlacement, KubernetesStyleOneWorkerPerPod) {
  auto o = ParseOptions({{"RANK", "2"},
                         {"WORLD_SIZE", "3"},
                         {"MASTER_ADDR", "127.0.0.1"},
                         {"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->local_rank, 0);
  EXPECT_EQ(o->local_size, 1);
  EXPECT_EQ(o->cross_rank, 2);
  EXPECT_EQ(o->cross_size, 3);
}

TEST(ConfigPlacement, KoloVariablesComeFirstAndPairsAreRequired) {
  auto o = ParseOptions({{"KOLO_RANK", "0"},
                         {"KOLO_SIZE", "1"},
                         {"OMPI_COMM_WORLD_RANK", "3"},
                         {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"RANK", "7"},
                         {"WORLD_SIZE", "8"}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->placement_source, "kolo");
  EXPECT_EQ(o->size, 1);
  EXPECT_FALSE(o->host_store);

  o = ParseOptions({{"OMPI_COMM_WORLD_RANK", "3"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(
      std::string(o.status().message()),
      HasSubstr("OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE"));
  o = ParseOptions({{"WORLD_SIZE", "3"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("WORLD_SIZE is set but RANK is not"));
  o = ParseOptions(
      {{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("OMPI_COMM_WORLD_RANK=\"x\""));
  o = ParseOptions({{"RANK", "4"}, {"WORLD_SIZE", "4"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()), HasSubstr("torchrun"));
}

// --- Rendezvous and bind addresses. ---

TEST(ConfigRendezvous, RankZeroBindsTheRendezvousAddressWhenItIsLocal) {
  // 127.0.0.2 is local (all of 127/8 is): rank 0 hosts the store there and
  // binds its other listeners there too.
  auto o = ParseOptions({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "127.0.0.2"},
                         {"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->host_store);
  EXPECT_EQ(o->rendezvous_addr, "127.0.0.2");
  EXPECT_EQ(o->bind_addr, "127.0.0.2");
}

TEST(ConfigRendezvous, KoloAddressWinsOverMasterAddrAndSlurm) {
  auto o = ParseOptions({{"RANK", "1"},
                         {"WORLD_SIZE", "2"},
                         {"KOLO_RENDEZVOUS_ADDR", "127.0.0.3"},
                         {"KOLO_RENDEZVOUS_PORT", "4321"},
                         {"MASTER_ADDR", "127.0.0.2"},
                         {"SLURM_NODELIST", "elsewhere"},
                         {"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->rendezvous_addr, "127.0.0.3");
  EXPECT_EQ(o->rendezvous_port, 4321);
  EXPECT_EQ(o->bind_addr, "127.0.0.3");
}

TEST(ConfigRendezvous, RankZeroRefusesToHostTheStoreWhereNobodyLooks) {
  auto o = ParseOptions({{"RANK", "0"},
                         {"WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "127.0.0.2"},
                         {"KOLO_IFACE", "lo"},  // 127.0.0.1
                         {"KOLO_SECRET", kSecret}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("rank 0 hosts the rendezvous store on 127.0.0.1 "
                        "(KOLO_IFACE=lo) but the other ranks look for it at "
                        "\"127.0.0.2\""));
  // Not hosting it (KOLO_HOST_STORE=0), the same settings are fine.
  o = ParseOptions({{"RANK", "0"},
                    {"WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "127.0.0.2"},
                    {"KOLO_IFACE", "lo"},
                    {"KOLO_HOST_STORE", "0"},
                    {"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_FALSE(o->host_store);
}

TEST(ConfigRendezvous, HostStoreCanBeAskedForExplicitly) {
  auto o = ParseOptions({{"KOLO_RANK", "0"},
                         {"KOLO_SIZE", "2"},
                         {"KOLO_HOST_STORE", "yes"},
                         {"KOLO_SECRET", kSecret}});
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->host_store);
  EXPECT_EQ(o->bind_addr, "127.0.0.1");
  o = ParseOptions({{"KOLO_HOST_STORE", "perhaps"}});
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("KOLO_HOST_STORE=\"perhaps\""));
}

TEST(ConfigAddresses, LocalAddresses) {
  EXPECT_TRUE(IsLocalAddress("127.0.0.1"));
  EXPECT_TRUE(IsLocalAddress("127.0.0.9"));
  EXPECT_FALSE(IsLocalAddress("192.0.2.1"));  // TEST-NET-1: never assigned.
  EXPECT_FALSE(IsLocalAddress("not-an-address"));
  auto addr = LocalAddressFor("127.0.0.4");
  ASSERT_TRUE(addr.ok()) << addr.status();
  EXPECT_EQ(*addr, "127.0.0.4");
  auto resolved = ResolveIPv4("127.0.0.5");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, std::vector<std::string>{"127.0.0.5"});
}

TEST(ConfigRendezvous, NamesAreNotLookedUpWhenResolvingIsOff) {
  ParseSettings numeric_only;
  numeric_only.resolve_names = false;
  auto o = ParseOptions({{"RANK", "1"},
                         {"WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "trainer-0.example"},
                         {"KOLO_SECRET", kSecret}},
                        numeric_only);
  ASSERT_FALSE(o.ok());
  EXPECT_THAT(std::string(o.status().message()),
              HasSubstr("the rendezvous address \"trainer-0.example\" (from "
                        "MASTER_ADDR)"));
  o = ParseOptions({{"RANK", "1"},
                    {"WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "127.0.0.6"},
                    {"KOLO_SECRET", kSecret}},
                   numeric_only);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->bind_addr, "127.0.0.6");
  EXPECT_FALSE(ResolveIPv4("localhost", /*allow_lookup=*/false).ok());
}

TEST(ConfigSlurmNodelist, ExpandsBracketForms) {
  using Names = std::vector<std::string>;
  struct Case {
    const char* list;
    Names names;
  } cases[] = {
      {"node1", {"node1"}},
      {"node[1-3,5]", {"node1", "node2", "node3", "node5"}},
      {"n[08-10],gpu7", {"n08", "n09", "n10", "gpu7"}},
      {"a,b[2],c", {"a", "b2", "c"}},
      {"rack[1-2]-n[1-2]", {"rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"}},
      {"[3-4]x", {"3x", "4x"}},
  };
  for (const Case& c : cases) {
    auto names = ExpandSlurmNodelist(c.list);
    ASSERT_TRUE(names.ok()) << c.list << ": " << names.status();
    EXPECT_EQ(*names, c.names) << c.list;
  }
  for (const char* bad : {"", "a,,b", "n[1-", "n]1[", "n[a-b]", "n[3-1]", "n[]",
                          "n[1-2", "n[[1]]", "n[1-999999999]", "n[-1]"}) {
    auto names = ExpandSlurmNodelist(bad);
    EXPECT_FALSE(names.ok()) << "\"" << bad << "\" expanded to "
                             << (names.ok() ? names->size() : 0) << " names";
  }
}

}  // namespace
}  // namespace kolo
