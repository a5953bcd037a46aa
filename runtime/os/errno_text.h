// ErrnoText: the message of an errno value, for error messages.
//
// Thread safety: thread-safe (strerror_r, never strerror's static buffer).
#ifndef KOLO_RUNTIME_OS_ERRNO_TEXT_H_
#define KOLO_RUNTIME_OS_ERRNO_TEXT_H_

#include <string>

namespace kolo {
namespace os {

// "No such file or directory" for ENOENT; "Unknown error 4242" for a value
// without a message. Read errno into a variable first when other calls sit
// between the failure and the message.
std::string ErrnoText(int err);

}  // namespace os
}  // namespace kolo

#endif  // KOLO_RUNTIME_OS_ERRNO_TEXT_H_
