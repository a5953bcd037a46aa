#include "runtime/config.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/stat.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kolo/store.h"

extern char** environ;

namespace kolo {
namespace {

absl::Status Bad(const std::string& var, const std::string& value,
                 const std::string& expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("invalid value for ", var, "=\"", value, "\": expected ",
                   expected));
}

const std::string* Find(const EnvironmentMap& env, const std::string& var) {
  auto it = env.find(var);
  if (it == env.end()) return nullptr;
  return &it->second;
}

// Integer in [min_value, max_value].
absl::Status ReadInt(const EnvironmentMap& env, const std::string& var,
                     int64_t min_value, int64_t max_value, int64_t* out) {
  const std::string* v = Find(env, var);
  if (!v) return absl::OkStatus();
  int64_t parsed;
  if (!absl::SimpleAtoi(*v, &parsed) || parsed < min_value ||
      parsed > max_value) {
    return Bad(var, *v,
               absl::StrCat("an integer from ", min_value, " to ", max_value));
  }
  *out = parsed;
  return absl::OkStatus();
}

absl::Status ReadInt32(const EnvironmentMap& env, const std::string& var,
                       int64_t min_value, int* out) {
  int64_t value = *out;
  absl::Status s = ReadInt(env, var, min_value, 1 << 30, &value);
  *out = static_cast<int>(value);
  return s;
}

// A non-negative (or positive) number of `unit`s, fractions allowed.
absl::Status ReadDuration(const EnvironmentMap& env, const std::string& var,
                          absl::Duration unit, bool allow_zero,
                          absl::Duration* out) {
  const std::string* v = Find(env, var);
  if (!v) return absl::OkStatus();
  double parsed;
  const char* what = unit == absl::Seconds(1) ? "seconds" : "milliseconds";
  if (!absl::SimpleAtod(*v, &parsed) || !std::isfinite(parsed) ||
      parsed < 0 || (!allow_zero && parsed == 0) || parsed > 1e9) {
    return Bad(var, *v,
               absl::StrCat(allow_zero ? "a non-negative" : "a positive",
                            " number of ", what));
  }
  *out = parsed * unit;
  return absl::OkStatus();
}

absl::Status ReadBool(const EnvironmentMap& env, const std::string& var,
                      bool* out) {
  const std::string* v = Find(env, var);
  if (!v) return absl::OkStatus();
  std::string lower = absl::AsciiStrToLower(*v);
  if (lower == "1" || lower == "true" || lower == "on" || lower == "yes") {
    *out = true;
  } else if (lower == "0" || lower == "false" || lower == "off" ||
             lower == "no") {
    *out = false;
  } else {
    return Bad(var, *v, "one of 1, 0, true, false, on, off, yes, no");
  }
  return absl::OkStatus();
}

absl::Status ReadLogLevel(const EnvironmentMap& env, LogLevel* out) {
  const std::string* v = Find(env, "KOLO_LOG_LEVEL");
  if (!v) return absl::OkStatus();
  static constexpr const char* kNames[] = {"trace",   "debug", "info",
                                           "warning", "error", "fatal"};
  std::string lower = absl::AsciiStrToLower(*v);
  for (int i = 0; i < 6; ++i) {
    if (lower == kNames[i]) {
      *out = static_cast<LogLevel>(i);
      return absl::OkStatus();
    }
  }
  return Bad("KOLO_LOG_LEVEL", *v, "trace, debug, info, warning, error or fatal");
}

absl::Status ReadSecret(const EnvironmentMap& env, std::string* out) {
  if (const std::string* path = Find(env, "KOLO_SECRET_FILE")) {
    struct stat st;
    if (stat(path->c_str(), &st) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KOLO_SECRET_FILE=\"", *path, "\": cannot read the file"));
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KOLO_SECRET_FILE=\"", *path,
          "\": the file must be readable by its owner only (mode 0600)"));
    }
    std::ifstream in(*path, std::ios::binary);
    std::stringstream buffer;
    buffer << in.rdbuf();
    std::string secret = std::string(absl::StripAsciiWhitespace(buffer.str()));
    if (!in || secret.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KOLO_SECRET_FILE=\"", *path, "\": the file is empty or unreadable"));
    }
    *out = std::move(secret);
    return absl::OkStatus();
  }
  if (const std::string* secret = Find(env, "KOLO_SECRET")) {
    if (secret->empty()) {
      return absl::InvalidArgumentError("KOLO_SECRET is set but empty");
    }
    *out = *secret;  // Never echoed in messages.
  }
  return absl::OkStatus();
}

}  // namespace

EnvironmentMap ProcessEnvironment() {
  EnvironmentMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    size_t eq = entry.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  }
  return env;
}

absl::StatusOr<std::string> InterfaceAddress(const std::string& iface) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::InternalError("getifaddrs failed");
  }
  std::string found;
  std::vector<std::string> names;
  for (struct ifaddrs* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
    names.push_back(it->ifa_name);
    if (iface == it->ifa_name && found.empty()) {
      char buf[INET_ADDRSTRLEN];
      auto* sin = reinterpret_cast<struct sockaddr_in*>(it->ifa_addr);
      inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
      found = buf;
    }
  }
  freeifaddrs(list);
  if (found.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid value for KOLO_IFACE=\"", iface,
                     "\": no IPv4 interface of that name (have: ",
                     absl::StrJoin(names, ", "), ")"));
  }
  return found;
}

