#include "runtime/util/logging.h"

#include <cstdio>

namespace kolo {

void Logger::Log(LogLevel level, const std::string& message) const {
  if (!Enabled(level)) return;
  static constexpr const char* kNames[] = {"TRACE",   "DEBUG", "INFO",
                                           "WARNING", "ERROR", "FATAL"};
  // One fprintf per line so that lines of concurrent threads do not mix.
  std::fprintf(stderr, "[kolo rank %d] %s: %s\n", rank_,
               kNames[static_cast<int>(level)], message.c_str());
}

}  // namespace kolo
