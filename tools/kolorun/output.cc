#include "tools/kolorun/output.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kolo {
namespace kolorun {
namespace {

// A worker that writes without newlines still reaches the console in pieces
// of at most this size, and kolorun's memory stays bounded.
constexpr size_t kMaxLineBytes = 64 * 1024;
// Bytes read per ReadAvailable() call, so that one chatty worker cannot
// starve the others (or the signal pipe) in the poll loop. At least the
// largest pipe capacity, so that one call drains an exited worker's pipe.
constexpr size_t kReadBudgetBytes = 1024 * 1024;

}  // namespace

void WriteFully(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      struct pollfd p = {fd, POLLOUT, 0};
      poll(&p, 1, -1);
    } else {
      return;
    }
  }
}

LineForwarder::LineForwarder(int rank, int source_fd, int target_fd,
                             ForwardOptions options)
    : prefix_(absl::StrCat("[", rank, "] ")),
      source_fd_(source_fd),
      target_fd_(target_fd),
      options_(std::move(options)) {
  const int flags = fcntl(source_fd_, F_GETFL);
  if (flags >= 0) fcntl(source_fd_, F_SETFL, flags | O_NONBLOCK);
}

LineForwarder::~LineForwarder() { Close(); }

void LineForwarder::EmitLine(absl::string_view line, std::string* out) {
  if (!options_.status_marker.empty()) {
    const size_t at = line.find(options_.status_marker);
    if (at != absl::string_view::npos) {
      if (at > 0) EmitLine(line.substr(0, at), out);
      if (options_.on_status) {
        options_.on_status(
            std::string(line.substr(at + options_.status_marker.size())));
      }
      return;
    }
  }
  std::string stamp;
  if (options_.timestamps) {
    stamp = absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                          absl::UTCTimeZone()),
                         " ");
  }
  absl::StrAppend(out, stamp, prefix_, line, "\n");
  if (options_.log_fd >= 0) absl::StrAppend(&log_, stamp, line, "\n");
}

void LineForwarder::Write(std::string* out) {
  WriteFully(target_fd_, *out);
  out->clear();
  if (options_.log_fd >= 0) WriteFully(options_.log_fd, log_);
  log_.clear();
}

void LineForwarder::SplitLines(const char* data, size_t size,
                               std::string* out) {
  size_t start = 0;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] != '\n') continue;
    partial_.append(data + start, i - start);
    EmitLine(partial_, out);
    partial_.clear();
    start = i + 1;
  }
  partial_.append(data + start, size - start);
  if (partial_.size() >= kMaxLineBytes) {
    EmitLine(partial_, out);
    partial_.clear();
  }
}

void LineForwarder::ReadAvailable() {
  if (source_fd_ < 0) return;
  char buffer[16 * 1024];
  std::string out;
  for (size_t total = 0; total < kReadBudgetBytes;) {
    const ssize_t n = read(source_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      total += static_cast<size_t>(n);
      SplitLines(buffer, static_cast<size_t>(n), &out);
      if (out.size() >= kMaxLineBytes) Write(&out);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    // EOF or a read error: the stream is over.
    Write(&out);
    Close();
    return;
  }
  Write(&out);
}

void LineForwarder::FlushPartialLine() {
  if (partial_.empty()) return;
  std::string out;
  EmitLine(partial_, &out);
  partial_.clear();
  Write(&out);
}

void LineForwarder::Close() {
  FlushPartialLine();
  if (source_fd_ >= 0) {
    close(source_fd_);
    source_fd_ = -1;
  }
}

}  // namespace kolorun
}  // namespace kolo
