// The wire codec: messages survive a round trip, and garbage does not parse
// into something the runtime would act on.
#include "gtest/gtest.h"
#include "runtime/wire.pb.h"

namespace kolo {
namespace {

TEST(Wire, ControlMessageRoundTrip) {
  wire::ControlMessage m;
  auto* list = m.mutable_request_list();
  auto* r = list->add_requests();
  r->set_name("layer1/weight");
  r->set_type(wire::ALLGATHER);
  r->add_shape(0);
  r->add_shape(7);
  r->set_prescale(0.5);
  list->set_shutdown(true);
  std::string bytes;
  ASSERT_TRUE(m.SerializeToString(&bytes));
  wire::ControlMessage back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  ASSERT_TRUE(back.has_request_list());
  EXPECT_EQ(back.request_list().requests(0).name(), "layer1/weight");
  EXPECT_EQ(back.request_list().requests(0).shape(1), 7);
  EXPECT_EQ(back.request_list().requests(0).prescale(), 0.5);
  EXPECT_TRUE(back.request_list().shutdown());
}

TEST(Wire, ResponseListRoundTripKeepsOrder) {
  wire::ResponseList list;
  for (int i = 0; i < 100; ++i) {
    auto* r = list.add_responses();
    r->add_names("t" + std::to_string(i));
    r->add_elements(i);
  }
  std::string bytes = list.SerializeAsString();
  wire::ResponseList back;
  ASSERT_TRUE(back.ParseFromString(bytes));
  ASSERT_EQ(back.responses_size(), 100);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(back.responses(i).elements(0), i);
}

TEST(Wire, TruncatedMessageDoesNotParse) {
  wire::ControlMessage m;
  m.mutable_hello()->set_rank(3);
  m.mutable_hello()->set_size(4);
  std::string bytes = m.SerializeAsString();
  wire::ControlMessage back;
  EXPECT_FALSE(back.ParseFromString(bytes.substr(0, bytes.size() - 1)));
  EXPECT_FALSE(back.ParseFromString(std::string("\xff\xff\xff\xff", 4)));
}

}  // namespace
}  // namespace kolo