absl::StatusOr<Options> ParseOptions(const EnvironmentMap& env) {
  Options o;
  absl::Status s;
#define KOLO_TRY(expr)           \
  do {                           \
    absl::Status _s = (expr);    \
    if (!_s.ok()) return _s;     \
  } while (0)
  KOLO_TRY(ReadInt32(env, "KOLO_SIZE", 1, &o.size));
  KOLO_TRY(ReadInt32(env, "KOLO_RANK", 0, &o.rank));
  o.local_size = o.size;
  o.local_rank = o.rank;
  KOLO_TRY(ReadInt32(env, "KOLO_LOCAL_SIZE", 1, &o.local_size));
  KOLO_TRY(ReadInt32(env, "KOLO_LOCAL_RANK", 0, &o.local_rank));
  KOLO_TRY(ReadInt32(env, "KOLO_CROSS_SIZE", 1, &o.cross_size));
  KOLO_TRY(ReadInt32(env, "KOLO_CROSS_RANK", 0, &o.cross_rank));

  if (const std::string* v = Find(env, "KOLO_RENDEZVOUS_ADDR")) {
    if (v->empty()) return Bad("KOLO_RENDEZVOUS_ADDR", *v, "a host address");
    o.rendezvous_addr = *v;
  }
  KOLO_TRY(ReadInt32(env, "KOLO_RENDEZVOUS_PORT", 1, &o.rendezvous_port));
  if (o.rendezvous_port > 65535) {
    return Bad("KOLO_RENDEZVOUS_PORT", *Find(env, "KOLO_RENDEZVOUS_PORT"),
               "a port from 1 to 65535");
  }
  KOLO_TRY(ReadSecret(env, &o.secret));
  if (const std::string* v = Find(env, "KOLO_IFACE")) {
    if (!v->empty()) {
      auto addr = InterfaceAddress(*v);
      if (!addr.ok()) return addr.status();
      o.iface = *v;
      o.bind_addr = *addr;
    }
  }

  KOLO_TRY(ReadInt(env, "KOLO_FUSION_THRESHOLD", 0, int64_t{1} << 40,
                   &o.fusion_threshold_bytes));
  KOLO_TRY(ReadDuration(env, "KOLO_CYCLE_TIME", absl::Milliseconds(1),
                        /*allow_zero=*/true, &o.cycle_time));
  KOLO_TRY(ReadInt32(env, "KOLO_CACHE_CAPACITY", 0, &o.cache_capacity));
  KOLO_TRY(ReadDuration(env, "KOLO_OP_TIMEOUT", absl::Seconds(1),
                        /*allow_zero=*/false, &o.op_timeout));
  KOLO_TRY(ReadDuration(env, "KOLO_START_TIMEOUT", absl::Seconds(1),
                        /*allow_zero=*/false, &o.start_timeout));
  KOLO_TRY(ReadDuration(env, "KOLO_STALL_CHECK_TIME", absl::Seconds(1),
                        /*allow_zero=*/true, &o.stall_check_time));
  KOLO_TRY(ReadDuration(env, "KOLO_STALL_SHUTDOWN_TIME", absl::Seconds(1),
                        /*allow_zero=*/true, &o.stall_shutdown_time));
  if (const std::string* v = Find(env, "KOLO_TIMELINE")) o.timeline_path = *v;
  KOLO_TRY(ReadLogLevel(env, &o.log_level));
  KOLO_TRY(ReadBool(env, "KOLO_SHM", &o.shm));
  KOLO_TRY(ReadBool(env, "KOLO_HIERARCHICAL_ALLREDUCE",
                    &o.hierarchical_allreduce));
#undef KOLO_TRY
  s = ValidateOptions(o);
  if (!s.ok()) return s;
  return o;
}

absl::Status ValidateOptions(const Options& o) {
  if (o.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size must be at least 1, got ", o.size));
  }
  if (o.rank < 0 || o.rank >= o.size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KOLO_RANK=", o.rank, " is outside the world of KOLO_SIZE=", o.size));
  }
  if (o.local_rank < 0 || o.local_rank >= o.local_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("KOLO_LOCAL_RANK=", o.local_rank,
                     " is outside KOLO_LOCAL_SIZE=", o.local_size));
  }
  if (o.cross_rank < 0 || o.cross_rank >= o.cross_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("KOLO_CROSS_RANK=", o.cross_rank,
                     " is outside KOLO_CROSS_SIZE=", o.cross_size));
  }
  if (o.fusion_threshold_bytes < 0) {
    return absl::InvalidArgumentError("fusion threshold must be >= 0 bytes");
  }
  if (o.op_timeout <= absl::ZeroDuration() ||
      o.start_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("timeouts must be positive");
  }
  return absl::OkStatus();
}

}  // namespace kolo
