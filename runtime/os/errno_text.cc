#include "runtime/os/errno_text.h"

#include <string.h>

namespace kolo {
namespace os {

std::string ErrnoText(int err) {
  char buf[256];
  // GNU strerror_r: returns a pointer that may or may not be `buf`.
  return ::strerror_r(err, buf, sizeof(buf));
}

}  // namespace os
}  // namespace kolo
