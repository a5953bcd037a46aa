// How the TCP store's client and server encode timeouts in
// wire::StoreRequest (internal to runtime/rendezvous).
#ifndef KOLO_RUNTIME_RENDEZVOUS_STORE_WIRE_H_
#define KOLO_RUNTIME_RENDEZVOUS_STORE_WIRE_H_

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/time/time.h"

namespace kolo {
namespace rendezvous {

// Timeouts at least this long wait forever.
constexpr absl::Duration kForever = absl::Hours(24 * 365 * 100);

// timeout_ms on the wire: int64 max stands for "forever".
inline int64_t ToWireTimeout(absl::Duration timeout) {
  if (timeout >= kForever) return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout));
}

inline absl::Duration FromWireTimeout(int64_t timeout_ms) {
  if (timeout_ms == std::numeric_limits<int64_t>::max()) {
    return absl::InfiniteDuration();
  }
  return absl::Milliseconds(std::max<int64_t>(0, timeout_ms));
}

}  // namespace rendezvous
}  // namespace kolo

#endif  // KOLO_RUNTIME_RENDEZVOUS_STORE_WIRE_H_
