#include "tools/kolorun/elastic.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "runtime/os/errno_text.h"
#include "runtime/os/poll_timeout.h"
#include "runtime/os/unique_fd.h"
#include "tools/kolorun/args.h"

namespace kolo {
namespace kolorun {

absl::StatusOr<std::vector<HostSlots>> ParseDiscoveryOutput(
    const std::string& output, int slots_per_host) {
  std::vector<HostSlots> hosts;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    ++line_number;
    if (size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    HostSlots host;
    host.slots = slots_per_host;
    const size_t colon = line.rfind(':');
    host.name = std::string(line.substr(0, colon));
    const bool bad_name =
        host.name.empty() ||
        std::any_of(host.name.begin(), host.name.end(), [](char c) {
          return absl::ascii_isspace(c) || c == ',' || c == ':';
        });
    if (bad_name || (colon != absl::string_view::npos &&
                     (!absl::SimpleAtoi(line.substr(colon + 1), &host.slots) ||
                      host.slots < 0 || host.slots > (1 << 20)))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_number, " of the discovery script's output, \"", line,
          "\", is not \"host\" or \"host:slots\""));
    }
    auto same =
        std::find_if(hosts.begin(), hosts.end(),
                     [&](const HostSlots& h) { return h.name == host.name; });
    if (same != hosts.end()) {
      same->slots += host.slots;
    } else {
      hosts.push_back(std::move(host));
    }
  }
  return hosts;
}

absl::StatusOr<std::string> RunDiscoveryScript(const std::string& script,
                                               absl::Duration timeout) {
  absl::StatusOr<os::Pipe> out = os::MakePipe(O_CLOEXEC);
  if (!out.ok()) {
    return absl::Status(
        out.status().code(),
        absl::StrCat("pipe for ", script, ": ", out.status().message()));
  }
  // Built before fork: the child (kolorun has threads) may only make
  // async-signal-safe calls, so it allocates nothing.
  const std::string exec_failed =
      absl::StrCat("kolorun: cannot run the discovery script ", script, ": ");
  const pid_t pid = fork();
  if (pid < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot run ", script, ": fork: ", os::ErrnoText(errno)));
  }
  if (pid == 0) {
    // Close-on-exec: exec leaves the script only its copies on 0 and 1.
    const int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) dup2(null, 0);
    dup2(out->write_end.get(), 1);
    // Its own process group, so that a timeout kills what it started too.
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execl(script.c_str(), script.c_str(), static_cast<char*>(nullptr));
    // strerrordesc_np reads a static table (unlike strerror, no locale).
    const char* why = strerrordesc_np(errno);
    if (why == nullptr) why = "unknown error";
    (void)!write(2, exec_failed.data(), exec_failed.size());
    (void)!write(2, why, strlen(why));
    (void)!write(2, "\n", 1);
    _exit(127);
  }
  out->write_end.reset();
  std::string output;
  const absl::Time deadline = absl::Now() + timeout;
  bool timed_out = false;
  for (;;) {
    if (absl::Now() >= deadline) {
      timed_out = true;
      break;
    }
    struct pollfd fd = {out->read_end.get(), POLLIN, 0};
    const int ready = poll(&fd, 1, os::PollTimeoutMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(out->read_end.get(), buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    output.append(buffer, n);
    if (output.size() > (1u << 20)) break;
  }
  out->read_end.reset();
  if (timed_out) killpg(pid, SIGKILL);
  int status = 0;
  // The script closed its output (or was killed): it ends now.
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (timed_out) {
    return absl::DeadlineExceededError(
        absl::StrCat("the discovery script ", script, " did not finish within ",
                     FormatSeconds(timeout), " s"));
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(absl::StrCat(
        "the discovery script ", script, " ",
        WIFEXITED(status)
            ? absl::StrCat("exited with code ", WEXITSTATUS(status))
            : absl::StrCat("was killed by signal ", WTERMSIG(status))));
  }
  return output;
}

std::vector<std::pair<int64_t, elastic::Assignment>> AssignRanks(
    const std::vector<Candidate>& candidates,
    const std::vector<std::string>& host_order, int64_t generation) {
  std::vector<std::string> hosts = host_order;
  for (const Candidate& c : candidates) {
    if (std::find(hosts.begin(), hosts.end(), c.host) == hosts.end()) {
      hosts.push_back(c.host);
    }
  }
  auto host_index = [&](const std::string& host) {
    return std::find(hosts.begin(), hosts.end(), host) - hosts.begin();
  };
  std::vector<Candidate> sorted = candidates;
  std::stable_sort(
      sorted.begin(), sorted.end(),
      [&](const Candidate& a, const Candidate& b) {
        const auto ha = host_index(a.host), hb = host_index(b.host);
        if (ha != hb) return ha < hb;
        const bool na = a.previous_rank < 0, nb = b.previous_rank < 0;
        if (na != nb) return nb;  // Survivors first.
        if (!na) return a.previous_rank < b.previous_rank;
        return a.id < b.id;
      });
  std::vector<std::string> used;  // Hosts with members, in order.
  std::map<std::string, int> per_host;
  for (const Candidate& c : sorted) {
    if (per_host[c.host]++ == 0) used.push_back(c.host);
  }
  std::vector<std::pair<int64_t, elastic::Assignment>> result;
  std::map<std::string, int> seen;
  for (size_t i = 0; i < sorted.size(); ++i) {
    const Candidate& c = sorted[i];
    elastic::Assignment a;
    a.generation = generation;
    a.member = true;
    a.rank = static_cast<int>(i);
    a.size = static_cast<int>(sorted.size());
    a.local_rank = seen[c.host]++;
    a.local_size = per_host[c.host];
    a.cross_rank = static_cast<int>(
        std::find(used.begin(), used.end(), c.host) - used.begin());
    a.cross_size = static_cast<int>(used.size());
    result.emplace_back(c.id, a);
  }
  return result;
}

bool HostBook::RecordFailure(const std::string& host, absl::Time now) {
  Entry& entry = hosts_[host];
  if (entry.until != absl::InfinitePast() && now >= entry.until) {
    entry = Entry();  // The cooldown ended: a fresh start.
  }
  if (++entry.failures < kBlacklistFailures || now < entry.until) return false;
  entry.until = cooldown_ == absl::ZeroDuration() ? absl::InfiniteFuture()
                                                  : now + cooldown_;
  return true;
}

bool HostBook::Blacklisted(const std::string& host, absl::Time now) const {
  auto it = hosts_.find(host);
  return it != hosts_.end() && now < it->second.until;
}

absl::Time HostBook::BlacklistedUntil(const std::string& host) const {
  auto it = hosts_.find(host);
  return it == hosts_.end() ? absl::InfinitePast() : it->second.until;
}

}  // namespace kolorun
}  // namespace kolo
