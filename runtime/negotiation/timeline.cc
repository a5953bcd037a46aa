#include "runtime/negotiation/timeline.h"

#include "absl/strings/str_cat.h"
#include "runtime/negotiation/collectives.h"
#include "runtime/sync/mutex.h"
#include "runtime/wire.pb.h"

namespace kolo {
namespace {

// JSON string contents for a tensor name.
std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(&out, "\\u00", absl::Hex(c, absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// Note [One place per collective]: the phases are the collective's row.
const char* NegotiatePhase(int request_type) {
  const CollectiveRules* rules =
      RulesFor(static_cast<wire::CollectiveType>(request_type));
  return rules ? rules->negotiate_phase : "NEGOTIATE";
}

const char* OperationPhase(int response_type) {
  const CollectiveRules* rules =
      RulesFor(static_cast<wire::ResponseType>(response_type));
  return rules ? rules->operation_phase : nullptr;
}

absl::Status Timeline::Start(const std::string& path, bool mark_cycles) {
  MutexLock lifecycle(&lifecycle_mu_);
  if (enabled())
    return absl::FailedPreconditionError("the timeline is already on");
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (!file) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot create the timeline file \"", path, "\""));
  }
  file_ = file;
  first_event_ = true;
  tids_.clear();
  std::fputs("[\n", file_);
  start_ = std::chrono::steady_clock::now();
  {
    MutexLock lock(&mu_);
    stopping_ = false;
  }
  writer_ = std::thread(&Timeline::WriterLoop, this);
  mark_cycles_ = mark_cycles;
  enabled_ = true;
  return absl::OkStatus();
}

void Timeline::Stop() {
  MutexLock lifecycle(&lifecycle_mu_);
  if (!writer_.joinable()) return;
  enabled_ = false;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.NotifyOne();
  writer_.join();
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

void Timeline::Push(Event event) {
  {
    MutexLock lock(&mu_);
    if (stopping_) return;
    if (queue_.size() >= kMaxQueued) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queue_.push_back(std::move(event));
  }
  cv_.NotifyOne();
}

void Timeline::Begin(const std::string& tensor, const char* phase,
                     const std::string& args) {
  if (!enabled()) return;
  auto now = std::chrono::steady_clock::now() - start_;
  Push({'B', tensor, phase,
        std::chrono::duration_cast<std::chrono::microseconds>(now).count(),
        args});
}

void Timeline::End(const std::string& tensor, const char* phase) {
  if (!enabled()) return;
  auto now = std::chrono::steady_clock::now() - start_;
  Push({'E', tensor, phase,
        std::chrono::duration_cast<std::chrono::microseconds>(now).count(),
        ""});
}

void Timeline::Marker(const char* name) {
  if (!enabled()) return;
  auto now = std::chrono::steady_clock::now() - start_;
  Push({'i', "", name,
        std::chrono::duration_cast<std::chrono::microseconds>(now).count(),
        ""});
}

void Timeline::WriterLoop() {
  std::deque<Event> batch;
  while (true) {
    bool stopping;
    {
      MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) cv_.Wait(&mu_);
      batch.swap(queue_);
      stopping = stopping_;
    }
    for (const Event& e : batch) Write(e);
    batch.clear();
    std::fflush(file_);
    if (stopping) {
      MutexLock lock(&mu_);
      if (queue_.empty()) return;
    }
  }
}

void Timeline::Write(const Event& e) {
  std::string out = first_event_ ? "" : ",\n";
  first_event_ = false;
  if (e.type == 'i') {
    absl::StrAppend(&out, "{\"name\": \"", e.phase,
                    "\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"tid\": 0, "
                    "\"ts\": ",
                    e.micros, "}");
  } else {
    auto [it, inserted] =
        tids_.emplace(e.tensor, static_cast<int>(tids_.size()) + 1);
    if (inserted) {
      absl::StrAppend(&out,
                      "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, "
                      "\"tid\": ",
                      it->second, ", \"args\": {\"name\": \"", Escape(e.tensor),
                      "\"}},\n");
    }
    absl::StrAppend(&out, "{\"name\": \"", e.phase, "\", \"ph\": \"",
                    std::string(1, e.type),
                    "\", \"pid\": 0, \"tid\": ", it->second,
                    ", \"ts\": ", e.micros);
    if (!e.args.empty()) absl::StrAppend(&out, ", \"args\": {", e.args, "}");
    out += "}";
  }
  std::fputs(out.c_str(), file_);
}

}  // namespace kolo
