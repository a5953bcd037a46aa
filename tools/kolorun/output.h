// Forwards one worker stream (stdout or stderr) line by line, each line
// prefixed "[rank] " (and optionally a timestamp), to one of kolorun's own
// streams, and optionally without the rank prefix to a per-rank log file.
// A line that carries the status marker of a remote rank's guard (Note
// [Remote ranks] in remote.h) is handed to a callback instead of printed.
//
// Owned and used by the launcher's poll loop thread only.
#ifndef KOLO_TOOLS_KOLORUN_OUTPUT_H_
#define KOLO_TOOLS_KOLORUN_OUTPUT_H_

#include <functional>
#include <string>

#include "absl/strings/string_view.h"

namespace kolo {
namespace kolorun {

struct ForwardOptions {
  // Prefix each line with the UTC time it was read
  // ("2026-05-01T12:00:00.123Z").
  bool timestamps = false;
  // Also append each line (timestamp, no rank prefix) to this descriptor
  // (not owned; -1: none).
  int log_fd = -1;
  // A line containing `status_marker` (if not empty): the text before it is
  // forwarded as a line of its own, the text after it goes to `on_status`.
  std::string status_marker;
  std::function<void(const std::string&)> on_status;
};

class LineForwarder {
 public:
  // Takes ownership of `source_fd` (made non-blocking); writes to `target_fd`
  // (not owned).
  LineForwarder(int rank, int source_fd, int target_fd,
                ForwardOptions options = {});
  ~LineForwarder();  // Flush() and close.
  LineForwarder(const LineForwarder&) = delete;
  LineForwarder& operator=(const LineForwarder&) = delete;

  // -1 once the stream has reached EOF or was closed.
  int fd() const { return source_fd_; }

  // Reads what is available now (up to a fixed budget) without blocking and
  // writes the complete lines. At EOF (or on a read error) flushes the
  // partial line and closes.
  void ReadAvailable();
  // Writes a pending partial line (with a newline added) and keeps reading.
  void FlushPartialLine();
  // FlushPartialLine() and close the source.
  void Close();

 private:
  // Appends every complete line of `data` to `out` (see EmitLine), keeping
  // an unterminated tail in partial_.
  void SplitLines(const char* data, size_t size, std::string* out);
  // Appends one line (without its newline) to `out` and to log_, or hands
  // it to on_status.
  void EmitLine(absl::string_view line, std::string* out);
  // Writes `out` to the target and log_ to the log file.
  void Write(std::string* out);

  const std::string prefix_;
  int source_fd_;
  const int target_fd_;
  const ForwardOptions options_;
  std::string partial_;
  std::string log_;
};

// Writes all of `data` to `fd`, retrying on EINTR and waiting (poll) when the
// descriptor is non-blocking and full. Errors (e.g. EPIPE) drop the data:
// worker output must never stall or kill the launcher.
void WriteFully(int fd, const std::string& data);

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_OUTPUT_H_
