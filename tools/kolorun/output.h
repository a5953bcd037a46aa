// Forwards one worker stream (stdout or stderr) line by line, each line
// prefixed "[rank] ", to one of kolorun's own streams.
//
// Owned and used by the launcher's poll loop thread only.
#ifndef KOLO_TOOLS_KOLORUN_OUTPUT_H_
#define KOLO_TOOLS_KOLORUN_OUTPUT_H_

#include <string>

namespace kolo {
namespace kolorun {

class LineForwarder {
 public:
  // Takes ownership of `source_fd` (made non-blocking); writes to `target_fd`
  // (not owned).
  LineForwarder(int rank, int source_fd, int target_fd);
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
  // Appends "[rank] " + line + "\n" for every complete line of `data` to
  // `out`, keeping an unterminated tail in partial_.
  void SplitLines(const char* data, size_t size, std::string* out);

  const std::string prefix_;
  int source_fd_;
  const int target_fd_;
  std::string partial_;
};

// Writes all of `data` to `fd`, retrying on EINTR and waiting (poll) when the
// descriptor is non-blocking and full. Errors (e.g. EPIPE) drop the data:
// worker output must never stall or kill the launcher.
void WriteFully(int fd, const std::string& data);

}  // namespace kolorun
}  // namespace kolo

#endif  // KOLO_TOOLS_KOLORUN_OUTPUT_H_
