// Fuzzes the wire codec and what the coordinator does with what parses:
// any bytes as a control message; request lists go through a Coordinator.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "runtime/negotiation/coordinator.h"
#include "runtime/wire.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  kolo::wire::ControlMessage message;
  if (message.ParseFromString(bytes)) {
    std::string again;
    message.SerializeToString(&again);
    if (message.has_request_list()) {
      // A coordinator of 3 ranks gets the list from each rank in turn.
      kolo::Coordinator::Config config;
      config.global_ranks = {0, 1, 2};
      config.cache_capacity = 4;
      kolo::Coordinator coordinator(config);
      const absl::Time now = absl::FromUnixSeconds(1);
      for (int rank = 0; rank < 3; ++rank) {
        coordinator.AddRequests(rank, message.request_list(), now);
      }
      coordinator.ExpireOlderThan(absl::Seconds(1), now + absl::Seconds(2));
      coordinator.StallReport(absl::Seconds(1), now + absl::Seconds(2));
      kolo::wire::ResponseList list = coordinator.TakeResponseList();
      kolo::wire::Response expanded;
      for (const kolo::wire::Response& r : list.responses()) {
        kolo::ExpandCachedResponse(coordinator.cache(), r, &expanded);
      }
    }
  }
  kolo::wire::StoreRequest store_request;
  store_request.ParseFromString(bytes);
  return 0;
}
