// Formatting shared by kolo's messages.
#ifndef KOLO_RUNTIME_UTIL_FORMAT_H_
#define KOLO_RUNTIME_UTIL_FORMAT_H_

#include <string>

#include "absl/time/time.h"

namespace kolo {

// A duration as a person reads it in a message: three significant digits,
// trailing zeros dropped, in s, ms or us ("5 s", "2.5 s", "63.2 s",
// "250 ms", "12 us"); "0 s" for zero, "forever" for an infinite duration.
// (absl::FormatDuration prints measured times as "5.000111902s".)
std::string FormatSeconds(absl::Duration d);

}  // namespace kolo

#endif  // KOLO_RUNTIME_UTIL_FORMAT_H_
