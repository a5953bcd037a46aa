// KOLO_RETURN_IF_ERROR(expr): returns the absl::Status `expr` from the
// enclosing function unless it is OK.
#ifndef KOLO_RUNTIME_UTIL_STATUS_MACROS_H_
#define KOLO_RUNTIME_UTIL_STATUS_MACROS_H_

#include "absl/status/status.h"

#define KOLO_RETURN_IF_ERROR(expr)     \
  do {                                 \
    absl::Status _status = (expr);     \
    if (!_status.ok()) return _status; \
  } while (0)

#endif  // KOLO_RUNTIME_UTIL_STATUS_MACROS_H_
