// What control_plane.cc and host_relay_plane.cc share; not for others.
#ifndef KOLO_RUNTIME_CONTROL_CONTROL_INTERNAL_H_
#define KOLO_RUNTIME_CONTROL_CONTROL_INTERNAL_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kolo/work.h"
#include "runtime/wire.pb.h"

namespace kolo {
namespace control_internal {

// Unavailable, carrying the lost rank for LostRank() (kolo/work.h).
inline absl::Status RankLostError(int rank, absl::string_view message) {
  absl::Status status = absl::UnavailableError(message);
  status.SetPayload(kLostRankPayload, absl::Cord(absl::StrCat(rank)));
  return status;
}

// Request and response lists are small; a cap keeps a hostile or broken
// peer from making us allocate much.
inline constexpr size_t kMaxControlFrame = 64u << 20;

inline std::string Serialize(const wire::ControlMessage& m) {
  std::string bytes;
  m.SerializeToString(&bytes);
  return bytes;
}

}  // namespace control_internal
}  // namespace kolo

#endif  // KOLO_RUNTIME_CONTROL_CONTROL_INTERNAL_H_
