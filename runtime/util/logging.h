// Logging: one Logger per Runtime (no process-wide state). Lines go to
// stderr as "[kolo rank R] LEVEL: message". The job secret is never logged.
#ifndef KOLO_RUNTIME_UTIL_LOGGING_H_
#define KOLO_RUNTIME_UTIL_LOGGING_H_

#include <string>

#include "kolo/options.h"

namespace kolo {

class Logger {
 public:
  Logger(LogLevel min_level, int rank) : min_level_(min_level), rank_(rank) {}
  bool Enabled(LogLevel level) const { return level >= min_level_; }
  void Log(LogLevel level, const std::string& message) const;
  void Debug(const std::string& m) const { Log(LogLevel::kDebug, m); }
  void Info(const std::string& m) const { Log(LogLevel::kInfo, m); }
  void Warning(const std::string& m) const { Log(LogLevel::kWarning, m); }
  void Error(const std::string& m) const { Log(LogLevel::kError, m); }

 private:
  const LogLevel min_level_;
  const int rank_;
};

}  // namespace kolo

#endif  // KOLO_RUNTIME_UTIL_LOGGING_H_
