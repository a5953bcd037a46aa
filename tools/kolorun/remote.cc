#include "tools/kolorun/remote.h"

#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace kolo {
namespace kolorun {
namespace {

constexpr char kMagic[] = "kolo-rank-guard/1";
// A request is small (an environment); anything bigger is not ours.
constexpr size_t kMaxRequestBytes = 4 << 20;

void AppendNetstring(absl::string_view data, std::string* out) {
  absl::StrAppend(out, data.size(), ":", data, ",");
}

}  // namespace

std::string ShellQuote(const std::string& arg) {
  const bool plain =
      !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) ||
               std::strchr("@%+=:,./_-", c) != nullptr;
      });
  if (plain) return arg;
  std::string quoted = "'";
  for (char c : arg) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

std::vector<std::string> SshCommand(const LaunchOptions& options,
                                    const std::string& host, int rank,
                                    const std::string& guard_path) {
  std::vector<std::string> argv = {"ssh", "-o", "BatchMode=yes"};
  if (!options.ssh_config.empty()) {
    argv.insert(argv.end(), {"-F", options.ssh_config});
  }
  if (options.ssh_port > 0) {
    argv.insert(argv.end(), {"-p", absl::StrCat(options.ssh_port)});
  }
  if (!options.ssh_identity_file.empty()) {
    argv.insert(argv.end(), {"-i", options.ssh_identity_file});
  }
  const int64_t connect_timeout =
      std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(
                               options.start_timeout, absl::Seconds(1))));
  argv.insert(
      argv.end(),
      {"-o", absl::StrCat("ConnectTimeout=", connect_timeout), "-T", host});
  std::string remote =
      absl::StrCat("exec ", ShellQuote(guard_path), " --rank ", rank, " --");
  for (const std::string& arg : options.command) {
    absl::StrAppend(&remote, " ", ShellQuote(arg));
  }
  argv.push_back(std::move(remote));
  return argv;
}

std::string EncodeGuardRequest(const GuardRequest& request) {
  std::string out;
  AppendNetstring(kMagic, &out);
  AppendNetstring(absl::StrCat("cwd=", request.cwd), &out);
  for (const std::string& entry : request.env) {
    AppendNetstring(absl::StrCat("env=", entry), &out);
  }
  AppendNetstring(absl::StrCat("secret=", request.secret), &out);
  AppendNetstring(absl::StrCat("token=", request.status_token), &out);
  AppendNetstring(
      absl::StrCat("grace=", absl::ToDoubleSeconds(request.grace_period)),
      &out);
  AppendNetstring(absl::StrCat("bind=", request.bind_to_core ? "core" : "none"),
                  &out);
  AppendNetstring("end", &out);
  return out;
}

absl::Status GuardRequestDecoder::Feed(absl::string_view bytes) {
  if (done_) return absl::OkStatus();
  buffer_.append(bytes.data(), bytes.size());
  if (buffer_.size() > kMaxRequestBytes) {
    return absl::InvalidArgumentError("request too large");
  }
  for (;;) {
    const size_t colon = buffer_.find(':');
    if (colon == std::string::npos) {
      if (buffer_.size() > 12) {
        return absl::InvalidArgumentError("malformed request: no length");
      }
      return absl::OkStatus();
    }
    size_t length;
    if (colon == 0 || colon > 12 ||
        !absl::SimpleAtoi(absl::string_view(buffer_).substr(0, colon),
                          &length) ||
        !std::all_of(buffer_.begin(), buffer_.begin() + colon, ::isdigit) ||
        length > kMaxRequestBytes) {
      return absl::InvalidArgumentError("malformed request: bad length");
    }
    if (buffer_.size() < colon + 1 + length + 1) return absl::OkStatus();
    if (buffer_[colon + 1 + length] != ',') {
      return absl::InvalidArgumentError("malformed request: missing ','");
    }
    const std::string record = buffer_.substr(colon + 1, length);
    buffer_.erase(0, colon + 1 + length + 1);
    if (absl::Status s = Record(record); !s.ok()) return s;
    if (done_) {
      buffer_.clear();
      return absl::OkStatus();
    }
  }
}

absl::Status GuardRequestDecoder::Record(absl::string_view record) {
  if (!started_) {
    if (record != kMagic) {
      return absl::InvalidArgumentError(
          "not a kolorun request (kolorun and kolo_rank_guard must be of the "
          "same version)");
    }
    started_ = true;
    return absl::OkStatus();
  }
  if (record == "end") {
    done_ = true;
    return absl::OkStatus();
  }
  const size_t eq = record.find('=');
  const absl::string_view key = record.substr(0, eq);
  const absl::string_view value =
      eq == absl::string_view::npos ? "" : record.substr(eq + 1);
  if (eq == absl::string_view::npos) {
    return absl::InvalidArgumentError("malformed request record");
  }
  if (key == "cwd") {
    request_.cwd = std::string(value);
  } else if (key == "env") {
    if (value.find('=') == absl::string_view::npos || value[0] == '=') {
      return absl::InvalidArgumentError("malformed environment entry");
    }
    request_.env.emplace_back(value);
  } else if (key == "secret") {
    request_.secret = std::string(value);
  } else if (key == "token") {
    request_.status_token = std::string(value);
  } else if (key == "grace") {
    double seconds;
    if (!absl::SimpleAtod(value, &seconds) || !std::isfinite(seconds) ||
        seconds < 0) {
      return absl::InvalidArgumentError("malformed grace period");
    }
    request_.grace_period = absl::Seconds(seconds);
  } else if (key == "bind") {
    if (value != "core" && value != "none") {
      return absl::InvalidArgumentError("malformed binding");
    }
    request_.bind_to_core = value == "core";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown request record \"", key, "\""));
  }
  return absl::OkStatus();
}

std::string GuardStatusMarker(const std::string& token) {
  return absl::StrCat("kolo_rank_guard[", token, "]");
}

std::string GuardStatusLine(const std::string& token, pid_t pid,
                            int wait_status) {
  return absl::StrCat(GuardStatusMarker(token), " pid=", pid,
                      " wait_status=", wait_status, "\n");
}

bool ParseGuardStatus(absl::string_view rest, pid_t* pid, int* wait_status) {
  rest = absl::StripAsciiWhitespace(rest);
  std::vector<absl::string_view> fields = absl::StrSplit(rest, ' ');
  if (fields.size() != 2) return false;
  absl::string_view pid_text = fields[0], status_text = fields[1];
  int64_t parsed_pid;
  if (!absl::ConsumePrefix(&pid_text, "pid=") ||
      !absl::ConsumePrefix(&status_text, "wait_status=") ||
      !absl::SimpleAtoi(pid_text, &parsed_pid) ||
      !absl::SimpleAtoi(status_text, wait_status)) {
    return false;
  }
  *pid = static_cast<pid_t>(parsed_pid);
  return true;
}

std::string GuardPathNextToSelf() {
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return "kolo_rank_guard";
  std::string path(self, n);
  return path.substr(0, path.rfind('/') + 1) + "kolo_rank_guard";
}

}  // namespace kolorun
}  // namespace kolo
