// The ssh command line and the kolorun <-> kolo_rank_guard protocol.
#include "tools/kolorun/remote.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kolo {
namespace kolorun {
namespace {

using Args = std::vector<std::string>;

TEST(ShellQuoteTest, QuotesOnlyWhatNeedsIt) {
  EXPECT_EQ(ShellQuote("plain/path-1.2_x:y@z%+=,"), "plain/path-1.2_x:y@z%+=,");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("$HOME;rm -rf /"), "'$HOME;rm -rf /'");
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
}

TEST(SshCommandTest, BatchModeOptionsHostAndGuardedCommand) {
  LaunchOptions options;
  options.command = {"python3", "train.py", "--lr", "0.1 x", "it's"};
  options.start_timeout = absl::Milliseconds(2500);
  EXPECT_EQ(SshCommand(options, "node7", 3, "/opt/kolo/kolo_rank_guard"),
            (Args{"ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-T",
                  "node7",
                  "exec /opt/kolo/kolo_rank_guard --rank 3 -- python3 "
                  "train.py --lr '0.1 x' 'it'\\''s'"}));

  options.ssh_config = "/etc/kolo/ssh config";
  options.ssh_port = 2222;
  options.ssh_identity_file = "/keys/id";
  options.command = {"true"};
  EXPECT_EQ(SshCommand(options, "10.0.0.2", 0, "/g"),
            (Args{"ssh", "-o", "BatchMode=yes", "-F", "/etc/kolo/ssh config",
                  "-p", "2222", "-i", "/keys/id", "-o", "ConnectTimeout=3",
                  "-T", "10.0.0.2", "exec /g --rank 0 -- true"}));
}

GuardRequest SampleRequest() {
  GuardRequest request;
  request.cwd = "/work/dir with space";
  request.env = {"KOLO_RANK=3", "EMPTY=", "MULTI=line1\nline2,with:colon",
                 "EQ=a=b"};
  request.secret = "0123456789abcdef0123456789abcdef";
  request.status_token = "tok123";
  request.grace_period = absl::Milliseconds(1500);
  request.bind_to_core = true;
  return request;
}

void ExpectSame(const GuardRequest& got, const GuardRequest& want) {
  EXPECT_EQ(got.cwd, want.cwd);
  EXPECT_EQ(got.env, want.env);
  EXPECT_EQ(got.secret, want.secret);
  EXPECT_EQ(got.status_token, want.status_token);
  EXPECT_EQ(got.grace_period, want.grace_period);
  EXPECT_EQ(got.bind_to_core, want.bind_to_core);
}

TEST(GuardRequestTest, RoundTripsWhole) {
  const std::string bytes = EncodeGuardRequest(SampleRequest());
  GuardRequestDecoder decoder;
  ASSERT_TRUE(decoder.Feed(bytes).ok());
  ASSERT_TRUE(decoder.done());
  ExpectSame(decoder.request(), SampleRequest());
}

TEST(GuardRequestTest, RoundTripsByteByByteAndIgnoresWhatFollows) {
  const std::string bytes = EncodeGuardRequest(SampleRequest());
  GuardRequestDecoder decoder;
  for (size_t i = 0; i < bytes.size(); ++i) {
    EXPECT_FALSE(decoder.done()) << i;
    ASSERT_TRUE(decoder.Feed(bytes.substr(i, 1)).ok()) << i;
  }
  ASSERT_TRUE(decoder.done());
  ASSERT_TRUE(decoder.Feed("trailing garbage").ok());
  ExpectSame(decoder.request(), SampleRequest());
}

TEST(GuardRequestTest, RejectsWhatKolorunDoesNotSend) {
  const std::string good = EncodeGuardRequest(SampleRequest());
  for (const std::string& bad :
       {std::string("hello world, this is not a request"),
        std::string("5:hello,"), std::string("17:kolo-rank-guard/2,"),
        std::string("17:kolo-rank-guard/1;"),
        std::string("17:kolo-rank-guard/1,3:xyz,"),
        std::string("17:kolo-rank-guard/1,5:env=x,"),
        std::string("17:kolo-rank-guard/1,9:grace=abc,"),
        std::string("17:kolo-rank-guard/1,11:bind=socket,"),
        std::string("17:kolo-rank-guard/1,99999999999:"),
        std::string("x:") + good}) {
    GuardRequestDecoder decoder;
    const absl::Status status = decoder.Feed(bad);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_FALSE(decoder.done()) << bad;
  }
}

TEST(GuardStatusTest, LineRoundTrips) {
  const std::string line = GuardStatusLine("abc", 4242, 9);
  EXPECT_EQ(line, "kolo_rank_guard[abc] pid=4242 wait_status=9\n");
  const std::string marker = GuardStatusMarker("abc");
  ASSERT_EQ(line.find(marker), 0u);
  pid_t pid = 0;
  int status = 0;
  ASSERT_TRUE(ParseGuardStatus(line.substr(marker.size()), &pid, &status));
  EXPECT_EQ(pid, 4242);
  EXPECT_EQ(status, 9);
  EXPECT_FALSE(ParseGuardStatus(" pid=1", &pid, &status));
  EXPECT_FALSE(ParseGuardStatus(" pid=x wait_status=1", &pid, &status));
  EXPECT_FALSE(ParseGuardStatus(" wait_status=1 pid=2", &pid, &status));
}

}  // namespace
}  // namespace kolorun
}  // namespace kolo
