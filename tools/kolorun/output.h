// Forwards one worker stream (stdout or stderr) to one of kolorun's own
// streams, each line prefixed "[rank] " (and optionally a timestamp), and
// optionally without the rank prefix to a per-rank log file. A line that
// carries the status marker of a remote rank's guard (Note [Remote ranks] in
// remote.h) is handed to a callback instead of printed.
//
// Note [Live output]
// ~~~~~~~~~~~~~~~~~~
// Training programs print progress as a line they rewrite: "\rstep 10/100"
// and no newline until the epoch ends. A line forwarder that waited for
// newlines would show nothing for minutes and then one line of thousands of
// characters; with several ranks, lines cannot be rewritten in place on a
// shared console either. So the forwarder keeps the line being written (the
// text since the last '\n' or '\r') and:
//   * a complete line ('\n') is written at once;
//   * text without a newline yet is written as a line of its own once it has
//     waited kPartialDelay (100 ms): a prompt or a progress bar appears
//     promptly, with the rank prefix; if the line goes on later, the rest is
//     written as a further line (nothing is written twice);
//   * '\r' ends a version of the line: each version is an update, written as
//     a line of its own, at most one every kUpdateGap (250 ms) per stream; a
//     version replaced before its turn is dropped, as a terminal would
//     overwrite it, but the last version is always written: at the next
//     newline (or instead of it, for "text\r\n"), at EOF, when the worker
//     exits.
// When the worker dies, whatever it wrote is in the pipe: ReadAvailable()
// and Flush() write all of it, the line in progress included.
//
// Owned and used by the launcher's poll loop thread only. Times are passed
// in so that tests can drive the delays.
#ifndef KOLO_TOOLS_KOLORUN_OUTPUT_H_
#define KOLO_TOOLS_KOLORUN_OUTPUT_H_

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/os/unique_fd.h"

namespace kolo {
namespace kolorun {

// See Note [Live output].
inline constexpr absl::Duration kPartialDelay = absl::Milliseconds(100);
inline constexpr absl::Duration kUpdateGap = absl::Milliseconds(250);

struct ForwardOptions {
  // Prefix each line with the UTC time it was read
  // ("2026-05-01T12:00:00.123Z").
  bool timestamps = false;
  // Prefix each line with "[rank] " (--tag-output, the default).
  bool tag = true;
  // Write to the target stream. false (a rank --output-ranks leaves out):
  // lines go only to the log file and to the last `hidden_tail` lines kept
  // for HiddenTail().
  bool visible = true;
  size_t hidden_tail = 0;
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
  // Reads `source` (made non-blocking); writes to `target_fd` (borrowed).
  LineForwarder(int rank, os::UniqueFd source, int target_fd,
                ForwardOptions options = {});
  ~LineForwarder();  // Close().
  LineForwarder(const LineForwarder&) = delete;
  LineForwarder& operator=(const LineForwarder&) = delete;

  // -1 once the stream has reached EOF or was closed.
  int fd() const { return source_.get(); }

  // Reads what is available now (up to a fixed budget) without blocking and
  // writes the complete lines. At EOF (or on a read error) flushes the
  // line in progress and closes.
  void ReadAvailable(absl::Time now = absl::Now());
  // When the line in progress is due to be written (InfiniteFuture: nothing
  // waiting). The poll loop wakes up for it and calls OnTimer().
  absl::Time Deadline() const;
  // Writes the line in progress if its Deadline() has come.
  void OnTimer(absl::Time now = absl::Now());
  // Writes the line in progress now (its last version) and keeps reading.
  void Flush(absl::Time now = absl::Now());
  // Flush() and close the source.
  void Close();

  // Tags later lines with `rank` (an elastic worker's rank changes with
  // each generation).
  void set_rank(int rank);

  // The last lines that were not shown (options.visible false), oldest
  // first, without prefix or timestamp.
  std::vector<std::string> HiddenTail() const {
    return {hidden_.begin(), hidden_.end()};
  }

 private:
  // Splits `data` into lines and versions (Note [Live output]), appending
  // what is written now to `out`.
  void Consume(const char* data, size_t size, absl::Time now, std::string* out);
  void EndLine(std::string* out);  // '\n'
  void EndVersion();               // '\r'
  void ShowPending(absl::Time now, std::string* out);
  // Appends one line (without its newline) to `out` and to log_, or hands
  // it to on_status.
  void EmitLine(absl::string_view line, std::string* out);
  // Writes `out` to the target and log_ to the log file.
  void Write(std::string* out);

  std::string prefix_;
  os::UniqueFd source_;
  const int target_fd_;
  const ForwardOptions options_;
  // The line in progress, and how much of it has been written already.
  std::string line_;
  size_t shown_ = 0;
  // The last version ended by '\r' and not written yet.
  bool has_version_ = false;
  std::string version_;
  // The last character was '\r': a '\n' now ends the version ("\r\n").
  bool after_cr_ = false;
  // Since when something waits to be written (InfiniteFuture: nothing).
  absl::Time waiting_since_ = absl::InfiniteFuture();
  absl::Time last_partial_ = absl::InfinitePast();
  std::string log_;
  std::deque<std::string> hidden_;
};

// Writes all of `data` to `fd`, retrying on EINTR and waiting (poll) when the
// descriptor is non-blocking and full. Errors (e.g. EPIPE) drop the data:
// worker output must never stall or kill the launcher.
void WriteFully(int fd, const std::string& data);

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_OUTPUT_H_
