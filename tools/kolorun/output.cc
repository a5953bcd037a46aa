#include "tools/kolorun/output.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kolo {
namespace kolorun {
namespace {

// The longest line kept whole (Note [Live output]).
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

LineForwarder::LineForwarder(int rank, os::UniqueFd source, int target_fd,
                             ForwardOptions options)
    : prefix_(options.tag ? absl::StrCat("[", rank, "] ") : ""),
      source_(std::move(source)),
      target_fd_(target_fd),
      options_(std::move(options)) {
  const int flags = fcntl(source_.get(), F_GETFL);
  if (flags >= 0) fcntl(source_.get(), F_SETFL, flags | O_NONBLOCK);
}

void LineForwarder::set_rank(int rank) {
  if (options_.tag) prefix_ = absl::StrCat("[", rank, "] ");
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
  if (options_.visible) {
    absl::StrAppend(out, stamp, prefix_, line, "\n");
  } else if (options_.hidden_tail > 0) {
    if (hidden_.size() == options_.hidden_tail) hidden_.pop_front();
    hidden_.emplace_back(line);
  }
  if (options_.log_fd >= 0) absl::StrAppend(&log_, stamp, line, "\n");
}

void LineForwarder::Write(std::string* out) {
  if (!out->empty()) WriteFully(target_fd_, *out);
  out->clear();
  if (options_.log_fd >= 0 && !log_.empty()) WriteFully(options_.log_fd, log_);
  log_.clear();
}

void LineForwarder::EndLine(std::string* out) {
  if (after_cr_ && line_.empty()) {
    // "text\r\n": the newline ends the last version.
    if (has_version_) EmitLine(version_, out);
  } else if (shown_ == 0 || shown_ < line_.size()) {
    EmitLine(absl::string_view(line_).substr(shown_), out);
  }
  // A version still waiting was replaced by this line.
  line_.clear();
  shown_ = 0;
  has_version_ = false;
  version_.clear();
  after_cr_ = false;
  waiting_since_ = absl::InfiniteFuture();
}

void LineForwarder::EndVersion() {
  if (shown_ < line_.size()) {
    version_ = line_;
    has_version_ = true;
  } else if (!line_.empty()) {
    has_version_ = false;  // This version was written; it replaced the last.
  }
  line_.clear();
  shown_ = 0;
  after_cr_ = true;
  if (!has_version_) waiting_since_ = absl::InfiniteFuture();
}

void LineForwarder::Consume(const char* data, size_t size, absl::Time now,
                            std::string* out) {
  for (size_t i = 0; i < size;) {
    if (data[i] == '\n') {
      EndLine(out);
      ++i;
      continue;
    }
    if (data[i] == '\r') {
      EndVersion();
      ++i;
      continue;
    }
    size_t end = i;
    while (end < size && data[end] != '\n' && data[end] != '\r') ++end;
    line_.append(data + i, end - i);
    after_cr_ = false;
    if (waiting_since_ == absl::InfiniteFuture()) waiting_since_ = now;
    i = end;
    if (line_.size() >= kMaxLineBytes) {
      // A worker that never ends its line still reaches the console in
      // pieces, and kolorun's memory stays bounded.
      EmitLine(absl::string_view(line_).substr(shown_), out);
      line_.clear();
      shown_ = 0;
      has_version_ = false;
      waiting_since_ = absl::InfiniteFuture();
    }
  }
}

void LineForwarder::ReadAvailable(absl::Time now) {
  if (!source_.valid()) return;
  char buffer[16 * 1024];
  std::string out;
  for (size_t total = 0; total < kReadBudgetBytes;) {
    const ssize_t n = read(source_.get(), buffer, sizeof(buffer));
    if (n > 0) {
      total += static_cast<size_t>(n);
      Consume(buffer, static_cast<size_t>(n), now, &out);
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

absl::Time LineForwarder::Deadline() const {
  if (waiting_since_ == absl::InfiniteFuture()) return waiting_since_;
  return std::max(waiting_since_ + kPartialDelay, last_partial_ + kUpdateGap);
}

void LineForwarder::ShowPending(absl::Time now, std::string* out) {
  if (shown_ < line_.size()) {
    // The newest text: it replaces any version still waiting.
    EmitLine(absl::string_view(line_).substr(shown_), out);
    shown_ = line_.size();
  } else if (has_version_) {
    EmitLine(version_, out);
  } else {
    return;
  }
  has_version_ = false;
  version_.clear();
  waiting_since_ = absl::InfiniteFuture();
  last_partial_ = now;
}

void LineForwarder::OnTimer(absl::Time now) {
  if (now < Deadline()) return;
  std::string out;
  ShowPending(now, &out);
  Write(&out);
}

void LineForwarder::Flush(absl::Time now) {
  std::string out;
  ShowPending(now, &out);
  Write(&out);
}

void LineForwarder::Close() {
  Flush();
  source_.reset();
}

}  // namespace kolorun
}  // namespace kolo
